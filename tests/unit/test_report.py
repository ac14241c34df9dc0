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

#: the manifest's ``choices``: two kernels (one unvisited) and a GEMM step
CHOICES = [
    {"id": "0123456789abcdef01234567", "kind": "kernel", "name": "fused_add_1", "candidates": ["k0", "k1", "k2"],
     "labels": ["cpu;block_dim=1", "cpu;block_dim=2", "cpu;block_dim=4"], "winner": "k1",
     "timings_us": [4.5, 2.25, 3.0], "visited": True, "timing_contended": False},
    {"id": "fedcba9876543210fedcba98", "kind": "kernel", "name": "fused_mul_2", "candidates": ["k3", "k4"],
     "labels": ["cpu;block_dim=1", "cpu;block_dim=2"], "winner": "k3", "timings_us": [], "visited": False,
     "timing_contended": False},
    {"id": "gemm:linear_fc_relu", "kind": "linear", "name": "linear_fc_relu", "shape": "7x13x5", "epilogue": "relu",
     "candidates": ["aten", "template"], "labels": ["aten", "template"], "winner": "template",
     "timings_us": [3.0, 1.5], "visited": True, "timing_contended": False},
]
KERNELS = [{"name": "fused_add_1"}, {"name": "fused_mul_2"}]
#: a manifest of an older aotpack: winners in ``kernels`` and ``gemms``
OLD = {"kernels": [{"name": "fused_add_1", "kernel_id": "0123456789abcdef01234567", "kernel_key": "k1",
                    "tiling_repr": "cpu;block_dim=2", "candidate_tilings": ["cpu;block_dim=1", "cpu;block_dim=2"],
                    "timings_us": [4.5, 2.25], "visited": True}],
       "gemms": [{"name": "bmm_mm", "kind": "bmm", "shape": "1x5x17x3", "epilogue": "none",
                  "candidates": ["aten", "template"], "winner": "aten", "timings_us": [], "visited": False}]}


def test_extern_calls_count_every_site_in_both_branches_and_stop_at_the_kernel_ir():
    assert report.extern_calls(KERNEL_IR) == [
        {"op": "aten.addmm.default", "count": 3}, {"op": "aten.cat.default", "count": 1},
        {"op": "aten.topk.default", "count": 1}]


def test_launch_sites_come_from_the_header_or_the_launch_lines():
    assert report.launch_sites(KERNEL_IR) == 3
    assert report.launch_sites(KERNEL_IR.replace("3 kernel launches of 2 distinct kernels", "")) == 3


def test_text_report_names_launches_and_one_choice_table():
    derived = report.build_report({"kernels": KERNELS, "choices": CHOICES}, KERNEL_IR)
    assert derived["choices"][0] == {"choice": "fused_add_1", "kind": "kernel", "shape": "-",
                                     "winner": "cpu;block_dim=2", "candidates": 3, "best_us": 2.25,
                                     "worst_us": 4.5, "visited": True, "timing": "ok"}
    assert report.text_lines(derived) == [
        "  3 fused kernel launches of 2 distinct kernels",
        "  3 choice points (candidates timed by PGO):",
        "    choice          kind    shape        winner           candidates  best_us  worst_us  visited  timing",
        "    fused_add_1     kernel  -            cpu;block_dim=2  3           2.25     4.50      yes      ok",
        "    fused_mul_2     kernel  -            cpu;block_dim=1  2           -        -         no       -",
        "    linear_fc_relu  linear  7x13x5+relu  template         2           1.50     3.00      yes      ok",
        "  5 extern calls of 3 ATen ops (not fused):",
        "    op                  count",
        "    aten.addmm.default  3",
        "    aten.cat.default    1",
        "    aten.topk.default   1",
    ]


def test_an_older_manifest_reads_its_kernels_and_gemms_as_choices():
    rows = report.build_report(OLD, None)["choices"]
    assert [(r["choice"], r["kind"], r["shape"], r["winner"], r["candidates"], r["best_us"], r["visited"])
            for r in rows] == [("fused_add_1", "kernel", "-", "cpu;block_dim=2", 2, 2.25, True),
                               ("bmm_mm", "bmm", "1x5x17x3+none", "aten", 2, None, False)]


def test_report_without_kernel_ir_or_externs():
    one = {"kernels": KERNELS[:1], "choices": CHOICES[:1]}
    assert report.text_lines(report.build_report(one, None))[0] == (
        "  1 distinct kernel (launch sites unknown: the archive has no kernels.ir)")
    fused_only = "graph: 1 inputs, 0 constants, 1 kernel launches of 1 distinct kernels\n  launch fused_add_1\n"
    lines = report.text_lines(report.build_report(one, fused_only))
    assert lines[0] == "  1 fused kernel launch of 1 distinct kernel"
    assert lines[-1] == "  no extern calls: every op is fused"


def test_contended_timing_is_marked_and_summarised():
    choices = [dict(CHOICES[0], timing_contended=True), CHOICES[1],
               dict(CHOICES[0], name="old_archive", timing_contended=None)]
    derived = report.build_report({"kernels": KERNELS, "choices": choices}, None)
    assert [row["timing"] for row in derived["choices"]] == ["contended", None, None]
    lines = report.text_lines(derived)
    assert lines[3].endswith("yes      contended") and lines[5].endswith("yes      -")
    assert lines[6] == ("  timing contended for 1 choice point (other processes took the CPU while they were "
                        "timed; the choice may differ on an idle machine: rebuild with --retune)")
