"""The CPU backend's binaries: shared objects, checked before ``dlopen`` as the native
runtime does (native/src/devices/cpu/elf_check.cpp), with bounded reads; nothing is executed.
"""
from __future__ import annotations

import platform
import struct
from typing import BinaryIO

from aotpack.errors import AotpackError

#: File suffixes of compiled binaries and of their C++ sources.
BINARY_SUFFIX = ".so"
SOURCE_SUFFIX = ".cpp"

_MACHINES = {"x86_64": 62, "amd64": 62, "aarch64": 183, "arm64": 183}
_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_PHDR = struct.Struct("<IIQQQQQQ")
_SHDR = struct.Struct("<IIQQQQIIQQ")
PT_LOAD, PT_DYNAMIC, SHT_NULL, SHT_NOBITS, ET_DYN = 1, 2, 0, 8, 3
_MAX_HEADERS = 65535


def _size(handle: BinaryIO) -> int:
    handle.seek(0, 2)
    return handle.tell()


def _read_at(handle: BinaryIO, offset: int, n: int) -> bytes:
    handle.seek(offset)
    return handle.read(n)


def check_elf(handle: BinaryIO, label: str) -> None:
    """Raise unless ``handle`` holds a 64-bit little-endian ET_DYN ELF file for this host's
    machine whose header tables, program segments and sections lie within the file.

    Raises:
        AotpackError: "<label> is not a valid shared object for this host: <why>".
    """
    def bad(what: str):
        raise AotpackError(f"{label} is not a valid shared object for this host: {what}")

    size = _size(handle)
    if size < _EHDR.size:
        bad(f"shorter than an ELF header ({size} bytes)")
    (ident, e_type, machine, version, _entry, phoff, shoff, _flags, ehsize, phentsize, phnum,
     shentsize, shnum, shstrndx) = _EHDR.unpack(_read_at(handle, 0, _EHDR.size))
    if ident[:4] != b"\x7fELF":
        bad("no ELF magic")
    if ident[4] != 2:
        bad("not a 64-bit ELF file")
    if ident[5] != 1:
        bad("not little-endian")
    if ident[6] != 1 or version != 1:
        bad("unknown ELF version")
    if e_type != ET_DYN:
        bad(f"not a shared object (e_type {e_type})")
    host = _MACHINES.get(platform.machine().lower(), -1)
    if machine != host:
        bad(f"built for machine {machine}, this host is {host}")
    if ehsize != _EHDR.size:
        bad("unexpected ELF header size")

    def within(offset: int, length: int) -> bool:
        return offset <= size and length <= size - offset

    def table(offset, count, entsize, layout, what):
        if count == 0:
            return []
        if entsize != layout.size:
            bad(f"unexpected {what} header size")
        if count > _MAX_HEADERS or not within(offset, count * entsize):
            bad(f"{what} header table lies outside the file (truncated?)")
        data = _read_at(handle, offset, count * entsize)
        return [layout.unpack_from(data, i * entsize) for i in range(count)]

    phdrs = table(phoff, phnum, phentsize, _PHDR, "program")
    if not phdrs:
        bad("no program headers")
    for i, (p_type, _f, p_offset, _va, _pa, p_filesz, p_memsz, _al) in enumerate(phdrs):
        if not within(p_offset, p_filesz):
            bad(f"segment {i} lies outside the file (truncated?)")
        if p_type == PT_LOAD and p_filesz > p_memsz:
            bad(f"segment {i} has more file bytes than memory bytes")
    if not any(p[0] == PT_DYNAMIC for p in phdrs):
        bad("no PT_DYNAMIC segment")
    shdrs = table(shoff, shnum, shentsize, _SHDR, "section")
    if shdrs and shstrndx >= len(shdrs):
        bad("section name index out of range")
    for i, (_n, sh_type, _f, _a, sh_offset, sh_size, *_rest) in enumerate(shdrs):
        if sh_type not in (SHT_NOBITS, SHT_NULL) and not within(sh_offset, sh_size):
            bad(f"section {i} lies outside the file (truncated?)")




class HostBinaries:
    """The Backend hooks every backend of host ELF shared objects answers alike (mixed in
    before ``Backend``): the binaries' suffix and ELF check, and the manifest's
    ``target_isa`` object (``{"march"?, "features"}``, which the runtime's parse_manifest
    reads for both). The archive reader, ``verify`` and ``inspect`` read every
    ``layout.HOST_BACKENDS`` archive by these rules (``manifest_rules.HOST_RULES``), as the
    runtime's device registry maps those names to its CPU device, so reading an archive
    creates no backend (and imports no torch)."""

    binary_suffix = BINARY_SUFFIX
    binary_check_phrase = "every .so passes the ELF check"

    def check_binary(self, handle, label: str) -> None:
        """The runtime's ELF check before dlopen (``check_elf``)."""
        check_elf(handle, label)

    def manifest_target(self, target: dict) -> dict:
        """``{"target_isa": target}``."""
        return {"target_isa": target}

    def describe_target(self, doc: dict) -> str:
        """``target ISA <march>`` (``aotpack inspect``)."""
        return f"target ISA {doc['target_isa'].get('march', '?')}"

    def check_target(self, doc: dict, fields) -> None:
        """``target_isa``: an object with an optional ``march`` string and a ``features`` list
        of strings (the runtime's parse_manifest, same order)."""
        isa = fields.obj(doc, "target_isa", "")
        if "march" in isa:
            fields.str(isa, "march", "target_isa")
        fields.strings(isa, "features", "target_isa")
