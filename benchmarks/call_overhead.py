"""Per-call overhead of running an archive from Python: aotpack against eager PyTorch.

By default the model is ``x + 1`` on a 4x4 float32 tensor (one fused kernel of a few
nanoseconds), so what is timed is the call itself: aotpack's Python binding
(``aotpack.load``: ``_aotpack_binding`` hands the inputs' TensorImpls to the runtime and
wraps its outputs as torch tensors; ``AOTPACK_BINDING=ctypes`` times the same steps through
ctypes) plus the runtime's native run path
(input checks, output allocation, the
model.so run, DLPack export), against eager's dispatch of one ``add``. ``--model`` times
another model file on its example inputs instead (for example
``benchmarks/bench_models/layernorm_64x4096.py``), ``--archive`` reuses an archive built
from it; without one the model is built into a temporary folder (``--topn``, PGO at the
first thread count).

Three variants are timed in ``--rounds`` interleaved rounds (the order rotating each
round), each round ``--calls`` timed calls after a fifth as many warm-up calls:

* ``eager``: the module, entering ``torch.inference_mode()`` per call (as
  benchmarks/peers.py runs it);
* ``aotpack``: ``model(*inputs)`` of ``aotpack.load(archive, device_limit=threads)``;
* ``c_api``: the runtime's ``aotpack_model_run`` over tensor handles made once
  (``aotpack_tensor_new``), freeing the output handles: the native run path of
  ``aotpack-run`` plus two bare ctypes calls (~1 us), with no DLPack and no Python objects.

Printed per thread count: each variant's median per-call time in microseconds over all
its timed calls, ``aotpack - eager`` and ``aotpack - c_api`` (the share of the Python
binding and the tensor exchange). The machine's other load moves all three; compare
within one run.

    .venv/bin/python benchmarks/call_overhead.py [--threads 1 2] [--rounds 15] [--calls 2000]
    .venv/bin/python benchmarks/call_overhead.py --model benchmarks/bench_models/layernorm_64x4096.py --calls 300
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import aotpack  # noqa: E402
from aotpack.runtime import c_api as runtime_c_api  # noqa: E402
from aotpack.backends.cpu.cpp_wrapper import DTYPE_CODES  # noqa: E402
from aotpack.build import build  # noqa: E402
from aotpack.config import Settings  # noqa: E402
from common import load_sample  # noqa: E402

TRIVIAL_MODEL = REPO / "tests" / "models" / "add_one.py"  # x + 1 on 4x4: all call overhead
SETTLE_S = 0.05  # between variants: lets a variant's spinning pool threads park


class CApiRunner:
    """``aotpack_model_run`` of one loaded model over input handles made once."""

    def __init__(self, model: aotpack.Model, inputs):
        lib = runtime_c_api.library()
        p, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
        self._new = lib["aotpack_tensor_new"]
        self._new.restype, self._new.argtypes = i32, [i32, i64, ctypes.POINTER(i64), ctypes.POINTER(i64),
                                                      p, ctypes.POINTER(p)]
        self._run = lib["aotpack_model_run"]
        self._run.restype = i32
        self._free = lib["aotpack_tensor_free"]
        self._free.restype, self._free.argtypes = None, [p]
        self._inputs = (p * max(len(inputs), 1))()
        for i, x in enumerate(inputs):
            x = x.contiguous()
            sizes = (i64 * max(x.dim(), 1))(*x.shape)
            handle = p()
            if self._new(DTYPE_CODES[x.dtype], x.dim(), sizes, None, ctypes.c_void_p(x.data_ptr()),
                         ctypes.byref(handle)):
                raise RuntimeError(runtime_c_api.last_error(lib))
            self._inputs[i] = handle.value
        self._outputs = (p * max(len(model.outputs), 1))()
        self._handle = model._handle
        self._num_in, self._num_out = i64(len(inputs)), i64(len(model.outputs))
        self._lib = lib

    def close(self) -> None:
        for i in range(self._num_in.value):
            self._free(self._inputs[i])

    def __call__(self, *_):
        if self._run(self._handle, self._inputs, self._num_in, self._outputs, self._num_out):
            raise RuntimeError(runtime_c_api.last_error(self._lib))
        for i in range(self._num_out.value):
            self._free(self._outputs[i])


def interleaved(runners: dict, rounds: int, calls: int) -> dict[str, float]:
    """Median per-call time (us) of each runner over ``rounds`` interleaved rounds of
    ``calls`` timed calls (each call timed on its own, as benchmarks/peers.py does, so a
    descheduled call moves the median little)."""
    names = list(runners)
    samples: dict[str, list[float]] = {name: [] for name in names}
    clock = time.perf_counter_ns
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            run, times = runners[name], samples[name]
            for _ in range(max(1, calls // 5)):
                run()
            for _ in range(calls):
                start = clock()
                run()
                times.append((clock() - start) / 1e3)
            time.sleep(SETTLE_S)
    return {name: statistics.median(values) for name, values in samples.items()}


def measure(archive: Path, model_path: Path, threads: int, rounds: int, calls: int) -> dict[str, float]:
    """Per-call us of eager, aotpack and c_api at ``threads`` threads."""
    torch.set_num_threads(threads)
    module, inputs = load_sample(model_path)
    with aotpack.load(archive, device_limit=threads) as model:
        with torch.inference_mode():
            reference = module(*inputs)
        for ours, theirs in zip(model(*inputs), [reference] if torch.is_tensor(reference) else reference):
            torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
        c_api = CApiRunner(model, inputs)

        def eager():
            with torch.inference_mode():
                return module(*inputs)

        try:
            return interleaved({"eager": eager, "aotpack": lambda: model(*inputs), "c_api": c_api},
                               rounds, calls)
        finally:
            c_api.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a model file (default: x + 1 on 4x4)")
    parser.add_argument("--archive", type=Path, help="an archive built from --model (default: build one)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per round and variant")
    parser.add_argument("--topn", type=int, default=1)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="aotpack-call-overhead-") as tmp:
        work = Path(tmp)
        model_path = args.model or TRIVIAL_MODEL
        archive = args.archive
        if archive is None:
            settings = Settings.from_env(topn=args.topn, device_limit=args.threads[0], cache_dir=work / "cache")
            archive = build(model_path, work / "dist", settings=settings).archive
        print(f"{model_path.name}: per-call us, median of {args.rounds} interleaved rounds x "
              f"{args.calls} calls")
        print(f"{'threads':>7} {'eager':>9} {'aotpack':>9} {'c_api':>9} {'aotpack-eager':>14} {'aotpack-c_api':>14}")
        for threads in args.threads:
            us = measure(archive, model_path, threads, args.rounds, args.calls)
            print(f"{threads:>7} {us['eager']:>9.2f} {us['aotpack']:>9.2f} {us['c_api']:>9.2f} "
                  f"{us['aotpack'] - us['eager']:>14.2f} {us['aotpack'] - us['c_api']:>14.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
