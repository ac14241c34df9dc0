"""Choice points (``ir.choice``): one id and named candidates for kernels and GEMM steps, read
back from new and older manifests alike (replay, inspect, diff); codegen gets resolved graphs."""
from types import SimpleNamespace

import pytest

from aotpack.codegen import wrapper as codegen
from aotpack.commands import diff
from aotpack.errors import AotpackError
from aotpack.ir.choice import ChoiceStep
from aotpack.tune import replay
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
