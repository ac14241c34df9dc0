"""Stage: run the lowered graph in Python mode and autotune (PGO) its kernels (``tune``).

The run executes extern calls with torch and fused kernels through the backend's
launcher, on copies of the user's real inputs (the example inputs, then any
``calibration_inputs()`` sets). Where a kernel with several candidates is reached,
every candidate is timed on the very tensors it receives there (``aotpack.tune.timing``:
interleaved rounds, a low-quantile estimate, preempted samples detected and re-timed);
``timing.decide`` picks the winner over the sets (a close call goes to fewer threads,
then to the solver's order), the build records it (``aotpack.tune.choice_cache``) and the
others are released. Kernels whose timing stayed contended are named in one warning per build and
marked ``timing_contended`` in the manifest. Kernels write only their own fresh
output buffers, never their inputs, so repeated timed launches cannot compound.
Kernels the run never reaches are *unvisited* and use candidate 0. A kernel with one
candidate is not timed.

Repeated layers are timed once per input set: a kernel launched at several sites (one
``kernel_id``) is timed at its first launch in each set, and a GEMM step is timed only
where no earlier step of the graph does the same work (``gemm_twins``: a transformer's
identical projections, ResNet's repeated convolutions); the twins share its winner
(docs/measurements.md, "GEMM twins are timed once").
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from aotpack.tune import replay, timing
from aotpack.tune.compile import CompiledSet
from aotpack.errors import AotpackError
from aotpack.ir.gemm import GemmStep, gemm_steps
from aotpack.ir.graph import Buffer, CondStep, CopyBack, ExternCall, Graph, KernelCall

log = logging.getLogger("aotpack")
#: Per-candidate timing lines (``aotpack -v`` shows them on the command line).
detail = logging.getLogger("aotpack.tune.autotune")

@dataclass(frozen=True)
class Choice:
    """The tuning result of one choice point (``ir.choice``: a kernel, a GEMM step): winner
    index, timings (us per candidate; empty when not timed), whether the inputs reached it,
    whether it came from the cache (or ``--tuning-from``), and whether its timing was
    contended (other processes took the CPU: ``aotpack.tune.timing``)."""

    index: int
    timings_us: tuple
    visited: bool
    cached: bool
    contended: bool = False


def _tensor_work(parts) -> tuple:
    base, shape, strides, offset = parts
    return tuple(shape), tuple(strides), offset, base.dtype


def _arg_work(arg) -> tuple:
    """What an extern argument contributes to the work done: a tensor's layout, else its value."""
    if arg.kind == "tensor":
        return ("tensor", _tensor_work(arg.value))
    if arg.kind == "tensor_list":
        return ("tensor_list", tuple(None if p is None else _tensor_work(p) for p in arg.value))
    return (arg.kind, repr(arg.value))


def _step_work(step) -> tuple:
    if isinstance(step, KernelCall):
        return ("kernel", step.kernel.kernel_id)  # the kernel's content hash: its IR and layouts
    if isinstance(step, ExternCall):
        outputs = tuple(None if b is None else (tuple(b.shape), tuple(b.strides), b.dtype) for b in step.outputs)
        return ("extern", str(step.op), tuple(_arg_work(a) for a in step.args), outputs)
    raise AotpackError(f"internal error: {type(step).__name__} in a GEMM variant")


def gemm_twins(graph: Graph) -> dict[str, str]:
    """GEMM step choice id -> the id of the first step, in graph order, that does the same work:
    same kind, shapes and epilogue, and variants whose kernels (by ``kernel_id``) and extern
    calls (op, argument layouts and values, output layouts) match. Such twins differ only in
    their weights' values, which do not change a dense GEMM's time, so one timing decides all."""
    first: dict[tuple, str] = {}
    twins = {}
    for step in gemm_steps(graph):
        work = (step.kind, step.shape, step.epilogue,
                tuple((v.name, tuple(_step_work(s) for s in v.steps)) for v in step.variants))
        twins[step.choice_id] = first.setdefault(work, step.choice_id)
    return twins


def extern_threads(backend, device_limit: int):
    """A context in which extern (ATen) calls use at most ``device_limit`` compute units,
    as the kernels timed against them do (``Device.extern_parallelism``)."""
    return backend.device().extern_parallelism(device_limit)


def time_candidates(launcher, keys: list[str], args, block_dims: list[int] | None = None,
                    device=None) -> timing.Timing:
    """Time each candidate (interleaved rounds, preemption-aware, re-timed while noisy).

    Args:
        launcher: a backend ``Launcher`` with every candidate loaded.
        device: the backend's ``Device`` (its noise probes; see ``timing.measure``).
        keys: the candidates' kernel_keys, in the cost order. args: ``launcher.arguments(tensors)``.
        block_dims: the candidates' threads (a second look where 2 threads did not scale;
            stolen CPU time earns one anyway).

    Returns:
        ``timing.Timing``: ``estimates_us`` per candidate, ``contended``; pass a list of
        them with the candidates' block_dims to ``timing.decide`` for the winner.
    """
    return timing.measure(launcher, keys, args, block_dims=block_dims, device=device)


class _Calls:
    """The ``Launcher`` side ``timing.measure`` uses, over plain callables: key ``i``
    calls ``functions[i]`` (GEMM implementations run through torch on ``device``)."""

    def __init__(self, functions: list, device):
        self.functions = functions
        self.device = device

    def launch(self, key: int, args) -> None:
        self.functions[key]()

    def synchronize(self) -> None:
        self.device.synchronize()


def time_functions(functions: list, device) -> timing.Timing:
    """Time each callable like kernel candidates (``time_candidates``: interleaved
    rotated rounds, preemption-aware, re-timed while noisy) on the backend's ``device``."""
    return timing.measure(_Calls(functions, device), list(range(len(functions))), None, device=device)


def _view(env, parts) -> torch.Tensor:
    base, sizes, strides, offset = parts
    tensor = env[id(base)]
    if base.kind == "packed":  # an opaque blocked tensor: always passed whole
        return tensor
    return torch.as_strided(tensor, sizes, strides, tensor.storage_offset() + offset)


def _conform(device, tensor: torch.Tensor, buf: Buffer) -> torch.Tensor:
    """``tensor`` laid out exactly as ``buf`` says (kernels hard-code strides), a copy on
    ``device`` where it is not."""
    if tuple(tensor.shape) != buf.shape or tensor.dtype != buf.dtype:
        raise AotpackError(f"{buf.name}: expected {buf.dtype}{list(buf.shape)}, got "
                           f"{tensor.dtype}{list(tensor.shape)}")
    same = all(st == want or size == 1 for st, want, size in zip(tensor.stride(), buf.strides, buf.shape))
    if same:
        return tensor
    return device.empty(buf.shape, buf.strides, buf.dtype).copy_(tensor)


def _empty(device, buf: Buffer) -> torch.Tensor:
    return device.empty(buf.shape, buf.strides, buf.dtype)


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
    """Runs the lowered graph on real inputs, timing choice points' candidates as it reaches them.

    One table keyed by choice id (``ir.choice``) holds every choice point's samples,
    winner and timings: a kernel's (``kernel_id``) and a GEMM step's (``gemm:<name>``).
    A point still to be tuned times every candidate on the tensors it receives in each
    input set and runs with candidate 0 meanwhile (all candidates compute the same
    values); ``choose`` then picks the winner over the sets (``timing.decide``).
    """

    def __init__(self, graph: Graph, compiled: dict[str, CompiledSet], backend, on_tuned=None,
                 captured: dict | None = None):
        self.graph = graph
        self.compiled = compiled
        self.backend = backend
        self.device = backend.device()
        self.launchers: dict = {}
        #: choice id -> the choice point (kernels' CandidateSets, GEMM steps)
        self.points: dict = {kid: c.candidate_set for kid, c in compiled.items()}
        self.points.update((step.choice_id, step) for step in gemm_steps(graph))
        #: choice id -> timings per input set; winner index; timings (us per candidate)
        self.samples: dict[str, list] = {}
        self.winners: dict[str, int] = {kid: c.cached_choice[0] for kid, c in compiled.items() if c.cached_choice}
        self.timings: dict[str, tuple] = {}
        self.contended: set[str] = set()
        #: choice ids the inputs reached (a kernel: its launcher loaded)
        self.visited: set[str] = set()
        self.on_tuned = on_tuned
        self.captured = captured
        self.to_tune = sum(1 for kid, c in compiled.items()
                           if not c.cached_choice and len(c.candidate_set.candidates) > 1)
        self.packed: dict[int, torch.Tensor] = {}
        #: choice id -> the id its timing and winner are kept under (a GEMM step's first twin)
        self.twin = gemm_twins(graph)
        #: choice ids timed in the current input set (a repeated layer runs untimed)
        self.timed_this_set: set = set()

    def timed_id(self, choice_id: str) -> str:
        """The id the point's timing and winner are kept under: its first twin's, else its own."""
        return self.twin.get(choice_id, choice_id)

    def winner(self, choice_id: str) -> int | None:
        """The point's candidate: its own (replayed, cached) winner, else its first twin's;
        None until tuned."""
        return self.winners.get(choice_id, self.winners.get(self.timed_id(choice_id)))

    def run(self, inputs: tuple) -> list[torch.Tensor]:
        """Execute the graph on copies of ``inputs`` (the user's tensors are never modified)."""
        self.timed_this_set = set()
        env: dict[int, torch.Tensor] = {}
        for buf, tensor in zip(self.graph.inputs, inputs):
            env[id(buf)] = _conform(self.device, tensor.detach().clone(), buf)
        for buf in self.graph.constants:
            env[id(buf)] = self.graph.constant_tensors[buf.name].clone()
        for packed in self.graph.packed:  # packed once, as the model does at load
            if id(packed.buffer) not in self.packed:
                args, kwargs = _extern_args(env, packed)
                self.packed[id(packed.buffer)] = packed.op(*args, **kwargs)
            env[id(packed.buffer)] = self.packed[id(packed.buffer)]
        self._execute(self.graph.steps, env)
        return [_view(env, parts) for parts in self.graph.outputs]

    def _execute(self, steps: list, env) -> None:
        for step in steps:
            if isinstance(step, CondStep):  # allocates its results, runs the taken branch
                for buf in step.results:
                    env[id(buf)] = _empty(self.device, buf)
                taken = bool(_view(env, step.pred).item())
                self._execute(step.true_steps if taken else step.false_steps, env)
            elif isinstance(step, KernelCall):
                for buf in step.writes():
                    env[id(buf)] = _empty(self.device, buf)
                self._kernel(step.kernel, [env[id(b)] for b in step.reads() + step.writes()])
            elif isinstance(step, ExternCall):
                args, kwargs = _extern_args(env, step)
                result = step.op(*args, **kwargs)
                results = result if isinstance(result, (list, tuple)) else [result]
                for buf, tensor in zip(step.outputs, results):
                    if buf is not None:
                        env[id(buf)] = _conform(self.device, tensor, buf)
            elif isinstance(step, CopyBack):
                src = step.source
                env[id(step.target)].copy_(_view(env, (src.base, src.shape, src.strides, src.offset)))
            elif isinstance(step, GemmStep):
                self._gemm(step, env)

    def _gemm(self, step: GemmStep, env) -> None:
        """Run a GEMM step; until it is tuned, time every variant on this input set.

        Variant 0 (the backend's first, an extern call: ``Backend.gemm_variants``) runs first as a
        normal step (tuning its epilogue kernel, if any, and computing the output, which
        every variant computes alike); the other variants' kernels (the templates) get
        their candidates timed; then each variant is
        timed as the calls it makes (arguments prepared once, kernels at their best
        candidate so far), so Python overhead does not favour single-call variants.
        """
        self.visited.add(step.choice_id)
        key = self.timed_id(step.choice_id)
        winner = self.winner(step.choice_id)
        if winner is not None or len(step.variants) == 1 or key in self.timed_this_set:
            self._execute(step.variants[winner or 0].steps, env)
            return
        self.timed_this_set.add(key)
        self._execute(step.variants[0].steps, env)
        for variant in step.variants[1:]:  # a GEMM template's tilings are timed like any kernel's
            for call in variant.steps:
                if isinstance(call, KernelCall) and call.kernel.kernel_id not in self.winners:
                    self._kernel(call.kernel, [env[id(b)] for b in call.reads() + call.writes()])
        calls = [self._calls(variant.steps, env) for variant in step.variants]
        timed = time_functions([lambda fns=fns: [fn() for fn in fns] for fns in calls], self.device)
        self.samples.setdefault(key, []).append(timed)

    def _calls(self, steps: list, env) -> list:
        """One callable per step, its arguments taken from ``env`` now (timing only)."""
        calls = []
        for step in steps:
            if isinstance(step, ExternCall):
                args, kwargs = _extern_args(env, step)
                out = step.outputs[0]
                calls.append(lambda op=step.op, a=args, k=kwargs, b=out: _conform(self.device, op(*a, **k), b))
            elif isinstance(step, KernelCall):
                kid = step.kernel.kernel_id
                launcher = self._launcher(kid)
                launch_args = launcher.arguments([env[id(b)] for b in step.reads() + step.writes()])
                key = self.compiled[kid].candidate_set.candidates[self._best_so_far(kid)].kernel_key
                calls.append(lambda l=launcher, k=key, a=launch_args: l.launch(k, a))
        return calls

    def _best_so_far(self, kid: str) -> int:
        """The kernel's winner, else its fastest candidate in the sets timed so far, else 0."""
        if kid in self.winners:
            return self.winners[kid]
        samples = self.samples.get(kid)
        if not samples:
            return 0
        candidates = self.compiled[kid].candidate_set.candidates
        return timing.decide(samples, [c.block_dim for c in candidates]).index

    def _launcher(self, kid: str):
        self.visited.add(kid)
        if kid not in self.launchers:
            c = self.compiled[kid]
            self.launchers[kid] = self.backend.load_wrapper(c.folder.wrapper, c.folder.path, c.candidate_set.kernel.name)
        return self.launchers[kid]

    def _kernel(self, kernel, tensors: list[torch.Tensor]) -> None:
        kid = kernel.kernel_id
        launcher = self._launcher(kid)
        candidates = self.compiled[kid].candidate_set.candidates
        if self.captured is not None and kid not in self.captured:
            self.captured[kid] = [t.clone() for t in tensors]
        args = launcher.arguments(tensors)
        if kid not in self.winners and len(candidates) > 1 and kid not in self.timed_this_set:
            self.timed_this_set.add(kid)
            keys = [c.kernel_key for c in candidates]
            self.samples.setdefault(kid, []).append(
                time_candidates(launcher, keys, args, [c.block_dim for c in candidates], self.device))
            if self.on_tuned and len(self.samples[kid]) == 1:
                self.on_tuned(sum(1 for key in self.samples if key in self.compiled), self.to_tune)
            launcher.launch(keys[0], args)
            return
        launcher.launch(candidates[self.winners.get(kid, 0)].kernel_key, args)

    def choose(self) -> None:
        """Pick and record the winner of every choice point that was timed (``timing.decide``
        over the input sets, ties broken by the point's ``ranks``); release the kernels'
        losing candidates. One warning names the points whose timing stayed contended."""
        contended = []
        for key, samples in self.samples.items():
            point = self.points[key]
            decision = timing.decide(samples, point.ranks())
            self._log_decision(point, samples, decision)
            best = decision.index
            self.winners[key] = best
            self.timings[key] = tuple(decision.estimates_us)
            if key in self.launchers:  # a kernel: only its winner stays loaded
                self.launchers[key].release(point.candidate_names()[best])
            if decision.contended:
                self.contended.add(key)
                contended.append(point.label)
        self.samples.clear()
        if contended:
            log.warning("timing was contended (other processes took the CPU) for %d kernel%s: %s; their "
                        "choices may differ on an idle machine and are cached: rebuild with --retune when "
                        "it is idle", len(contended), "" if len(contended) == 1 else "s", ", ".join(contended))

    def _log_decision(self, point, samples: list, decision) -> None:
        """The per-candidate timing lines (``aotpack -v``) and the ``Autotune completed`` line."""
        names, best = point.candidate_names(), decision.index
        if point.choice_kind != "kernel":  # a step's implementations, by name
            for name, us in zip(names, decision.estimates_us):
                detail.info("%s candidate %s: Timing %.2f us", point.label, name, us)
            log.info("Autotune completed %s, best implementation: %s", point.label, names[best])
            return
        shares = [min(s.clean_shares[i] for s in samples) for i in range(len(names))]
        for index, (candidate, us) in enumerate(zip(point.candidates, decision.estimates_us)):
            detail.info("%s candidate %d (%s): Timing %.2f us (%.0f%% of samples clean)", point.label, index,
                        candidate.tiling_repr, us, 100 * shares[index])
        attempts = max(s.attempts for s in samples)
        if attempts > 1:
            detail.info("%s: re-timed, %d attempts (preempted, disagreeing, stolen or unscaled samples)",
                        point.label, attempts)
        if best != decision.fastest:
            detail.info("%s: candidate %d is not clearly faster than candidate %d (fewer threads or "
                        "first in the solver's order): keeping %d", point.label, decision.fastest, best, best)
        log.info("Autotune completed %s, best kernel index: %d", point.label, best)


def tune(graph: Graph, compiled: dict[str, CompiledSet], input_sets: list[tuple],
         backend, on_tuned=None, captured: dict | None = None,
         recorded: dict | None = None) -> tuple[dict[str, Choice], list[torch.Tensor]]:
    """Run ``graph`` on every input set and autotune its choice points (``ir.choice``).

    Args:
        compiled: ``kernel_id -> CompiledSet`` (the kernels' compile.locks held).
        input_sets: the example inputs first, then calibration sets (same shapes).
        on_tuned: called as ``(kernels timed so far, kernels to time)`` during the first set.
        recorded: ``choice id -> replay.RecordedWinner`` of GEMM steps, from the tuning
            records (``choice_cache``) or ``--tuning-from`` (``replay.recorded_winners``): a
            step found there whose recorded candidate is still offered takes it untimed
            (a kernel's recorded winner is its ``CompiledSet.cached_choice``, or with
            ``--tuning-from`` its only candidate: ``candidates.prepare``). The caller records
            the returned choices (``choice_cache.write_all``).
        captured: if given, filled with ``kernel_id -> tensors`` (copies of each kernel's
            inputs and outputs at its first launch), for ``--debug-dir``'s benchmark.py.

    Returns:
        (``choice id -> Choice`` of every kernel and GEMM step, outputs of the example
        inputs with every winner).
    """
    runner = PythonModeRun(graph, compiled, backend, on_tuned, captured)
    replayed = {}
    for step in gemm_steps(graph):
        index = replay.pick(step.candidate_names(), (recorded or {}).get(step.choice_id))
        if index is not None:
            runner.winners[step.choice_id] = index
            replayed[step.choice_id] = recorded[step.choice_id]
    outputs = runner.run(input_sets[0])
    for inputs in input_sets[1:]:
        runner.run(inputs)
    visited = set(runner.visited)
    if runner.samples:  # candidate 0 computed those outputs: rerun with the winners
        runner.choose()
        outputs = runner.run(input_sets[0])
    choices = {}
    for kid, c in compiled.items():
        if c.cached_choice:
            choices[kid] = Choice(c.cached_choice[0], tuple(c.cached_choice[1]), kid in visited, True,
                                  bool(c.cached_choice[2]))
        elif kid in runner.timings:
            choices[kid] = Choice(runner.winners[kid], runner.timings[kid], True, False, kid in runner.contended)
        elif kid in visited:  # one candidate: nothing to time
            choices[kid] = Choice(0, (), True, False)
        else:  # not recorded: a later build whose inputs reach it will tune it
            log.info("%s was not reached by the example inputs; using candidate 0", c.candidate_set.kernel.name)
            choices[kid] = Choice(0, (), False, False)
    for step in gemm_steps(graph):  # timed now, or taken from ``recorded``
        key = step.choice_id
        if key in replayed:
            timings, contended = replayed[key].timings_us, replayed[key].contended
        else:
            timings, contended = runner.timings.get(runner.timed_id(key), ()), runner.timed_id(key) in runner.contended
        choices[key] = Choice(runner.winner(key) or 0, tuple(timings), key in runner.visited, key in replayed,
                              contended)
    return choices, outputs
