"""Template epilogues as kernel-IR expressions (``ir/epilogues.py``) and their C++ through the
CPU backend's formula table (``backends/cpu/epilogue.py``, ``formulas.inline``)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from aotpack.backends.cpu import epilogue as cpu_epilogue
from aotpack.backends.cpu.formulas import formula, inline
from aotpack.ir.epilogues import (ACCUMULATOR, CONV_EPILOGUES, DEPTHWISE_EPILOGUES, GEMM_EPILOGUES, RESIDUAL,
                                  eager_text)
from aotpack.ir.kernel import Const, Load, Op, children
from helpers import EAGER_EPILOGUES


#: The printed forms kernels have always had: a template kernel's ``kernel_id`` hashes them.
PRINTED = {
    "none": "y", "relu": "relu(y)", "gelu": "(y * 0.5) * (erf(y * sqrt(0.5)) + 1)", "tanh": "tanh(y)",
    "sigmoid": "sigmoid(y)", "swish": "y * sigmoid(y)", "hardswish": "y * clamp(y + 3, 0, 6) / 6",
    "hardsigmoid": "clamp(y + 3, 0, 6) / 6", "add": "y + residual", "add_relu": "relu(y + residual)",
}

_TORCH = {"relu": F.relu, "gelu": F.gelu, "tanh": torch.tanh, "sigmoid": torch.sigmoid,
          "add": torch.add, "mul": torch.mul, "div": torch.div}


def _evaluate(node, y: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
    """An epilogue expression on tensors, op by op."""
    if node == ACCUMULATOR:
        return y
    if node == RESIDUAL:
        return r
    if isinstance(node, Const):
        return torch.tensor(node.value, dtype=node.dtype)
    args = [_evaluate(a, y, r) for a in children(node)]
    if node.name == "clamp":
        return torch.clamp(args[0], *node.params)
    return _TORCH[node.name](*args)


def test_every_epilogue_expression_computes_what_eager_does_nan_and_inf_included():
    torch.manual_seed(0)
    y = torch.cat([torch.randn(256) * 4, torch.tensor([0.0, -3.0, 3.0, 6.0, float("inf"), -float("inf"),
                                                         float("nan")])])
    r = torch.randn_like(y)
    for table in (GEMM_EPILOGUES, CONV_EPILOGUES, DEPTHWISE_EPILOGUES):
        for name, epilogue in table.items():
            got, want = _evaluate(epilogue.expr, y, r), EAGER_EPILOGUES[name](y, r)
            torch.testing.assert_close(got, want, equal_nan=True, msg=name)


def test_printed_forms_stay_as_kernel_ids_hash_them():
    every = {**GEMM_EPILOGUES, **CONV_EPILOGUES, **DEPTHWISE_EPILOGUES}
    assert {name: e.text for name, e in every.items()} == PRINTED
    assert {name for name, e in every.items() if e.reads_residual} == {"add", "add_relu"}


def test_epilogue_cpp_is_the_formula_table_with_the_residual_added_as_y_is_read():
    cpp = {name: cpu_epilogue.scalar(e) for name, e in CONV_EPILOGUES.items()}
    assert cpp["relu"] == "ap_relu(y)" == formula("relu", (), torch.float32, "float").format("y")
    assert cpp["add"] == "y" and cpp["add_relu"] == "ap_relu(y)"
    assert cpp["hardswish"] == "y * ap_min_bound(ap_max_bound(y + 3.0f, 0.0f), 6.0f) / 6.0f"
    assert cpu_epilogue.scalar(DEPTHWISE_EPILOGUES["swish"], "t[j]") == "t[j] * ap_sigmoid(t[j])"
    # the GEMM template's own GELU form (its inline erf) replaces the table's
    assert "gemm_erf(y" in cpu_epilogue.scalar(GEMM_EPILOGUES["gelu"], forms=cpu_epilogue.GEMM_FORMS)
    assert "ap::erf(y" in cpu_epilogue.scalar(GEMM_EPILOGUES["gelu"])


def test_inline_writes_only_the_parentheses_c_needs():
    a, b, c = (Load(name, None) for name in "abc")
    leaves = {a: "a", b: "b", c: "c"}

    def op(name, *args, params=()):
        return Op(name, args, torch.float32, params)

    assert inline(op("div", op("mul", a, b), c), leaves) == "a * b / c"
    assert inline(op("mul", a, op("div", b, c)), leaves) == "a * (b / c)"
    assert inline(op("sub", a, op("add", b, c)), leaves) == "a - (b + c)"
    assert inline(op("mul", op("add", a, b), c), leaves) == "(a + b) * c"
    assert inline(op("neg", op("add", a, b)), leaves) == "-(a + b)"
    assert inline(op("relu", op("add", a, b)), leaves) == "ap_relu(a + b)"
    assert inline(op("add", a, Const(-1.5, torch.float32)), leaves) == "a + -1.5f"
    assert inline(op("mul", op("where", a, b, c), a), leaves) == "(a ? b : c) * a"
    assert inline(op("clamp", a, params=(0.0, float("nan"))), leaves) == "ap_min(ap_max_bound(a, 0.0f), ap::limits<float>::quiet_NaN())"
    # fused kernels keep their literals: short ones are the inline form's only
    assert formula("clamp", (0.0, 6.0), torch.float32, "float") == \
        "ap_min_bound(ap_max_bound({0}, static_cast<float>(0.0)), static_cast<float>(6.0))"


def test_vector_forms_cover_relu_and_clamp_the_rest_runs_lane_by_lane():
    assert cpu_epilogue.vector_body(DEPTHWISE_EPILOGUES["relu"]) == ["  return y < 0.0f ? vec{} : y;  // NaN stays NaN"]
    hardswish = cpu_epilogue.vector_body(DEPTHWISE_EPILOGUES["hardswish"])
    assert hardswish[1:] == ["  vec t = y + 3.0f;", "  t = t < 0.0f ? vec{} : t;", "  t = t > 6.0f ? vec{} + 6.0f : t;",
                             "  return y * t / 6.0f;"]
    assert cpu_epilogue.vector_body(DEPTHWISE_EPILOGUES["sigmoid"]) is None
    assert cpu_epilogue.vector_body(DEPTHWISE_EPILOGUES["none"]) == ["  return y;"]
    assert eager_text(DEPTHWISE_EPILOGUES["hardsigmoid"].expr) == "clamp(y + 3, 0, 6) / 6"
