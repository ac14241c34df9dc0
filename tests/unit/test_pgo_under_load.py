"""benchmarks/pgo_under_load.py's comparison on fixed build choices (no builds)."""
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import pgo_under_load  # noqa: E402



def _build(gemm_winner: str, clone_winner: str) -> dict:
    return {"gemm_none_1": (gemm_winner, {"mr=14": 888.0, "mr=10": 941.0}),
            "fused_clone_9": (clone_winner, {"simd": 10.0, "plain": 10.1}),
            "gemm linear_addmm_none": ("template", {"aten": 60.0, "template": 20.0})}


def test_report_tells_load_changes_from_close_calls(capsys):
    results = {"idle": [_build("mr=14", "simd"), _build("mr=14", "plain")],
               "busy": [_build("mr=10", "plain"), _build("mr=14", "plain")]}
    assert pgo_under_load.report(results) == 1
    out = capsys.readouterr().out
    assert "busy pick 1.06x the idle winner's time (941.0 vs 888.0 us, idle timings)" in out
    assert "idle builds disagree: a close call (their winners within 1.01x)" in out
    assert out.rstrip().endswith("3 tuned kernels and GEMM steps: 1 same winners, 1 changed by the load, "
                                 "1 close calls (idle builds disagree)")
    rows = {line.split()[0]: line.split()[1:3] for line in out.splitlines() if line.startswith(("gemm_", "fused_"))}
    assert rows == {"gemm_none_1": ["AA", "BA"], "fused_clone_9": ["AB", "BB"]}


def test_a_kernel_tuned_on_one_side_only_counts_as_changed(capsys):
    busy = _build("mr=14", "simd") | {"fused_mean_3": ("inner_tile=64", {"inner_tile=64": 2.0, "inner_tile=32": 2.1})}
    results = {"idle": [_build("mr=14", "simd")], "busy": [busy]}
    assert pgo_under_load.report(results) == 1
    out = capsys.readouterr().out
    assert "fused_mean_3" in out and "tuned only in the busy builds" in out
    assert out.rstrip().endswith("4 tuned kernels and GEMM steps: 3 same winners, 1 changed by the load, "
                                 "0 close calls (idle builds disagree)")
