"""benchmarks/bench_report.py on fixed numbers: percentiles, ratios, geomeans, bandwidth
share and the Markdown tables of docs/performance.md (no peers, no compiler)."""
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_report as br  # noqa: E402



def _run(median, p90=None, err=1e-6):
    return {"median_us": median, "p90_us": p90 or median * 1.1, "max_abs_err": err, "load_s": 0.5, "error": None}


def _result():
    ok = {"build_s": 1.0, "size_bytes": 2_000_000, "error": None}
    return {
        "machine": "test cpu", "versions": {"torch": "2.13.0"}, "method": ["interleaved"], "threads": [1, 2],
        "stream_gbs": {"1": 10.0, "2": 16.0},
        "models": [
            {"name": "a", "memory_bound": False, "bytes_moved": 1000,
             "variants": {v: dict(ok) for v in br.VARIANTS}, "aotpack_phases": {"export": 1.5, "total": 4.0},
             "runs": {"1": {"eager": _run(200), "aoti": _run(100), "onnxruntime": _run(400),
                            "openvino": _run(800), "aotpack": _run(50)},
                      "2": {"eager": _run(100), "aoti": _run(50), "onnxruntime": _run(200),
                            "openvino": _run(400), "aotpack": _run(100)}}},
            {"name": "b", "memory_bound": True, "bytes_moved": 100_000_000,
             "variants": {**{v: dict(ok) for v in br.VARIANTS},
                          "openvino": {"build_s": None, "size_bytes": None, "error": "OpConversionFailure: aten::foo"}},
             "aotpack_phases": {"export": 0.5, "lower": 0.1, "total": 2.0},
             "runs": {"1": {"eager": _run(10_000), "aoti": _run(20_000), "onnxruntime": _run(40_000),
                            "aotpack": _run(40_000)},
                      "2": {"eager": _run(10_000), "aoti": _run(20_000), "onnxruntime": _run(40_000),
                            "aotpack": {"load_s": 0.1, "max_abs_err": 0.5, "error": "outputs differ from eager"}}}},
        ]}


def test_percentile_interpolates_like_numpy_linear():
    assert br.percentile([1, 2, 3, 4], 50) == 2.5
    assert br.percentile([10, 1, 7, 3, 5], 90) == pytest.approx(8.8)  # sorted 1 3 5 7 10: 7 + 0.6 * 3
    assert br.percentile([4.0], 90) == 4.0
    with pytest.raises(ValueError, match="no samples"):
        br.percentile([], 50)
    with pytest.raises(ValueError, match="0..100"):
        br.percentile([1], 101)


def test_latency_stats():
    assert br.latency_stats([5, 1, 3, 2, 4]) == {"median_us": 3, "p90_us": pytest.approx(4.6), "n": 5}


def test_geomean_skips_missing_and_rejects_non_positive():
    assert br.geomean([2, 8, None]) == pytest.approx(4.0)
    assert br.geomean([None]) is None
    with pytest.raises(ValueError, match="positive"):
        br.geomean([1, 0])


def test_ratios_against_each_peer_and_the_best():
    r = br.ratios(_result()["models"][0]["runs"]["1"])
    assert r == {"eager": 0.25, "aoti": 0.5, "onnxruntime": 0.125, "openvino": 0.0625, "best": 0.5,
                 "best_peer": "aoti"}
    # a failed aotpack run has no ratios; a failed peer is left out of "best"
    r = br.ratios(_result()["models"][1]["runs"]["2"])
    assert r["eager"] is None and r["best"] is None and r["best_peer"] == "eager"
    r = br.ratios(_result()["models"][1]["runs"]["1"])
    assert r["openvino"] is None and r["best"] == 4.0 and r["best_peer"] == "eager"


def test_geomeans_over_models():
    g = br.geomeans(_result(), "1")
    assert g["best"] == pytest.approx(math.sqrt(0.5 * 4.0))
    assert g["eager"] == pytest.approx(math.sqrt(0.25 * 4.0))
    assert g["openvino"] == pytest.approx(0.0625)  # model b has no OpenVINO time
    assert br.geomeans(_result(), "2")["best"] == pytest.approx(2.0)  # only model a


def test_bandwidth_share():
    # 100 MB in 10 ms = 10 GB/s = 100 % of 10 GB/s
    assert br.bandwidth_share(100_000_000, 10_000, 10.0) == pytest.approx(100.0)


def test_latency_table_rows_geomean_and_failure_notes():
    lines = br.latency_table(_result(), "1")
    assert lines[0].startswith("| model | eager us (p90) | AOTInductor us (p90) |")
    assert lines[2] == ("| a | 200 (220) | 100 (110) | 400 (440) | 800 (880) | 50 (55) | 0.25x | 0.50x | "
                        "0.12x | 0.06x | 0.50x (AOTInductor) |")
    assert lines[3] == ("| b | 10,000 (11,000) | 20,000 (22,000) | 40,000 (44,000) | failed [1] | 40,000 (44,000) | "
                        "4.00x | 2.00x | 1.00x | — | 4.00x (eager) |")
    assert lines[4] == "| **geomean** |  |  |  |  |  | **1.00x** | **1.00x** | **0.35x** | **0.06x** | **1.41x** |"
    assert lines[-1] == "1. b / OpenVINO: OpConversionFailure: aten::foo"
    two = br.latency_table(_result(), "2")
    assert two[3] == ("| b | 10,000 (11,000) | 20,000 (22,000) | 40,000 (44,000) | failed [1] | failed [2] | "
                      "— | — | — | — | — |")
    assert two[-1] == "2. b / aotpack: outputs differ from eager"


def test_build_phase_bandwidth_and_accuracy_tables():
    build = br.build_table(_result())
    assert build[2] == "| a | 1.00 / 0.50 / 2.00 | 1.00 / 0.50 / 2.00 | 1.00 / 0.50 / 2.00 | 1.00 / 0.50 / 2.00 |"
    assert build[3].split(" | ")[3] == "failed"
    phases = br.phase_table(_result())
    assert phases[0] == "| model | export | total | lower |"
    assert phases[3] == "| b | 0.50 | 2.00 | 0.10 |"
    bandwidth = br.bandwidth_table(_result())
    assert len(bandwidth) == 3  # header, rule, model b only (memory-bound)
    # 100 MB / 10 ms = 10 GB/s: 100 % of 10 GB/s at 1 thread, 62 % of 16 GB/s at 2
    assert bandwidth[2].startswith("| b | 100.00 | 100 % | 50 % | 25 % | — | 25 % | 62 % |")
    assert br.accuracy_table(_result(), "1")[2] == "| a | 1.0e-06 | 1.0e-06 | 1.0e-06 | 1.0e-06 |"


def test_markdown_and_splice_keep_the_intro():
    text = br.markdown(_result(), chart="performance.png")
    assert "## 1 thread\n" in text and "## 2 threads\n" in text
    assert "Geomean aotpack / best peer at 1 thread: **1.41x**." in text
    assert "![aotpack / best peer per model](performance.png)" in text
    first = br.splice("# Intro\n\nhand-written\n", "GEN1")
    assert first == f"# Intro\n\nhand-written\n\n{br.BEGIN_MARK}\nGEN1\n{br.END_MARK}\n"
    again = br.splice(first, "GEN2")
    assert again == f"# Intro\n\nhand-written\n\n{br.BEGIN_MARK}\nGEN2\n{br.END_MARK}\n"


def test_roofline_table_gives_achieved_gflops_and_the_share_of_the_measured_peak():
    result = _result()
    result["peak_gflops"] = {"fp32": {"1": 200.0, "2": 300.0}, "bf16": {"1": 100.0, "2": None}}
    result["models"][0]["flops"] = 5_000_000  # 5 MFLOP in 50 us = 100 GFLOP/s at 1 thread
    result["models"][1]["flops"] = 1  # memory-bound: not in the table
    lines = br.roofline_table(result)
    assert lines[0] == "| model | GFLOP | GFLOP/s @1 | % of fp32 peak @1 | GFLOP/s @2 | % of fp32 peak @2 |"
    assert lines[2:] == ["| a | 0.01 | 100.0 | 50 % | 50.0 | 17 % |"]
    assert br.peak_line(result) == ("Measured peak (register-resident FMA loop, benchmarks/roofline.py): "
                                    "fp32 @1: 200 GFLOP/s, fp32 @2: 300 GFLOP/s, bf16 @1: 100 GFLOP/s, "
                                    "bf16 @2: not supported.")
    assert "| a | 0.01 | 100.0 | 50 % |" in br.markdown(result)
