"""The manifest schema, checked exactly as the native runtime does (native/src/manifest.cpp,
native/src/compat.cpp's structural checks). docs/archive.md, "Reading rules", is the shared spec.

Every error is an ``AotpackError`` whose text matches the runtime's
(``manifest.json: inputs[0].dtype: ...``).
"""
from __future__ import annotations

import json
import re

from aotpack.archive import layout
from aotpack.backends.host.binaries import HostBinaries
from aotpack.errors import AotpackError

FORMAT_VERSION = layout.FORMAT_VERSION
MAX_JSON_DEPTH = layout.MAX_JSON_DEPTH
DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool")
RESERVED = (layout.MANIFEST_PATH, layout.MANIFEST_DIGEST_PATH, layout.MANIFEST_SIGNATURE_PATH)
WEIGHTS = layout.WEIGHTS_PATH
_HEX64 = re.compile(r"[0-9a-f]{64}")
_INT64 = (-(1 << 63), (1 << 63) - 1)


#: How the runtime reads the archive of every backend in ``layout.HOST_BACKENDS`` (its device
#: registry maps them all to the CPU device): binaries, their check, the target keys.
HOST_RULES = HostBinaries()

def check_entry_path(path: str) -> None:
    """Raise unless ``path`` is a plain relative path (same rule as the runtime's
    check_entry_path): non-empty, at most ``layout.MAX_PATH_BYTES`` bytes and
    ``layout.MAX_PATH_COMPONENTS`` components of at most ``layout.MAX_NAME_BYTES`` bytes,
    not absolute, no ``..``/``.``/empty components nor one starting with ``.``, printable
    ASCII other than space and backslash.

    Raises:
        AotpackError: the first rule broken, e.g. "entry 'a/.x' has a component starting with '.'".
    """
    if not path:
        raise AotpackError("entry with an empty path")
    if len(path.encode("utf-8", "surrogateescape")) > layout.MAX_PATH_BYTES:
        raise AotpackError(f"entry with a path longer than {layout.MAX_PATH_BYTES} bytes")
    if path.startswith("/"):
        raise AotpackError(f"entry '{path}' has an absolute path")
    if any(not (0x20 < ord(c) < 0x7F) or c == "\\" for c in path):
        raise AotpackError(f"entry '{path}' has a space, control, non-ASCII or backslash character in its path")
    parts = path.split("/")
    for part in parts:
        if part == "..":
            raise AotpackError(f"entry '{path}' has a '..' component")
        if part in ("", "."):
            raise AotpackError(f"entry '{path}' is not a normalised relative path")
        if part.startswith("."):
            raise AotpackError(f"entry '{path}' has a component starting with '.'")
        if len(part) > layout.MAX_NAME_BYTES:
            raise AotpackError(f"entry '{path}' has a component longer than {layout.MAX_NAME_BYTES} bytes")
    if len(parts) > layout.MAX_PATH_COMPONENTS:
        raise AotpackError(f"entry '{path}' has more than {layout.MAX_PATH_COMPONENTS} components")


def check_no_file_is_a_folder(paths) -> None:
    """Raise if a path of ``paths`` (the listed files and the manifest entries) is also a
    folder of another one ("a" and "a/b"): the runtime could not write both.

    Raises:
        AotpackError: ``manifest.json: files["a/b"]: 'a' is a file, so it cannot be a folder``
            for the first such path in sorted order.
    """
    files = set(paths) | set(RESERVED)
    for path in sorted(paths):
        end = path.find("/")
        while end != -1:
            if path[:end] in files:
                _bad(f'files["{path}"]', f"'{path[:end]}' is a file, so it cannot be a folder")
            end = path.find("/", end + 1)


def _bad(where: str, what: str):
    raise AotpackError(f"manifest.json: {where}: {what}")


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _member(obj: dict, key: str, where: str):
    if key not in obj:
        _bad(_join(where, key), "missing")
    return obj[key]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and _INT64[0] <= v <= _INT64[1]


def _int(obj, key, where) -> int:
    v = _member(obj, key, where)
    if not _is_int(v):
        _bad(_join(where, key), "expected an integer")
    return v


def _str(obj, key, where) -> str:
    v = _member(obj, key, where)
    if not isinstance(v, str):
        _bad(_join(where, key), "expected a string")
    return v


def _list(obj, key, where) -> list:
    v = _member(obj, key, where)
    if not isinstance(v, list):
        _bad(_join(where, key), "expected a list")
    return v


def _obj(obj, key, where) -> dict:
    v = _member(obj, key, where)
    if not isinstance(v, dict):
        _bad(_join(where, key), "expected an object")
    return v


def _strings(obj, key, where) -> list[str]:
    items = _list(obj, key, where)
    for i, v in enumerate(items):
        if not isinstance(v, str):
            _bad(f"{_join(where, key)}[{i}]", "expected a string")
    return items


class _Fields:
    """The field checks a backend's ``check_target`` uses (same messages as the rest)."""

    obj = staticmethod(_obj)
    str = staticmethod(_str)
    strings = staticmethod(_strings)


FIELDS = _Fields()


def _dims(obj, key, where) -> list[int]:
    items = _list(obj, key, where)
    for i, v in enumerate(items):
        at = f"{_join(where, key)}[{i}]"
        if not _is_int(v):
            _bad(at, "expected an integer")
        if v < 0:
            _bad(at, f"negative value {v}")
    return items


def _spec(v, where: str) -> dict:
    if not isinstance(v, dict):
        _bad(where, "expected an object")
    _str(v, "name", where)
    dtype = _str(v, "dtype", where)
    if dtype not in DTYPES:
        _bad(f"{where}.dtype", f"unknown dtype '{dtype}' (expected one of {', '.join(DTYPES)})")
    shape, strides = _dims(v, "shape", where), _dims(v, "strides", where)
    if len(shape) != len(strides):
        _bad(where, f"shape {shape} and strides {strides} differ in length")
    return v


def _specs(doc, key) -> list[dict]:
    return [_spec(v, f"{key}[{i}]") for i, v in enumerate(_list(doc, key, ""))]


def nesting_depth(text: bytes, limit: int) -> int:
    """Deepest nesting of arrays/objects outside strings (stops counting past ``limit``)."""
    depth = deepest = 0
    in_string = escaped = False
    for c in text:
        if in_string:
            if escaped:
                escaped = False
            elif c == 0x5C:
                escaped = True
            elif c == 0x22:
                in_string = False
        elif c == 0x22:
            in_string = True
        elif c in (0x5B, 0x7B):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > limit:
                break
        elif c in (0x5D, 0x7D) and depth > 0:
            depth -= 1
    return deepest


def _reject_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _finite(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):  # 1e400: the runtime's parser overflows
        raise ValueError(f"number {text} is out of range")
    return value


def _strict_strings(value, depth=0) -> None:
    """The runtime's JSON parser refuses lone surrogates (``"\\ud800"``); so do we."""
    if isinstance(value, str):
        value.encode("utf-8")
    elif isinstance(value, dict):
        for k, v in value.items():
            k.encode("utf-8")
            _strict_strings(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _strict_strings(v, depth + 1)


def parse_strict_json(text: bytes, label: str):
    """JSON bytes -> value, refusing what the runtime's parser refuses (native/src/manifest.cpp
    parse_strict_json): a byte-order mark, nesting deeper than ``MAX_JSON_DEPTH``, NaN and
    Infinity, numbers out of double's range, invalid UTF-8 and lone surrogates.

    Raises:
        AotpackError: "<label> starts with a byte-order mark ...", "<label> nests deeper
            than 64 levels" or "<label> is not valid JSON: <why>".
    """
    if text.startswith(b"\xef\xbb\xbf"):
        raise AotpackError(f"{label} starts with a byte-order mark (it must be plain UTF-8 JSON)")
    if nesting_depth(text, MAX_JSON_DEPTH) > MAX_JSON_DEPTH:
        raise AotpackError(f"{label} nests deeper than {MAX_JSON_DEPTH} levels")
    try:
        doc = json.loads(text.decode("utf-8"), parse_constant=_reject_constant, parse_float=_finite)
        _strict_strings(doc)
    except (ValueError, UnicodeError, RecursionError) as exc:
        raise AotpackError(f"{label} is not valid JSON: {exc}") from None
    return doc


def parse_json(text: bytes) -> dict:
    """manifest.json bytes -> dict, refusing what the runtime's parser refuses.

    Raises:
        AotpackError: see ``parse_strict_json``; also a document that is not an object.
    """
    doc = parse_strict_json(text, layout.MANIFEST_PATH)
    if not isinstance(doc, dict):
        raise AotpackError("manifest.json: expected a JSON object at the top level")
    return doc


def validate(doc: dict) -> dict:
    """Check every key the runtime reads (same order, same messages as its parse_manifest);
    returns ``doc``. The reader then checks the limits, then ``check_structure``.

    Raises:
        AotpackError: the first problem, naming the key.
    """
    version = _int(doc, "format_version", "")
    if version != FORMAT_VERSION:
        raise AotpackError(f"format_version {version} is not supported (this runtime reads {FORMAT_VERSION})")
    _str(doc, "name", "")
    _str(doc, "version", "")
    if "aotpack_version" in doc:
        _str(doc, "aotpack_version", "")
    _str(doc, "torch_version", "")
    _str(doc, "backend", "")
    # the runtime parses one form of target keys (target_isa) on every manifest, whichever host backend
    HOST_RULES.check_target(doc, FIELDS)
    if "device_limit" in doc:
        _int(doc, "device_limit", "")
    model = _obj(doc, "model", "")
    library = _str(model, "library", "model")
    abi = _int(model, "abi_version", "model")
    constants = _specs(doc, "constants")
    _specs(doc, "inputs")
    _specs(doc, "outputs")
    mutated = _strings(doc, "mutated_buffers", "") if "mutated_buffers" in doc else []
    files = _obj(doc, "files", "")
    for path, rec in sorted(files.items()):  # the runtime's JSON objects iterate sorted
        where = f'files["{path}"]'
        try:
            check_entry_path(path)
        except AotpackError as exc:
            _bad(where, str(exc))
        if path in RESERVED:
            _bad(where, "the manifest entries cannot be listed in 'files'")
        if not isinstance(rec, dict):
            _bad(where, "expected an object")
        if not _HEX64.fullmatch(_str(rec, "sha256", where)):
            _bad(f"{where}.sha256", "not a 64-digit lower-case hex digest")
        if _int(rec, "size", where) < 0:
            _bad(f"{where}.size", "negative")
    check_no_file_is_a_folder(files)
    if library not in files:
        _bad("model.library", f"'{library}' is not one of the archive's files")
    weight_aliases(doc)
    return doc


def check_structure(doc: dict) -> None:
    """native/src/compat.cpp's structural checks and the mutated buffers' rules, on a ``validate``d
    manifest whose limits were checked (the runtime's order; torch version and CPU features
    are the host's business, checked by the runtime only, between backend and abi_version).

    Raises:
        AotpackError: the first problem.
    """
    backend, abi, files = doc["backend"], doc["model"]["abi_version"], doc["files"]
    constants, aliases = doc["constants"], weight_aliases(doc)
    mutated = doc.get("mutated_buffers", [])
    if backend not in layout.HOST_BACKENDS:  # as the native runtime's check_backend, same message
        names = ", ".join(f"'{name}'" for name in layout.HOST_BACKENDS)
        raise AotpackError(f"backend '{backend}' is not supported (this runtime runs {names} archives)")
    if abi != layout.MODEL_ABI_VERSION_MAJOR:
        raise AotpackError(f"model.abi_version {abi} is not supported (this runtime implements "
                           f"{layout.MODEL_ABI_VERSION_MAJOR})")
    if constants and WEIGHTS not in files:
        raise AotpackError(f"the manifest lists constants but the archive has no {WEIGHTS}")
    names = {c["name"] for c in constants}
    for name in mutated:
        if name not in names:
            raise AotpackError(f"mutated buffer '{name}' is not among the constants")
    targets = set(aliases.values())
    for name in mutated:
        if name in aliases or name in targets:
            raise AotpackError(f"mutated buffer '{name}' shares its weights with another name "
                               "(weight_aliases); a buffer the model writes must be stored on its own")


def weight_aliases(doc: dict) -> dict[str, str]:
    """The manifest's ``weight_aliases`` (name -> the tensor of the weights file holding its
    bytes; absent = none), checked: an object of strings, where no target is itself an
    alias, so no chain and no cycle. Keys are checked in sorted order, as the runtime does.

    Raises:
        AotpackError: ``manifest.json: weight_aliases...: <problem>``, naming a cycle.
    """
    if "weight_aliases" not in doc:
        return {}
    aliases = _obj(doc, "weight_aliases", "")
    for name in sorted(aliases):
        where = f'weight_aliases["{name}"]'
        target = aliases[name]
        if not isinstance(target, str):
            _bad(where, "expected a string")
    for name in sorted(aliases):
        target = aliases[name]
        if target in aliases:
            path, seen = [name], {name}
            while target in aliases and target not in seen:
                path.append(target)
                seen.add(target)
                target = aliases[target]
            if target in seen:
                chain = " -> ".join(f"'{n}'" for n in path + [target])
                _bad("weight_aliases", f"the aliases form a cycle: {chain}")
            _bad(f'weight_aliases["{name}"]', f"'{aliases[name]}' is itself an alias; an alias must "
                 f"name a tensor stored in {WEIGHTS}")
    return aliases


def stored_name(doc: dict, name: str) -> str:
    """The tensor of the weights file that holds constant ``name``: its alias target, or
    ``name`` itself (``doc`` already validated)."""
    return doc.get("weight_aliases", {}).get(name, name)
