"""Content checks the native runtime makes on extracted files, in Python: the safetensors
weights against the manifest's constants (native/src/safetensors.cpp, native/src/model.cpp;
the binaries are the backend's to check, ``Backend.check_binary``). Files are read from open
binary handles with bounded reads; nothing here executes archive code.
"""
from __future__ import annotations

from typing import BinaryIO

from aotpack.archive import manifest_rules
from aotpack.errors import AotpackError

def _size(handle: BinaryIO) -> int:
    handle.seek(0, 2)
    return handle.tell()


def _read_at(handle: BinaryIO, offset: int, n: int) -> bytes:
    handle.seek(offset)
    return handle.read(n)


_ST_DTYPES = {"F32": ("float32", 4), "F64": ("float64", 8), "F16": ("float16", 2),
              "BF16": ("bfloat16", 2), "I64": ("int64", 8), "I32": ("int32", 4), "I16": ("int16", 2),
              "I8": ("int8", 1), "U8": ("uint8", 1), "BOOL": ("bool", 1)}  # native/src/dtype.cpp's order
_U64 = (1 << 64) - 1
_I64 = (1 << 63) - 1


def _unsigned(v, limit: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= limit


def _tensor(name: str, info, data_size: int) -> tuple[str, list[int], int, int]:
    """(dtype, shape, begin, end) of one header entry; the runtime's parse_tensor checks."""
    if not isinstance(info, dict):
        raise AotpackError(f"tensor '{name}' is not a JSON object")
    code = info.get("dtype")
    if not isinstance(code, str):
        raise AotpackError(f"tensor '{name}' has no dtype")
    if code not in _ST_DTYPES:
        raise AotpackError(f"unsupported safetensors dtype '{code}' (expected one of {', '.join(_ST_DTYPES)})")
    shape = info.get("shape")
    if not isinstance(shape, list):
        raise AotpackError(f"tensor '{name}' has no shape list")
    if not all(_unsigned(d, _I64) for d in shape):
        raise AotpackError(f"tensor '{name}' has a bad shape entry")
    offsets = info.get("data_offsets")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_unsigned(o, _U64) for o in offsets)):
        raise AotpackError(f"tensor '{name}' has no valid data_offsets")
    begin, end = offsets
    if begin > end:
        raise AotpackError(f"tensor '{name}' data_offsets end before they begin")
    if end > data_size:
        raise AotpackError(f"tensor '{name}' data_offsets lie outside the file")
    dtype, nbytes = _ST_DTYPES[code]
    for d in shape:
        if d and nbytes > _I64 // d:
            raise AotpackError(f"shape {shape} is too large")
        nbytes *= d
    if end - begin != nbytes:
        raise AotpackError(f"tensor '{name}' holds {end - begin} bytes, {dtype}{shape} needs {nbytes}")
    return dtype, shape, begin, end


def _check_tiling(spans: list[tuple[int, int, str]], data_size: int) -> None:
    """The data_offsets, sorted, must cover the data back to back: no byte shared by two
    tensors, none owned by no tensor (huggingface/safetensors' own rule; the runtime's
    check_tiling, same messages)."""
    spans = sorted(spans)
    covered, previous = 0, None
    for begin, end, name in spans:
        if begin < covered:
            raise AotpackError(f"tensors '{previous[2]}' and '{name}' overlap: data_offsets "
                               f"[{previous[0]}, {previous[1]}] and [{begin}, {end}]")
        if begin > covered:
            break
        covered, previous = end, (begin, end, name)
    if covered != data_size:
        gap_end = next((begin for begin, _, _ in spans if begin > covered), data_size)
        raise AotpackError(f"{gap_end - covered} bytes at data offset {covered} belong to no tensor "
                           "(data_offsets must cover the data back to back)")


def read_safetensors(handle: BinaryIO, path: str) -> dict[str, tuple[str, list[int]]]:
    """{name: (dtype, shape)} of the safetensors file in ``handle``, checked as the
    runtime's parse_safetensors does (native/src/safetensors.cpp): header length, strict
    JSON (``manifest_rules.parse_strict_json``), each tensor in name order, then the
    tiling: sorted by offset, the tensors cover the data back to back.

    Raises:
        AotpackError: "<path>: <problem>", the runtime's message.
    """
    try:
        size = _size(handle)
        if size < 8:
            raise AotpackError("safetensors file is shorter than its 8-byte header length")
        header_len = int.from_bytes(_read_at(handle, 0, 8), "little")
        if header_len > size - 8:
            raise AotpackError("safetensors header length exceeds the file size")
        header = manifest_rules.parse_strict_json(_read_at(handle, 8, header_len), "header")
        if not isinstance(header, dict):
            raise AotpackError("header is not a JSON object")
        data_size = size - 8 - header_len
        views, spans = {}, []
        for name in sorted(header):  # the runtime's JSON objects iterate in key order
            if name == "__metadata__":
                continue
            dtype, shape, begin, end = _tensor(name, header[name], data_size)
            views[name] = (dtype, shape)
            spans.append((begin, end, name))
        _check_tiling(spans, data_size)
        return views
    except AotpackError as exc:
        raise AotpackError(f"{path}: {exc}") from None


def check_weights(views: dict[str, tuple[str, list[int]]], constants: list[dict], path: str,
                  aliases: dict[str, str] | None = None) -> None:
    """Raise unless the weights file's tensors ``views`` (``read_safetensors``) hold every
    constant of the manifest with its dtype and shape (the runtime's make_constants).

    ``aliases``: the manifest's ``weight_aliases`` (already checked for chains and cycles):
    a constant named there is read from the tensor it names; every alias must name a
    tensor of the file, and no alias may itself be a tensor of the file.

    Raises:
        AotpackError: the first constant or alias that does not match, the runtime's message.
    """
    aliases = aliases or {}
    for name in sorted(aliases):
        if name in views:
            raise AotpackError(f"weight alias '{name}' is also a tensor in {path}; a name is either "
                               "stored or an alias")
        if aliases[name] not in views:
            raise AotpackError(f"weight alias '{name}' -> '{aliases[name]}': no such tensor in {path}")
    for spec in constants:
        stored = aliases.get(spec["name"], spec["name"])
        got = views.get(stored)
        if got is None:
            raise AotpackError(f"constant '{spec['name']}' is missing from {path}")
        if got != (spec["dtype"], spec["shape"]):
            held = f" (stored as '{stored}')" if stored != spec["name"] else ""
            raise AotpackError(f"constant '{spec['name']}'{held}: manifest.json says {spec['dtype']}{spec['shape']}, "
                               f"{path} holds {got[0]}{got[1]}")
