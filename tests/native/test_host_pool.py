"""The runtime's caching host allocator (native/src/devices/cpu/host_pool.h) seen from
aotpack.load: the buffers of a run are reused by the next one, results stay equal to eager, and
AOTPACK_HOST_CACHE_MB turns it off or is refused with a clear message."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import aotpack


# 512x1024 float32 = 2 MiB of output: above glibc's mmap threshold, so without the cache every
# run would map and fault fresh pages.
MODEL = """import torch


class M(torch.nn.Module):
    def forward(self, x):
        return torch.softmax(x, -1)


def model():
    return M()


def example_inputs():
    return (torch.randn(512, 1024, generator=torch.Generator().manual_seed(0)),)
"""


@pytest.fixture(scope="module")
def archive(build_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("host-pool") / "big_softmax.py"
    path.write_text(MODEL)
    return build_model(path).archive


def run_script(archive, cache_mb: str) -> subprocess.CompletedProcess:
    """Loads `archive` in a fresh process with AOTPACK_HOST_CACHE_MB=`cache_mb`, runs it
    twice and prints the max abs error against eager."""
    script = ("import aotpack, torch\n"
              "x = torch.randn(512, 1024)\n"
              f"with aotpack.load({str(archive)!r}) as m:\n"
              "    errs = [(m(x)[0] - torch.softmax(x, -1)).abs().max().item() for _ in range(2)]\n"
              "print(max(errs))\n")
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=dict(os.environ, AOTPACK_HOST_CACHE_MB=cache_mb), timeout=120)


@pytest.mark.skipif(os.environ.get("AOTPACK_HOST_CACHE_MB") not in (None, ""),
                    reason="tests the default cache; AOTPACK_HOST_CACHE_MB is set")
def test_second_run_reuses_the_first_runs_output_memory(archive):
    x = torch.randn(512, 1024)
    reference = torch.softmax(x, -1)
    with aotpack.load(archive) as model:
        (first,) = model(x)
        (second,) = model(x)  # `first` still alive: a different block
        assert first.data_ptr() != second.data_ptr()
        assert first.data_ptr() % 64 == 0 and second.data_ptr() % 64 == 0
        torch.testing.assert_close(first, reference, atol=1e-6, rtol=1e-5)
        torch.testing.assert_close(second, reference, atol=1e-6, rtol=1e-5)
        pointer = first.data_ptr()
        del first  # back to the runtime's cache ...
        (third,) = model(x * 2)  # ... and handed out again
        assert third.data_ptr() == pointer
        torch.testing.assert_close(third, torch.softmax(x * 2, -1), atol=1e-6, rtol=1e-5)
    # results outlive the model; the cache outlives both
    torch.testing.assert_close(second, reference, atol=1e-6, rtol=1e-5)


def test_cache_off_gives_the_same_results(archive):
    result = run_script(archive, "0")
    assert result.returncode == 0, result.stderr
    assert float(result.stdout) < 1e-6


def test_bad_cache_size_is_a_load_error(archive):
    result = run_script(archive, "1GB")
    assert result.returncode != 0
    assert ("AOTPACK_HOST_CACHE_MB must be a whole number of MiB (0 turns the host buffer "
            "cache off), got '1GB'") in result.stderr
