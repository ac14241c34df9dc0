"""aotpack.runtime.parity.compare: the tolerance rule, NaN and inf handling, and chunking."""
import pytest
import torch

from aotpack.runtime import parity



def test_within_tolerance_passes_and_reports_the_worst_error():
    eager = torch.tensor([1.0, -2.0, 1000.0])
    ours = eager + torch.tensor([5e-5, -5e-5, 0.1])  # 1000 * 1e-4 + 1e-4 = 0.1001 allowed
    check = parity.compare([ours], [eager])
    assert check.ok
    assert check.max_abs_error == pytest.approx(0.1, rel=1e-3)


def test_off_elements_are_counted_with_the_tolerance_named():
    eager = torch.zeros(5)
    ours = torch.tensor([0.0, 2e-4, 0.0, -3e-4, 0.0])
    check = parity.compare([ours], [eager])
    assert check.problems == ["output 0: 2 elements off, max abs error 0.0003 (tolerance 0.0001 + 0.0001*|eager|)"]


def test_an_error_in_a_later_chunk_is_found(monkeypatch):
    monkeypatch.setattr(parity, "CHUNK_ELEMENTS", 4)
    eager = torch.arange(10, dtype=torch.float32).reshape(2, 5)
    ours = eager.clone()
    ours[1, 4] += 1.0  # element 9: the third chunk
    check = parity.compare([ours], [eager])
    assert check.problems == ["output 0: 1 elements off, max abs error 1 (tolerance 0.0001 + 0.0001*|eager|)"]


def test_non_contiguous_outputs_compare_elementwise():
    eager = torch.randn(6, 4)
    assert parity.compare([eager.t()], [eager.t().contiguous()]).ok
    assert not parity.compare([eager.t()], [eager.t().contiguous() + 1]).ok


def test_nan_must_sit_where_eager_has_it():
    eager = torch.tensor([1.0, float("nan"), 3.0])
    assert parity.compare([eager.clone()], [eager]).ok
    moved = torch.tensor([float("nan"), 2.0, 3.0])
    assert parity.compare([moved], [eager]).problems == ["output 0: NaN at different positions"]


def test_infinities_must_match_exactly():
    eager = torch.tensor([float("inf"), -float("inf"), 1.0])
    assert parity.compare([eager.clone()], [eager]).ok
    finite = torch.tensor([3e38, -float("inf"), 1.0])  # |eager| = inf must not admit any value
    assert parity.compare([finite], [eager]).problems == [
        "output 0: 1 elements off, max abs error inf (tolerance 0.0001 + 0.0001*|eager|)"]
    assert not parity.compare([torch.tensor([float("inf"), -float("inf"), float("inf")])], [eager]).ok


def test_integer_outputs_must_be_equal():
    eager = torch.tensor([1, 2, 3])
    assert parity.compare([torch.tensor([1, 2, 3])], [eager]).ok
    assert parity.compare([torch.tensor([1, 0, 0])], [eager]).problems == ["output 0: 2 elements differ"]


def test_shape_dtype_and_count_mismatches_are_named():
    eager = torch.zeros(2, 3)
    assert parity.compare([torch.zeros(3, 2)], [eager]).problems == [
        "output 0: torch.float32[3, 2], eager torch.float32[2, 3]"]
    assert parity.compare([], [eager]).problems == ["0 outputs, eager has 1"]
