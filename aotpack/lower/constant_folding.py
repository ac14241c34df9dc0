"""Constant folding: ops that read no graph input are computed once, at build time.

A traced transformer builds position ids, causal masks and rotary tables from
``arange``/``full``/``scalar_tensor`` and a chain of ops on them; none of it depends on
the model's inputs or weights, yet every call would recompute it (in a tiny LLaMA,
about 20 extern calls and kernel launches before the first layer). Here such a node is
evaluated with eager PyTorch while the graph is lowered, and lowering ships the result
as a constant in place of the subgraph (the build's parity check covers it like any op).

Only nodes that depend on no model input and no parameter are folded (a weight is never
duplicated in another layout); buffers and lifted constants that forward does not
write (a rotary ``inv_freq``) count as constants, and a plain view of one is lowered as
that view, not shipped as a copy. Only deterministic ATen ops (not
``nondeterministic_seeded`` ones such as ``rand``), and only results of at most
``MAX_FOLDED_BYTES``: a large input-free tensor (a 4096x4096 mask) is cheaper to
recompute than to ship, so it is lowered as before, reading the folded values it needs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx

from aotpack.lower import ops

#: Largest folded tensor (bytes); bigger input-free values are computed at run time.
MAX_FOLDED_BYTES = 256 * 1024


@dataclass(frozen=True)
class Folded:
    """The input-free part of a graph: ``values`` are the tensors to ship as constants
    (nodes some non-folded node reads); ``skipped`` are all folded nodes, whose own
    lowering is skipped (``values``' keys among them)."""

    values: dict
    skipped: frozenset


def _foldable_op(node: fx.Node) -> bool:
    """A deterministic ATen op producing one tensor."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    if torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable:
        return False
    value = node.meta.get("val")
    return isinstance(value, torch.Tensor) and value.device.type == "cpu"


def _evaluate(node: fx.Node, values: dict) -> torch.Tensor:
    """Run ``node`` eagerly with its tensor arguments taken from ``values``."""
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: values[n])
    return node.target(*args, **kwargs)


def find(graph: fx.Graph, constants: dict) -> Folded:
    """The nodes of ``graph`` (an exported, decomposed program's) that read no input.

    ``constants`` maps the placeholders that may be read (unwritten buffers and lifted
    constants) to their tensors. Returns which nodes to skip and the tensors to ship.
    Raises nothing: an op that fails to run eagerly here is simply not folded (it runs
    at run time, where its error shows).
    """
    small: dict[fx.Node, torch.Tensor] = dict(constants)
    for node in graph.nodes:
        if not _foldable_op(node) or any(n not in small for n in node.all_input_nodes):
            continue
        value = node.meta["val"]
        if value.numel() * value.element_size() > MAX_FOLDED_BYTES:
            continue
        try:
            with torch.inference_mode():
                small[node] = _evaluate(node, small)
        except Exception:  # noqa: BLE001 - not folded; the run-time call reports it
            continue
    folded = {node: value for node, value in small.items() if node not in constants}
    # a view of a constant costs nothing at run time: where a run-time op reads it, it is
    # lowered as that view (with the views it is made of) rather than shipped as a copy
    free = set()
    for node in folded:
        if node.target in ops.VIEWS and all(n in constants or n in free for n in node.all_input_nodes):
            free.add(node)
    kept_views = set()
    for node in reversed(list(folded)):
        if node in free and any(user not in folded or user in kept_views for user in node.users):
            kept_views.add(node)
    shipped = {node: value.clone(memory_format=torch.contiguous_format) for node, value in folded.items()
               if node not in free and any(user not in folded for user in node.users)}
    return Folded(shipped, frozenset(folded.keys() - kept_views))
