"""GEMM/conv steps without a compiler: which epilogues fold, the variants offered, each
forced variant's Python-mode parity with eager (oneDNN/MKL float32: |ours - eager| <=
1e-5 + 1e-4 * |eager|), resolution and the inspect table."""
from pathlib import Path

import pytest
import torch

from aotpack import backends
from aotpack.tune import candidates
from aotpack.ir import gemm
from aotpack.runtime import parity
from aotpack.tune import replay
from aotpack.commands import report
from aotpack.config import Settings
from aotpack.tune.autotune import Choice, PythonModeRun, gemm_twins
from aotpack.frontend.export import export_model, load_model_file
from aotpack.ir.graph import ExternCall, KernelCall
from aotpack.lower.lowering import lower
from test_kernel_ir import lowered_source


ZOO = Path(__file__).resolve().parents[1] / "models" / "gemm_zoo.py"
REPEATED = Path(__file__).resolve().parents[1] / "models" / "repeated_layers.py"
ATOL, RTOL = 1e-5, 1e-4


@pytest.fixture(scope="module")
def zoo():
    model_file = load_model_file(ZOO)
    graph = lower(export_model(model_file), backends.get("cpu"))
    with torch.no_grad():
        reference = list(model_file.module(*[t.clone() for t in model_file.example_inputs]))
    return graph, model_file.example_inputs, reference


def _steps(graph):
    return gemm.gemm_steps(graph)


def test_every_gemm_and_conv_becomes_a_step_with_its_epilogue(zoo):
    graph, _, _ = zoo
    found = [(s.kind, s.shape, s.epilogue, [v.name for v in s.variants]) for s in _steps(graph)]
    linear = ["aten", "mkl", "onednn"] if torch._C.has_mkl else ["aten", "onednn"]
    own = linear + ["template"]  # not on the transposed activation: its columns are strided
    assert found == [
        ("linear", "7x13x5", "relu", own), ("linear", "7x5x33", "gelu", own),
        ("linear", "7x33x13", "tanh", own), ("linear", "7x13x13", "swish", own),
        ("linear", "7x13x13", "add", own), ("linear", "13x7x5", "none", linear),
        ("linear", "1x13x5", "none", own),
        ("conv2d", "[2, 3, 9, 9]*[6, 3, 3, 3]", "relu", ["onednn", "template"]),  # no ATen: oneDNN runs the same conv
    ]
    # the weights are packed once at load from the dense constants
    assert {p.op for p in graph.packed} >= {torch.ops.mkldnn._reorder_linear_weight.default,
                                            torch.ops.mkldnn._reorder_convolution_weight.default}


def _run(graph, inputs):
    assert not graph.kernels, "a forced oneDNN/MKL graph of this model launches no fused kernel"
    return PythonModeRun(graph, {}, backends.get("cpu")).run(inputs)


@pytest.mark.parametrize("plain", ["onednn", "mkl"])
def test_forced_variants_match_eager(zoo, plain):
    """Every step on oneDNN (post-ops fused); or MKL where no epilogue kernel is needed."""
    graph, inputs, reference = zoo
    if plain == "mkl" and not torch._C.has_mkl:
        pytest.skip("torch without MKL")
    choices = {}
    for step in _steps(graph):
        names = [v.name for v in step.variants]
        want = plain if plain in names and (plain == "onednn" or step.epilogue == "none") else "onednn"
        choices[step.choice_id] = Choice(names.index(want), (), True, False)
    resolved = gemm.resolve(graph, choices)
    assert not _steps(resolved)
    ops = {s.op for s in resolved.steps if isinstance(s, ExternCall)}
    assert torch.ops.mkldnn._linear_pointwise.binary in ops  # the residual add as a post-op
    if plain == "mkl":
        assert torch.ops.mkl._mkl_linear.default in ops
    check = parity.compare(_run(resolved, inputs), reference, atol=ATOL, rtol=RTOL)
    assert check.ok, check.problems


#: The linears' epilogue kernels: relu, gelu (erf form), tanh, silu, the residual add.
EPILOGUE_KERNELS = ["fused_relu", "fused_mul_erf_add", "fused_tanh", "fused_sigmoid_mul", "fused_add"]


def test_aten_variant_keeps_the_epilogue_as_a_fused_kernel(zoo):
    graph, _, _ = zoo
    resolved = gemm.resolve(graph, {})  # variant 0 everywhere: ATen for the linears, oneDNN for the conv
    assert [k.base_name for k in resolved.kernels] == EPILOGUE_KERNELS
    assert all(k in graph.kernels for k in resolved.kernels)
    assert {p.op for p in resolved.packed} == {torch.ops.mkldnn._reorder_convolution_weight.default}
    launches = [s for s in resolved.steps if isinstance(s, KernelCall)]
    assert len(launches) == 5


SHARED = """
import torch
import torch.nn.functional as F


class Shared(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.fc(x)  # also returned: its ReLU must not be folded into the linear
        return y, F.relu(y), F.gelu(self.fc(x), approximate="tanh")


def model():
    torch.manual_seed(0)
    return Shared().eval()


def example_inputs():
    return (torch.randn(3, 8),)
"""


def test_epilogue_with_another_reader_or_other_form_is_not_folded(tmp_path):
    path = tmp_path / "shared.py"
    path.write_text(SHARED)
    graph = lower(export_model(load_model_file(path)), backends.get("cpu"))
    assert [s.epilogue for s in _steps(graph)] == ["none", "none"]  # tanh-GELU is not oneDNN's erf GELU
    choices = {s.choice_id: Choice([v.name for v in s.variants].index("onednn"), (), True, False) for s in _steps(graph)}
    assert len(gemm.resolve(graph, choices).kernels) == 2  # relu and the tanh GELU stay aotpack kernels


def test_a_conv_with_aotpack_kernels_drops_the_aten_variant_and_its_epilogue_kernel(zoo):
    """ATen's convolution is oneDNN's without post-ops or a packed weight, plus an epilogue
    kernel: where the template competes, that variant is not offered and its ReLU kernel is
    neither in the graph nor compiled; the linears' epilogue kernels (MKL with one wins some)
    and the template kernels get their TopN."""
    graph, _, _ = zoo
    (conv,) = [s for s in _steps(graph) if s.kind == "conv2d"]
    assert [v.name for v in conv.variants] == ["onednn", "template"]
    # the linears' epilogues only
    assert [k.base_name for k in graph.kernels if k.base_name.startswith("fused_")] == EPILOGUE_KERNELS
    sets = candidates.prepare(graph, backends.get("cpu"), Settings.from_env(topn=3))
    counts = {kid: len(cs.candidates) for kid, cs in sets.items()}
    assert len(counts) == 12 and all(n > 1 for n in counts.values()), counts  # 5 epilogues, 7 templates

def test_manifest_choice_entries_and_inspect_table(zoo):
    from aotpack.archive.writer import choice_entries

    graph, _, _ = zoo
    step = _steps(graph)[0]
    timings = (30.0, 20.0, 10.0, 40.0)[:len(step.variants)]
    choices = {step.choice_id: Choice(2, timings, True, False, True)}
    names = [v.name for v in step.variants]
    entries = choice_entries(_steps(graph), choices)
    assert entries[0] == {"id": step.choice_id, "name": step.name, "kind": "linear", "shape": "7x13x5",
                          "epilogue": "relu", "candidates": names, "labels": names, "winner": names[2],
                          "timings_us": list(timings), "visited": True, "timing_contended": True}
    assert entries[1]["timings_us"] == [] and entries[1]["winner"] == "aten" and not entries[1]["visited"]
    rows = report.choice_rows(entries[:1])
    assert rows == [{"choice": step.name, "kind": "linear", "shape": "7x13x5+relu", "winner": names[2],
                     "candidates": len(names), "best_us": 10.0, "worst_us": max(timings), "visited": True,
                     "timing": "contended"}]
    lines = report.text_lines({"choices": rows, "distinct_kernels": 0, "launch_sites": 0, "extern_calls": None})
    assert lines[1] == "  1 choice point (candidates timed by PGO):"
    assert lines[3].split()[:4] == [step.name, "linear", "7x13x5+relu", names[2]]
    assert lines[4].startswith("  timing contended for 1 choice point ")


def test_recorded_choices_are_reused_and_damaged_ones_ignored(zoo, tmp_path):
    from aotpack.tune import choice_cache

    graph, _, _ = zoo
    steps = _steps(graph)
    choices = {steps[0].choice_id: Choice(2, (3.0, 2.0, 1.0), True, False),
               steps[1].choice_id: Choice(0, (1.0, 2.0, 3.0), True, True)}  # cached: not written again
    device = backends.get("cpu").device()
    choice_cache.write_all(tmp_path, steps, choices, device.tuning_key(2))
    found = choice_cache.read_all(tmp_path, steps, device.tuning_key(2))
    assert list(found) == [steps[0].choice_id]
    assert found[steps[0].choice_id].candidate == steps[0].variants[2].name
    assert found[steps[0].choice_id].timings_us == (3.0, 2.0, 1.0)
    assert choice_cache.read_all(tmp_path, steps, device.tuning_key(1)) == {}  # another device limit: timed again
    # a kernel a variant launches compiles differently (template, solver, toolchain): timed again
    template_kernels = {s.kernel.kernel_id for v in steps[0].variants for s in v.steps if hasattr(s, "kernel")}
    assert template_kernels
    assert choice_cache.read_all(tmp_path, steps, device.tuning_key(2), {kid: "changed" for kid in template_kernels}) == {}
    (record,) = tmp_path.iterdir()
    record.write_text("{not json")
    assert choice_cache.read_all(tmp_path, steps, device.tuning_key(2)) == {}


def test_identical_gemm_steps_are_twins_of_the_first():
    """The three linear + tanh layers do the same work on their own weights: one key; the
    head (another shape) and every step of the zoo (all different) are their own."""
    graph = lower(export_model(load_model_file(REPEATED)), backends.get("cpu"))
    keys = [s.choice_id for s in _steps(graph)]
    assert [s.epilogue for s in _steps(graph)] == ["tanh", "tanh", "tanh", "none"]
    assert gemm_twins(graph) == {keys[0]: keys[0], keys[1]: keys[0], keys[2]: keys[0], keys[3]: keys[3]}


def test_steps_that_differ_are_not_twins(zoo):
    graph, _, _ = zoo
    assert all(key == first for key, first in gemm_twins(graph).items())


WINOGRAD_AND_DIRECT = """
import torch


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(64, 64, 3, 1, 1)

    def forward(self, x):
        return torch.relu(self.conv(x))


def model():
    torch.manual_seed(0)
    return Block().eval()


def example_inputs():
    return (torch.randn(1, 64, 56, 56),)
"""


class _FlatEstimates:
    """The CPU backend, except that every candidate is estimated at 100 us."""

    def __init__(self, backend):
        self._backend = backend

    def estimate_us(self, kernel, candidate, settings):
        return 100.0

    def __getattr__(self, name):
        return getattr(self._backend, name)


def test_the_runner_up_variant_of_a_step_compiles_only_its_candidate_0(tmp_path):
    """A 64-channel 3x3 convolution at 56x56: the direct template is estimated ~1.5x Winograd's
    time (>= RUNNER_UP_FACTOR), so it compiles only candidate 0 while Winograd keeps its TopN;
    with equal estimates or at --topn 1, nothing is cut."""
    path = tmp_path / "winograd_and_direct.py"
    path.write_text(WINOGRAD_AND_DIRECT)
    cpu = backends.get("cpu")
    graph = lower(export_model(load_model_file(path)), cpu)
    (step,) = _steps(graph)
    assert [v.name for v in step.variants] == ["onednn", "template", "winograd"]
    direct, winograd = (v.steps[0].kernel.kernel_id for v in step.variants[1:])
    settings = Settings.from_env(topn=3, tiny_kernel_us=0.0)
    limits = cpu.limits(settings)
    estimates = {kid: min(cpu.estimate_us(k, c, settings) for c in candidates.shortlist(k, cpu, limits, settings))
                 for kid, k in ((direct, step.variants[1].steps[0].kernel), (winograd, step.variants[2].steps[0].kernel))}
    assert estimates[direct] >= candidates.RUNNER_UP_FACTOR * estimates[winograd]
    sets = candidates.prepare(graph, cpu, settings)
    assert (len(sets[direct].candidates), len(sets[winograd].candidates)) == (1, 3)
    assert sets[direct].candidates[0] == candidates.shortlist(step.variants[1].steps[0].kernel, cpu, limits, settings)[0]
    flat = candidates.prepare(graph, _FlatEstimates(cpu), settings)
    assert (len(flat[direct].candidates), len(flat[winograd].candidates)) == (3, 3)
    single = candidates.prepare(graph, cpu, Settings.from_env(topn=1, tiny_kernel_us=0.0))
    assert all(len(cs.candidates) == 1 for cs in single.values())


class _Unranked:
    """The CPU backend, except that its estimates rank no kernel's tilings."""

    def __init__(self, backend):
        self._backend = backend

    def ranks_tilings(self, kernel):
        return False

    def __getattr__(self, name):
        return getattr(self._backend, name)


def test_a_template_tiling_estimated_far_behind_the_best_is_not_compiled(tmp_path):
    """The 64-channel 3x3 Winograd convolution at 56x56, device limit 2: of the solver's three
    tilings, the one estimated >= --far-behind-factor (1.4) times the best (the 1-thread
    tiling: 2x) is dropped, the others keep their order; nothing is dropped with the factor 0
    or where the backend's estimates do not rank the kernel's tilings (the CPU's fused
    pointwise kernels among them)."""
    path = tmp_path / "winograd_and_direct.py"
    path.write_text(WINOGRAD_AND_DIRECT)
    cpu = backends.get("cpu")
    graph = lower(export_model(load_model_file(path)), cpu)
    (step,) = _steps(graph)
    winograd = step.variants[2].steps[0].kernel
    settings = Settings.from_env(topn=3, tiny_kernel_us=0.0, far_behind_factor="1.4", device_limit="2")
    limits = cpu.limits(settings)
    space = cpu.solve(winograd, limits, 3)
    assert [c.block_dim for c in space] == [2, 1, 2]
    estimates = [cpu.estimate_us(winograd, c, settings) for c in space]
    far = [e >= settings.far_behind_factor * min(estimates) for e in estimates]
    assert far == [False, True, False]
    assert candidates.shortlist(winograd, cpu, limits, settings) == (space[0], space[2])
    assert candidates.shortlist(winograd, _Unranked(cpu), limits, settings) == tuple(space)
    off = Settings.from_env(topn=3, tiny_kernel_us=0.0, far_behind_factor="0", device_limit="2")
    assert candidates.shortlist(winograd, cpu, limits, off) == tuple(space)
    # a winner recorded by a build without the shortcut is still replayed (--tuning-from)
    recorded = replay.RecordedWinner(space[1].kernel_key, (1.0,))
    replayed = candidates.prepare(graph, cpu, settings, {winograd.kernel_id: recorded})
    assert replayed[winograd.kernel_id].candidates == (space[1],)
    assert cpu.ranks_tilings(winograd)
    (pointwise,) = lowered_source(tmp_path, "return torch.exp(x) * 2", "torch.randn(64, 1024)").kernels
    assert not cpu.ranks_tilings(pointwise)
