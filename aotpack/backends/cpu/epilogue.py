"""C++ of the template epilogues (``ir.epilogues``): each epilogue's IR expression rendered
through ``formulas``' table, plus the op forms templates have of their own, all here.

Templates add the residual to ``y`` as they read it, so an epilogue's C++ is its value over
``y`` with ``y + residual`` already in ``y``.
"""
from __future__ import annotations

from aotpack.backends.cpu.formulas import inline, short_literal
from aotpack.ir.epilogues import ACCUMULATOR, RESIDUAL_SUM, Epilogue, eager_text
from aotpack.ir.kernel import Load, Op, walk

#: The GEMM template's own form of IR ops: GELU through its inline erf (``gemm_erf`` in
#: ``cpu_gemm.cpp.j2``), which the epilogue loop vectorises without a call.
GEMM_FORMS = {"gelu": "({0} * 0.5f) * (gemm_erf({0} * 0.70710678118654752f) + 1.0f)"}

#: Forms of IR ops on a whole vector of results (GCC's vector extension, ``vec``), where the
#: scalar formula does not apply as it is; the arithmetic ops' scalar formulas do.
VECTOR_FORMS = {"relu": "{0} < 0.0f ? vec{} : {0}"}
#: Ops the vector forms compute (``clamp`` as statements on a temporary, ``vector_body``).
VECTOR_OPS = {"add", "sub", "mul", "div", "relu", "clamp"}
#: Why a vector form keeps NaN as eager does, said where the form is used.
VECTOR_NOTES = {"relu": "NaN stays NaN", "clamp": "NaN stays NaN"}


def scalar(epilogue: Epilogue, y: str = "y", forms: dict | None = None) -> str:
    """The C++ expression of ``epilogue`` over the ``float`` ``y`` (a template's variable,
    the residual already added where the epilogue reads one); ``forms``: the template's own
    op forms (``GEMM_FORMS``)."""
    return inline(epilogue.expr, {ACCUMULATOR: y, RESIDUAL_SUM: y}, "float", forms)


def _splat(value: float) -> str:
    """A vector of ``value`` in every lane."""
    return "vec{}" if value == 0 else f"vec{{}} + {short_literal(value, 'float')}"


def vector_body(epilogue: Epilogue) -> list[str] | None:
    """Lines of ``vec epilogue(vec y)``'s body computing ``epilogue`` on whole vectors, or None
    when it has an op without a vector form (it then runs the scalar formula lane by lane).

    A ``clamp`` (finite bounds) becomes statements on a temporary ``t``: two selects, which
    keep NaN where ``ap_max_bound``/``ap_min_bound`` do.
    """
    ops = [node for node in walk(epilogue.expr) if isinstance(node, Op)]
    clamps = list(dict.fromkeys(node for node in ops if node.name == "clamp"))
    if any(node.name not in VECTOR_OPS for node in ops) or len(clamps) > 1 \
            or any(isinstance(node, Load) and node != ACCUMULATOR for node in walk(epilogue.expr)):
        return None
    lines, leaves = [], {ACCUMULATOR: "y"}
    if clamps:
        (clamp,) = clamps
        low, high = clamp.params
        if not all(isinstance(bound, float) and abs(bound) != float("inf") for bound in (low, high)):
            return None
        # the rest as a note: what happens to the clamped value ("it"), or the step after it
        then = eager_text(epilogue.expr, {clamp: "it"}).removeprefix("it ")
        lines += [f"  // {eager_text(clamp)} as eager decomposes it ({VECTOR_NOTES['clamp']}), then {then}",
                  f"  vec t = {inline(clamp.args[0], leaves)};",
                  f"  t = t < {short_literal(low, 'float')} ? {_splat(low)} : t;",
                  f"  t = t > {short_literal(high, 'float')} ? {_splat(high)} : t;"]
        leaves[clamp] = "t"
    value = inline(epilogue.expr, leaves, "float", VECTOR_FORMS)
    notes = sorted({VECTOR_NOTES[n.name] for n in walk(epilogue.expr) if isinstance(n, Op) and n.name in VECTOR_NOTES
                    and not any(n in walk(c) for c in clamps)})
    return lines + [f"  return {value};" + "".join(f"  // {note}" for note in notes)]
