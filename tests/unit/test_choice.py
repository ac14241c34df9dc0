"""Choice points (``ir.choice``): one id and named candidates for kernels and GEMM steps, read
back from new and older manifests alike (replay, inspect, diff); codegen gets resolved graphs."""
import json
from types import SimpleNamespace

import pytest

from aotpack.codegen import wrapper as codegen
from aotpack.commands import diff
from aotpack.errors import AotpackError
from aotpack.ir.choice import ChoiceStep
from aotpack.tune import choice_cache, replay
from aotpack.tune.autotune import Choice
from aotpack.tune.candidates import CandidateSet



class _Step(ChoiceStep):
    """A choice step of two alternatives, as a GEMM step is."""

    choice_kind = "bmm"
    choice_id = "gemm:bmm_1"
    label = "bmm_1"

    def alternatives(self):
        return [("aten", ["a"]), ("template", ["t"])]

    def ranks(self):
        return [1, 0]

    def summary(self):
        return "gemm bmm_1"


def test_a_kernel_and_a_step_are_choice_points_with_named_candidates():
    tilings = [SimpleNamespace(kernel_key=f"key{i}", tiling_repr=f"t{i}", block_dim=2 - i) for i in range(2)]
    kernel = CandidateSet(SimpleNamespace(kernel_id="k1", name="fused_1"), tuple(tilings), ("a", "b"), "w")
    assert (kernel.choice_id, kernel.choice_kind, kernel.label) == ("k1", "kernel", "fused_1")
    assert kernel.candidate_names() == ["key0", "key1"] and kernel.candidate_labels() == ["t0", "t1"]
    assert kernel.ranks() == [2, 1] and kernel.pick("key1") == 1 and kernel.pick("gone") is None
    step = _Step()
    assert step.candidate_names() == ["aten", "template"] and step.chosen_steps(1) == ["t"]
    assert step.pick("template") == 1 and step.details() == {}


def test_replay_reads_choices_and_older_manifests_alike():
    new = {"choices": [{"id": "k1", "kind": "kernel", "winner": "key1", "timings_us": [2.0, 1.0]},
                       {"id": "gemm:bmm_1", "kind": "bmm", "winner": "template", "timings_us": []}]}
    old = {"kernels": [{"kernel_id": "k1", "name": "fused_1", "kernel_key": "key1", "tiling_repr": "t1",
                        "candidate_tilings": ["t0", "t1"], "timings_us": [2.0, 1.0]}],
           "gemms": [{"name": "bmm_1", "kind": "bmm", "winner": "template", "candidates": ["aten", "template"]}]}
    assert [(e["id"], e["winner"]) for e in replay.choice_entries(new)] == \
        [(e["id"], e["winner"]) for e in replay.choice_entries(old)] == [("k1", "key1"), ("gemm:bmm_1", "template")]
    recorded = replay.RecordedWinner("template", ())
    assert replay.pick(["aten", "template"], recorded) == 1
    assert replay.pick(["aten"], recorded) is None and replay.pick(["aten"], None) is None


def test_diff_names_a_step_whose_winner_changed():
    a = {"choices": [{"kind": "kernel", "name": "fused_1", "winner": "x"},
                     {"kind": "bmm", "name": "bmm_1", "winner": "aten"}]}
    b = {"gemms": [{"kind": "bmm", "name": "bmm_1", "winner": "template"}]}
    assert diff._step_winners(a, b) == [{"name": "bmm_1", "winner": ["aten", "template"]}]
    assert diff._step_winners(a, a) == []


def test_codegen_refuses_a_graph_with_choice_steps_left():
    graph = SimpleNamespace(steps=[_Step()], kernels=[])
    with pytest.raises(AotpackError, match="resolve it first"):
        codegen.generate(graph, None, {}, {}, {})


def _kernel_point(sources=("int f();", "int g();")) -> CandidateSet:
    tilings = [SimpleNamespace(kernel_key=f"key{i}", tiling_repr=f"t{i}", block_dim=i + 1) for i in range(2)]
    return CandidateSet(SimpleNamespace(kernel_id="k1", name="fused_1"), tuple(tilings), sources, "w")


def test_a_kernels_tiling_is_recorded_in_the_choice_cache_with_its_contended_flag(tmp_path):
    point = _kernel_point()
    versions = choice_cache.kernel_versions({"k1": point}, "toolchain")
    choice_cache.write_all(tmp_path, [point], {"k1": Choice(1, (2.5, 1.25), True, False, True)}, ("2", "2"), versions)
    (record,) = tmp_path.iterdir()
    assert record.name.startswith("fused_1-") and json.loads(record.read_text()) == {
        "id": "k1", "candidates": ["key0", "key1"], "winner": "key1", "timings_us": [2.5, 1.25], "contended": True}
    assert choice_cache.read_all(tmp_path, [point], ("2", "2"), versions) == {
        "k1": replay.RecordedWinner("key1", (2.5, 1.25), True)}
    choice_cache.write_all(tmp_path, [point], {"k1": Choice(0, (1.0, 2.0), True, False)}, ("2", "2"), versions)
    assert choice_cache.read_all(tmp_path, [point], ("2", "2"), versions)["k1"] == \
        replay.RecordedWinner("key0", (1.0, 2.0), False)


def test_a_kernel_record_is_read_only_for_the_same_sources_toolchain_device_and_candidates(tmp_path):
    point = _kernel_point()
    versions = choice_cache.kernel_versions({"k1": point}, "toolchain")
    choice_cache.write_all(tmp_path, [point], {"k1": Choice(1, (2.5, 1.25), True, False)}, ("2", "2"), versions)
    changed = _kernel_point(("int f();", "int h();"))  # a changed template or math header: timed again
    assert choice_cache.read_all(tmp_path, [changed], ("2", "2"),
                                 choice_cache.kernel_versions({"k1": changed}, "toolchain")) == {}
    assert choice_cache.read_all(tmp_path, [point], ("2", "2"),
                                 choice_cache.kernel_versions({"k1": point}, "other toolchain")) == {}
    assert choice_cache.read_all(tmp_path, [point], ("1", "1"), versions) == {}  # another device limit
    fewer = CandidateSet(point.kernel, point.candidates[:1], point.sources[:1], "w")
    assert choice_cache.read_all(tmp_path, [fewer], ("2", "2"), versions) == {}
    (record,) = tmp_path.iterdir()
    record.write_text(record.read_text().replace('"winner": "key1"', '"winner": "gone"'))
    assert choice_cache.read_all(tmp_path, [point], ("2", "2"), versions) == {}  # a foreign winner: ignored


def test_untimed_and_cached_choices_are_not_recorded(tmp_path):
    point = _kernel_point()
    for choice in (Choice(0, (), True, False), Choice(0, (), False, False), Choice(1, (2.0, 1.0), True, True)):
        choice_cache.write_all(tmp_path, [point], {"k1": choice}, ("2",))
    assert not tmp_path.exists() or list(tmp_path.iterdir()) == []


class _CountingToolchain:
    def __init__(self):
        self.compiled = []

    def _compile(self, source_file, output):
        self.compiled.append(source_file.read_text())
        output.write_bytes(b"binary of " + source_file.read_bytes())

    compile_kernel = compile_wrapper = _compile


def test_a_recorded_kernel_compiles_only_its_winner_and_retune_compiles_all(tmp_path):
    from aotpack.tune import cache
    from aotpack.tune.compile import compile_all

    point = _kernel_point()
    recorded = {"k1": replay.RecordedWinner("key1", (2.5, 1.25), True)}
    for retune, want in ((False, ["int g();"]), (True, ["int f();", "int g();"])):
        root = tmp_path / str(retune)
        folders = {"k1": cache.KernelFolder(root / "fused" / "hash")}
        store = cache.BinaryStore(root / "binaries", "toolchain", ".so", ".cpp")
        toolchain = _CountingToolchain()
        settings = SimpleNamespace(retune=retune, compile_threads=1)
        compiled, _ = compile_all({"k1": point}, folders, toolchain, store, settings, None, recorded)
        assert sorted(s for s in toolchain.compiled if s != "w") == want
        assert compiled["k1"].cached_choice == (None if retune else (1, (2.5, 1.25), True))
