"""What goes into ``weights/weights.safetensors``: each weight's bytes once, however many
names it has.

A tied weight (T5's shared embedding, GPT-2's lm-head) is one storage under several
parameter names; ``torch.export`` lifts each name, and a constant's contents can also
simply repeat another's (two LayerNorms' all-ones weights, equal scalars). The plan
stores each distinct tensor once, under the first name model.so reads it by, and maps
every other name to that stored name in the manifest's ``weight_aliases``
(docs/archive.md). Two constants share bytes when

* they view the same storage with the same offset, shape, strides and dtype (a tie), or
* their contents are equal: same dtype, shape and bytes (sha256, then compared).

Names forward never reads are not stored at all; one of them is still recorded as an
alias when it is tied (same storage) to a stored weight, so every state_dict name of a
tied weight resolves. Buffers the model writes in place never share bytes (a write
through one name must not show through another).
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class WeightPlan:
    """Stored tensors and the aliases that point at them.

    ``tensors``: stored name -> contiguous tensor, in model.so's constant order.
    ``aliases``: name -> stored name (a key of ``tensors``); never chained.
    """

    tensors: dict
    aliases: dict

    def safetensors_bytes(self) -> bytes:
        """The content of ``weights/weights.safetensors``."""
        import safetensors.torch

        return safetensors.torch.save(self.tensors)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data stored (header excluded)."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


def _identity(tensor: torch.Tensor) -> tuple:
    """Storage identity of a view: equal keys mean the very same elements."""
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            tuple(tensor.stride()), tensor.dtype)


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """The bytes of a contiguous tensor as a flat uint8 tensor (no copy)."""
    return tensor.reshape(-1).view(torch.uint8)


def _content(tensor: torch.Tensor) -> tuple:
    return (tensor.dtype, tuple(tensor.shape), hashlib.sha256(_raw(tensor).numpy()).digest())


def plan(graph) -> WeightPlan:
    """The weights of a lowered graph (``ir.Graph``): ``graph.constants`` in order, each
    stored once; see the module docstring for when two names share bytes.

    Returns:
        A ``WeightPlan`` whose ``tensors`` plus ``aliases`` name every constant of
        ``graph.constants`` exactly once.
    """
    mutated = set(graph.mutated_buffers)
    sources = graph.constant_sources
    tensors, aliases = {}, {}
    by_identity, by_content = {}, {}
    for buf in graph.constants:
        name, tensor = buf.name, graph.constant_tensors[buf.name]
        if name in mutated:
            tensors[name] = tensor
            continue
        source = sources.get(name)
        identity = _identity(source) if source is not None else None
        stored = by_identity.get(identity)
        if stored is None:
            content = _content(tensor)
            stored = by_content.get(content)
            if stored is not None and not torch.equal(_raw(tensors[stored]), _raw(tensor)):
                stored = None  # a sha256 collision: keep both
        if stored is not None:
            aliases[name] = stored
        else:
            tensors[name] = tensor
            by_content.setdefault(content, name)
        if identity is not None:
            by_identity.setdefault(identity, aliases.get(name, name))
    read = {b.name for b in graph.constants}
    for name, source in sources.items():  # names forward never reads: recorded when tied
        stored = by_identity.get(_identity(source)) if name not in read else None
        if stored is not None:
            aliases[name] = stored
    return WeightPlan(tensors, aliases)
