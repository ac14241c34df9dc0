"""inspect's derived tables from a manifest and a kernels.ir text (no compiler needed)."""

from aotpack.commands import report


KERNEL_IR = """graph: 2 inputs, 1 constants, 3 kernel launches of 2 distinct kernels
  launch fused_add_1
  extern aten.addmm.default
  cond
    then extern aten.addmm.default
    then cond
    then   then extern aten.topk.default
    then   else launch fused_add_1
    else extern aten.cat.default
    else copy into buf2
  launch fused_mul_2
  extern aten.addmm.default

# kernel_id 0123456789abcdef01234567
kernel fused_add_1 [i<4]
  extern aten.not_a_step.default
"""

KERNELS = [
    {"name": "fused_add_1", "kernel_id": "0123456789abcdef01234567", "block_dim": 2,
     "tiling_repr": "cpu;block_dim=2", "candidates": 3, "timings_us": [4.5, 2.25, 3.0], "visited": True,
     "timing_contended": False},
    {"name": "fused_mul_2", "kernel_id": "fedcba9876543210fedcba98", "block_dim": 1,
     "tiling_repr": "cpu;block_dim=1", "candidates": 2, "timings_us": [], "visited": False},
]


def test_extern_calls_count_every_site_in_both_branches_and_stop_at_the_kernel_ir():
    assert report.extern_calls(KERNEL_IR) == [
        {"op": "aten.addmm.default", "count": 3}, {"op": "aten.cat.default", "count": 1},
        {"op": "aten.topk.default", "count": 1}]


def test_launch_sites_come_from_the_header_or_the_launch_lines():
    assert report.launch_sites(KERNEL_IR) == 3
    assert report.launch_sites(KERNEL_IR.replace("3 kernel launches of 2 distinct kernels", "")) == 3


def test_text_report_names_launches_and_distinct_kernels():
    derived = report.build_report({"kernels": KERNELS}, KERNEL_IR)
    assert derived["kernels"][0] == {"kernel": "fused_add_1", "kernel_id": "0123456789ab", "block_dim": 2,
                                     "tiling_repr": "cpu;block_dim=2", "candidates": 3, "best_us": 2.25,
                                     "worst_us": 4.5, "visited": True, "timing": "ok"}
    assert report.text_lines(derived) == [
        "  3 fused kernel launches of 2 distinct kernels:",
        "    kernel       kernel_id     block_dim  tiling_repr      candidates  best_us  worst_us  visited  timing",
        "    fused_add_1  0123456789ab  2          cpu;block_dim=2  3           2.25     4.50      yes      ok",
        "    fused_mul_2  fedcba987654  1          cpu;block_dim=1  2           -        -         no       -",
        "  5 extern calls of 3 ATen ops (not fused):",
        "    op                  count",
        "    aten.addmm.default  3",
        "    aten.cat.default    1",
        "    aten.topk.default   1",
    ]


def test_report_without_kernel_ir_or_externs():
    assert report.text_lines(report.build_report({"kernels": KERNELS[:1]}, None))[0] == (
        "  1 distinct kernel (launch sites unknown: the archive has no kernels.ir):")
    fused_only = "graph: 1 inputs, 0 constants, 1 kernel launches of 1 distinct kernels\n  launch fused_add_1\n"
    lines = report.text_lines(report.build_report({"kernels": KERNELS[:1]}, fused_only))
    assert lines[0] == "  1 fused kernel launch of 1 distinct kernel:"
    assert lines[-1] == "  no extern calls: every op is fused"


def test_contended_timing_is_marked_and_summarised():
    kernels = [dict(KERNELS[0], timing_contended=True), KERNELS[1],
               dict(KERNELS[0], name="old_archive", timing_contended=None)]
    derived = report.build_report({"kernels": kernels}, None)
    assert [row["timing"] for row in derived["kernels"]] == ["contended", None, None]
    lines = report.text_lines(derived)
    assert lines[2].endswith("yes      contended") and lines[4].endswith("yes      -")
    assert lines[5] == ("  timing contended for 1 kernel (other processes took the CPU while they were timed; "
                        "the choice may differ on an idle machine: rebuild with --retune)")
