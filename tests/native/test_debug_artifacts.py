"""--debug-dir: per kernel, sources, a runnable compile.sh and a benchmark.py that re-times
the candidates on the tensors the kernel received during the build."""
import os
import re
import subprocess
import sys


from aotpack.build import build
from aotpack.config import Settings
from aotpack.archive.writer import read_manifest
from helpers import REPO, SAMPLES



def test_debug_dir_holds_compile_scripts_and_benchmarks(tmp_path):
    settings = Settings.from_env(topn=2, cache_dir=tmp_path / "cache", debug_dir=tmp_path / "debug")
    result = build(SAMPLES / "mlp.py", tmp_path / "out", settings=settings)
    root = tmp_path / "debug" / "mlp"
    assert (root / "model.cpp").is_file() and "kernel fused_" in (root / "kernels.ir").read_text()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    for kernel in read_manifest(result.archive)["kernels"]:
        folder = root / "kernels" / kernel["name"]
        assert sorted(p.name for p in (folder / "static_kernel").iterdir()) == sorted(
            re.findall(r"[0-9a-f]{32}", (folder / "wrapper.cpp").read_text()))
        script = subprocess.run([str(folder / "compile.sh")], capture_output=True, text=True, timeout=300)
        assert script.returncode == 0, script.stderr
        assert (folder / "wrapper.so").is_file()
        assert all((d / "kernel.so").is_file() for d in (folder / "static_kernel").iterdir())
        bench = subprocess.run([sys.executable, str(folder / "benchmark.py")], capture_output=True, text=True,
                               env=env, timeout=300)
        assert bench.returncode == 0, bench.stderr
        lines = bench.stdout.splitlines()
        timed = [line for line in lines if " candidate " in line]  # then maybe "timing contended: ..."
        assert [line.split(" (")[1].split("): ")[0] for line in timed] == kernel["candidate_tilings"]
        assert all(float(re.search(r"Timing ([0-9.]+) us", line).group(1)) > 0 for line in timed)
        assert all(re.search(r"\((\d+)% of samples clean\)$", line) for line in timed)
        assert re.fullmatch(r"best kernel index: \d", lines[-1])
