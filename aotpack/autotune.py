"""Stage: run the lowered graph once in Python mode and autotune (PGO) its kernels.

The run executes extern calls with torch and fused kernels through their
``wrapper.so`` (ctypes), on copies of the user's real inputs (the example inputs, then
any ``calibration_inputs()`` sets). Where a kernel with several candidates is reached,
every candidate is timed on the very tensors it receives there (warm-up, interleaved
rounds, median); the candidate fastest on average over the sets is written to
``optimize_tiling`` and the others are released. Kernels write only their own fresh
output buffers, never their inputs, so repeated timed launches cannot compound. Kernels the run never reaches are
*unvisited* and use candidate 0. With one candidate, it goes straight to
``optimize_tiling`` without timing.
"""
from __future__ import annotations

import ctypes
import logging
import statistics
import time

import torch

from aotpack.backends.cpu.launch_abi import WrapperLauncher
from aotpack.compile import KernelArtifacts, save_winner
from aotpack.errors import AotpackError
from aotpack.ir import Buffer, CondStep, CopyBack, ExternCall, Graph, KernelCall, StridedView

log = logging.getLogger("aotpack")

WARMUP_LAUNCHES = 3
ROUNDS = 15
#: Launches per timed sample: enough that ctypes overhead (~0.5 us) and timer
#: resolution stay small next to the kernel.
MIN_SAMPLE_NS = 50_000


class LoadedWrapper:
    """A kernel's ``wrapper.so`` loaded through ctypes (the Python-mode launcher)."""

    def __init__(self, art: KernelArtifacts):
        self.art = art
        self.lib = ctypes.CDLL(str(art.wrapper_path), mode=ctypes.RTLD_LOCAL)
        try:
            self.launcher = WrapperLauncher(self.lib, f"kernel {art.kernel.name}")
            self.launcher.init(art.directory)
        except AotpackError as e:
            raise AotpackError(f"{e} (cache {art.directory}); remove that folder and build again") from None
        self.launch, self.release = self.launcher.launch, self.launcher.release


#: A winner whose slowest timed round is this many times its median was measured on
#: a busy machine: say so, since the choice is cached.
NOISY_SPREAD = 3.0


def _time_candidates(wrapper: LoadedWrapper, args) -> tuple[list[float], list[float]]:
    """(median us per launch, max/median spread) of each candidate, rounds interleaved."""
    keys = [t.kernel_key for t in wrapper.art.candidates]
    launches = {}
    for key in keys:
        start = time.perf_counter_ns()
        for _ in range(WARMUP_LAUNCHES):
            wrapper.launch(key, args)
        per_launch = max(1, (time.perf_counter_ns() - start) // WARMUP_LAUNCHES)
        launches[key] = max(1, min(1000, MIN_SAMPLE_NS // per_launch))
    samples = {key: [] for key in keys}
    for _ in range(ROUNDS):
        for key in keys:
            count = launches[key]
            start = time.perf_counter_ns()
            for _ in range(count):
                wrapper.launch(key, args)
            samples[key].append((time.perf_counter_ns() - start) / count / 1000.0)
    medians = [statistics.median(samples[key]) for key in keys]
    spreads = [max(samples[key]) / m for key, m in zip(keys, medians)]
    return medians, spreads


def _choose(wrapper: LoadedWrapper, samples: list[tuple[list[float], list[float]]]) -> None:
    """Keep the candidate fastest over every input set (optimize_tiling), release the rest."""
    art = wrapper.art
    timings = [statistics.fmean(s[0][i] for s in samples) for i in range(len(art.candidates))]
    spreads = [max(s[1][i] for s in samples) for i in range(len(art.candidates))]
    for index, (tiling, us) in enumerate(zip(art.candidates, timings)):
        log.info("%s candidate %d (%s): Timing %.2f us", art.kernel.name, index, tiling.tiling_repr, us)
    best = min(range(len(timings)), key=timings.__getitem__)
    art.timings_us = timings
    save_winner(art, art.candidates[best])
    wrapper.release(art.winner.kernel_key)
    log.info("Autotune completed %s, best kernel index: %d", art.kernel.name, best)
    if spreads[best] > NOISY_SPREAD:
        log.warning("%s: timings were noisy (slowest round %.1fx the median); the machine may be "
                    "busy. The choice is cached: rebuild with --retune on an idle machine to re-time",
                    art.kernel.name, spreads[best])


def _view(env, parts) -> torch.Tensor:
    base, sizes, strides, offset = parts
    tensor = env[id(base)]
    return torch.as_strided(tensor, sizes, strides, tensor.storage_offset() + offset)


def _conform(tensor: torch.Tensor, buf: Buffer) -> torch.Tensor:
    """``tensor`` laid out exactly as ``buf`` says (kernels hard-code strides)."""
    if tuple(tensor.shape) != buf.shape or tensor.dtype != buf.dtype:
        raise AotpackError(f"{buf.name}: expected {buf.dtype}{list(buf.shape)}, got "
                           f"{tensor.dtype}{list(tensor.shape)}")
    same = all(st == want or size == 1 for st, want, size in zip(tensor.stride(), buf.strides, buf.shape))
    if same:
        return tensor
    return torch.empty_strided(buf.shape, buf.strides, dtype=buf.dtype).copy_(tensor)


def _extern_args(env, call: ExternCall):
    args, kwargs = [], {}
    for argument, arg in zip(call.op._schema.arguments, call.args):
        if arg.kind == "tensor":
            value = _view(env, arg.value)
        elif arg.kind == "tensor_list":
            value = [None if p is None else _view(env, p) for p in arg.value]
        elif arg.kind == "none":
            value = None
        else:
            value = arg.value
        if argument.kwarg_only:
            kwargs[argument.name] = value
        else:
            args.append(value)
    return args, kwargs


class PythonModeRun:
    """Runs the lowered graph on real inputs, autotuning kernels as it reaches them.

    Each input set (the example inputs, then any calibration sets) runs the whole
    graph; a kernel that still needs a choice times every candidate on the tensors it
    receives in each set, and executes with candidate 0 meanwhile (all candidates
    compute the same values). ``finish`` then picks, per kernel, the candidate with the
    lowest mean time over the sets.
    """

    def __init__(self, graph: Graph, arts: dict[int, KernelArtifacts]):
        self.graph = graph
        self.arts = arts
        self.wrappers: dict[int, LoadedWrapper] = {}
        self.samples: dict[int, list] = {}

    def run(self, inputs: tuple) -> list[torch.Tensor]:
        """Execute the graph on copies of ``inputs`` (the user's tensors are never modified)."""
        env: dict[int, torch.Tensor] = {}
        for buf, tensor in zip(self.graph.inputs, inputs):
            env[id(buf)] = _conform(tensor.detach().clone(), buf)
        for buf in self.graph.constants:
            env[id(buf)] = self.graph.constant_tensors[buf.name].clone()
        self._execute(self.graph.steps, env)
        return [_view(env, parts) for parts in self.graph.outputs]

    def _execute(self, steps: list, env) -> None:
        for step in steps:
            if isinstance(step, KernelCall):
                self._kernel(step, env)
            elif isinstance(step, ExternCall):
                args, kwargs = _extern_args(env, step)
                result = step.op(*args, **kwargs)
                results = result if isinstance(result, (list, tuple)) else [result]
                for buf, tensor in zip(step.outputs, results):
                    if buf is not None:
                        env[id(buf)] = _conform(tensor, buf)
            elif isinstance(step, CopyBack):
                env[id(step.target)].copy_(_view(env, (step.source.base, step.source.shape,
                                                       step.source.strides, step.source.offset)))
            elif isinstance(step, CondStep):
                for buf in step.results:
                    env[id(buf)] = torch.empty_strided(buf.shape, buf.strides, dtype=buf.dtype)
                taken = bool(_view(env, step.pred).item())
                self._execute(step.true_steps if taken else step.false_steps, env)

    def _kernel(self, step: KernelCall, env) -> None:
        art = self.arts[id(step.kernel)]
        for buf in step.kernel.outputs:
            env[id(buf)] = torch.empty_strided(buf.shape, buf.strides, dtype=buf.dtype)
        tensors = [env[id(b)] for b in step.kernel.inputs + step.kernel.outputs]
        args = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
        wrapper = self.wrappers.get(id(art))
        if wrapper is None:
            wrapper = self.wrappers[id(art)] = LoadedWrapper(art)
            art.visited = True
        if art.needs_autotune():
            self.samples.setdefault(id(art), []).append(_time_candidates(wrapper, args))
            wrapper.launch(art.candidates[0].kernel_key, args)
            return
        if art.winner is None:  # one candidate: straight to optimize_tiling, no profiling
            save_winner(art, art.candidates[0])
        wrapper.launch(art.winner.kernel_key, args)

    def finish(self) -> None:
        """Choose and record the winner of every kernel that was timed."""
        for art_id, samples in self.samples.items():
            wrapper = self.wrappers[art_id]
            _choose(wrapper, samples)
        self.samples.clear()


def run_python_mode(graph: Graph, arts: dict[int, KernelArtifacts], input_sets: list[tuple]) -> list[torch.Tensor]:
    """Run ``graph`` on every input set, autotune its kernels, return the first set's outputs.

    Args:
        arts: ``id(FusedKernel) -> KernelArtifacts``.
        input_sets: the example inputs first, then calibration sets (same shapes).
    """
    runner = PythonModeRun(graph, arts)
    outputs = runner.run(input_sets[0])
    for inputs in input_sets[1:]:
        runner.run(inputs)
    if runner.samples:  # candidate 0 computed those outputs: rerun with the winners, as shipped
        runner.finish()
        outputs = runner.run(input_sets[0])
    return outputs


def finish_unvisited(arts: list[KernelArtifacts]) -> None:
    """Kernels the real inputs never reached keep candidate 0 (reported as unvisited)."""
    for art in arts:
        if art.winner is None:  # not cached: a later build whose inputs reach it will tune it
            log.info("%s was not reached by the example inputs; using candidate 0", art.kernel.name)
            art.winner = art.candidates[0]
