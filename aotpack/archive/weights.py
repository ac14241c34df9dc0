"""What goes into ``weights/weights.safetensors``: each weight's bytes once, however many
names it has.

A tied weight (T5's shared embedding, GPT-2's lm-head) is one storage under several
parameter names; ``torch.export`` lifts each name, and a constant's contents can also
simply repeat another's (two LayerNorms' all-ones weights, equal scalars). The plan
stores each distinct tensor once, under the first name the model library reads it by, and maps
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
import json
import struct
from dataclasses import dataclass

import torch

from aotpack.archive import layout


@dataclass(frozen=True)
class WeightPlan:
    """Stored tensors and the aliases that point at them.

    ``tensors``: stored name -> contiguous tensor, in the model library's constant order.
    ``aliases``: name -> stored name (a key of ``tensors``); never chained.
    """

    tensors: dict
    aliases: dict

    def safetensors_bytes(self) -> bytes:
        """The content of ``weights/weights.safetensors``: a safetensors file whose tensor
        data start at ``layout.WEIGHTS_ALIGNMENT`` (64) bytes from the file's start, see
        ``aligned_safetensors``."""
        return aligned_safetensors(self.tensors)

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data stored (header excluded)."""
        return sum(t.nbytes for t in self.tensors.values())


_DTYPE_NAMES: dict = {}  # torch dtype -> safetensors dtype name, filled as dtypes are met


def _safetensors_dtype(dtype: torch.dtype) -> str:
    """The safetensors header's name of ``dtype`` ("F32", "BF16", ...), as the safetensors
    library itself writes it (read back from the header of an empty tensor it saved).

    Raises:
        ValueError: the library cannot store ``dtype``.
    """
    import safetensors.torch

    if dtype not in _DTYPE_NAMES:
        try:
            blob = safetensors.torch.save({"t": torch.empty(0, dtype=dtype)})
        except Exception:  # the library's own error type varies by version (KeyError here)
            raise ValueError(f"a constant of dtype {dtype} cannot be stored in safetensors; "
                             "cast it in the model to a dtype safetensors "
                             "stores (float32, float16, bfloat16, integers, bool)") from None
        header = json.loads(blob[8:8 + struct.unpack("<Q", blob[:8])[0]])
        _DTYPE_NAMES[dtype] = header["t"]["dtype"]
    return _DTYPE_NAMES[dtype]


def aligned_safetensors(tensors: dict) -> bytes:
    """A safetensors file (8-byte little-endian header length, JSON header, then the tensor
    data back to back: huggingface/safetensors' format) of ``tensors`` (name -> tensor,
    written in row-major order), laid out so the runtime can use the mapped file's bytes in place.

    The runtime maps ``weights/weights.safetensors`` and uses a constant's bytes without a
    copy only at a ``layout.WEIGHTS_ALIGNMENT``-byte (64: one cache line, as ATen aligns its
    allocations) address; the safetensors library aligns data to 8 bytes only, so every
    constant of a model used to be copied at load (ResNet-18: 42 tensors, 54 MB). Here the
    header is padded with spaces (the format allows it) so the data start at a multiple of
    64 bytes, and tensors whose size is a multiple of 64 bytes come first, each then also
    starting at one; the rest (biases and other small tensors) follow and may be copied.
    The format forbids holes between tensors, so no padding goes between them.

    Raises:
        ValueError: a dtype the safetensors library cannot store.
    """
    align = layout.WEIGHTS_ALIGNMENT
    ordered = sorted(tensors, key=lambda name: tensors[name].nbytes % align != 0)  # stable
    header, offset = {}, 0
    for name in ordered:
        tensor = tensors[name]
        header[name] = {"dtype": _safetensors_dtype(tensor.dtype), "shape": list(tensor.shape),
                        "data_offsets": [offset, offset + tensor.nbytes]}
        offset += tensor.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % align)
    parts = [struct.pack("<Q", len(text)), text]
    parts += [_raw(tensors[name].contiguous()).numpy() for name in ordered]
    return b"".join(parts)


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
