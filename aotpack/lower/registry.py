"""Which function lowers which ATen op: the ``@lowers(aten.op, ...)`` registry.

A handler is ``fn(lw, node)`` -> the node's value (a ``Value``, a tuple of them, or None
when it cannot fuse this particular call, which then runs as an ATen extern call).
``lw`` is the ``lowering.Lowerer``; handlers use its public surface only (``operand``,
``realize``, ``strided``, ...). The op family modules (``pointwise``, ``reductions``,
``shape_ops``) register themselves when ``lowering`` imports them.
"""
from __future__ import annotations

from typing import Any, Callable

#: ATen overload -> handler. Filled by ``@lowers`` at import time.
HANDLERS: dict[Any, Callable] = {}


def lowers(*ops) -> Callable:
    """Register the decorated ``fn(lw, node)`` as the lowering of each overload in ``ops``
    (any iterable of overloads may be passed too, e.g. a table's keys).

    Raises:
        ValueError: when an overload already has a handler (two families claiming one op).
    """
    flat = []
    for op in ops:
        flat.extend(op if isinstance(op, (list, tuple, set, frozenset, dict)) else [op])

    def register(fn: Callable) -> Callable:
        for op in flat:
            if op in HANDLERS:
                raise ValueError(f"{op} is lowered twice: {HANDLERS[op].__qualname__} and {fn.__qualname__}")
            HANDLERS[op] = fn
        return fn

    return register


def handler(op) -> Callable | None:
    """The handler registered for ``op``, or None (the op runs as an extern call)."""
    return HANDLERS.get(op)


def meta(node) -> Any:
    """The example value (a tensor, or a list of them) torch.export recorded for ``node``."""
    return node.meta.get("val")
