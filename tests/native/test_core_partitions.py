"""Core partitions: a model loaded with ``cores`` runs on a thread of its own pinned there,
with exactly that many OpenMP/ATen threads (observed in /proc, not assumed)."""
from __future__ import annotations

import os
import subprocess
import warnings
from collections import Counter
from pathlib import Path

import pytest

import aotpack
from aotpack.runtime import parity
from aotpack.errors import AotpackError
from aotpack.runtime.native import find_runtime
from helpers import MODELS, SAMPLES, eager_outputs


CORES = sorted(os.sched_getaffinity(0))
needs_two_cores = pytest.mark.skipif(len(CORES) < 2, reason="needs 2 cores to partition")


def thread_cores(pid: int | str = "self") -> Counter:
    """(thread name, Cpus_allowed_list) -> number of threads of process ``pid``."""
    found = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            status = (task / "status").read_text()
        except FileNotFoundError:  # the thread ended meanwhile
            continue
        allowed = next(line.split(":", 1)[1].strip() for line in status.splitlines()
                       if line.startswith("Cpus_allowed_list:"))
        found[(name, allowed)] += 1
    return found


def pinned(pid: int | str = "self") -> Counter:
    """The runtime's pinned threads ("aotpack/<cores>") of ``pid``, by their allowed cores."""
    return Counter({allowed: n for (name, allowed), n in thread_cores(pid).items() if name.startswith("aotpack/")})


@pytest.fixture(scope="module")
def transformer(build_model):
    return build_model(SAMPLES / "transformer_block.py").archive


@pytest.fixture(scope="module")
def sort_rows(build_model):
    """An extern ATen sort big enough for ATen's intra-op threads."""
    return build_model(MODELS / "parallel_extern.py").archive


@needs_two_cores
def test_two_models_on_disjoint_cores_each_run_one_pinned_thread(sort_rows):
    reference, inputs = eager_outputs(MODELS / "parallel_extern.py")
    before = pinned()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # tuned for all cores: checked below
        first = aotpack.load(sort_rows, cores=[CORES[0]])
        second = aotpack.load(sort_rows, cores=str(CORES[1]))
    with first, second:
        for model in (first, second):  # ATen's sort and the kernels run on the model's thread
            check = parity.compare(model.run(*inputs), reference)
            assert check.ok, check.problems
        # One thread per model: its OpenMP team at the default size (every core) would add a
        # thread with the same name and cores (it did when only the pinning was done).
        assert pinned() - before == Counter({str(CORES[0]): 1, str(CORES[1]): 1})
    assert pinned() == before  # joined when the models close


@needs_two_cores
def test_an_archive_tuned_for_another_size_warns(transformer):
    limit = aotpack.load(transformer).manifest["device_limit"]
    cores = CORES[:1] if limit != 1 else CORES[:2]
    with pytest.warns(RuntimeWarning) as caught:
        aotpack.load(transformer, cores=cores).close()
    assert [str(w.message) for w in caught] == [
        f"'{transformer}' was tuned for --device-limit {limit} and is loaded on a partition of "
        f"{len(cores)} core(s); its kernels may run slower: rebuild it with --device-limit {len(cores)}"]


def test_bad_core_sets_are_refused(transformer):
    outside = max(CORES) + 1
    cases = [([outside], f"core {outside} is not available to this process (it may use "
                         f"{_cpulist(CORES)})"),
             ([CORES[0], CORES[0]], f"core {CORES[0]} is listed twice"),
             ([-1], "core -1 is negative")]
    for cores, message in cases:
        with pytest.raises(AotpackError) as error:
            aotpack.load(transformer, cores=cores)
        assert str(error.value) == f"cannot load '{transformer}': {message}"
    with pytest.raises(AotpackError) as error:
        aotpack.load(transformer, device_limit=2, cores=CORES[:1])
    assert str(error.value) == (f"cannot load '{transformer}': device_limit 2 and a core set of 1 core(s) "
                                "disagree: with cores the limit is their number (leave device_limit 0)")
    with pytest.raises(AotpackError) as error:
        aotpack.load(transformer, cores="0-x")
    assert str(error.value) == "cores must be CPU ids like '0-3,6', got '0-x'"


@needs_two_cores
def test_aotpack_run_cores(transformer, tmp_path):
    import numpy as np

    _, inputs = eager_outputs(SAMPLES / "transformer_block.py")
    np.save(tmp_path / "x.npy", inputs[0].numpy())
    done = subprocess.run([find_runtime(), transformer, tmp_path / "x.npy", "--cores", str(CORES[1]),
                           "--bench", "3", "--warmup", "1"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "latency_us median=" in done.stdout
    done = subprocess.run([find_runtime(), transformer, "--check", "--cores", "1-0"],
                          capture_output=True, text=True, timeout=60)
    assert (done.returncode, done.stderr) == (
        2, "aotpack-run: error: --cores expects an integer in [1, 1023], got '0'\n"
           "(run 'aotpack-run --help' for usage)\n")


def _cpulist(cores: list[int]) -> str:
    """The kernel's cpulist format of sorted ids: [0, 1, 2, 5] -> "0-2,5"."""
    parts, start = [], 0
    for i in range(1, len(cores) + 1):
        if i == len(cores) or cores[i] != cores[i - 1] + 1:
            parts.append(str(cores[start]) if i - 1 == start else f"{cores[start]}-{cores[i - 1]}")
            start = i
    return ",".join(parts)
