"""Jinja rendering of the C++ templates, and where the packaged C/C++ files live.

The templates (repo ``templates/``) and the model ABI header (repo
``native/include/aotpack/model_abi.h``) are copied into the wheel as
``aotpack/templates/`` and ``aotpack/include/`` (see pyproject.toml); a source
checkout (editable install) uses the repository folders directly.
"""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2

_PACKAGE = Path(__file__).resolve().parents[1]  # aotpack/
_CHECKOUT = _PACKAGE.parent


def _first_existing(*candidates: Path) -> Path:
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"aotpack data folder missing: looked in {', '.join(map(str, candidates))}; "
                            "reinstall aotpack")


@functools.lru_cache(maxsize=1)
def template_dir() -> Path:
    """Folder holding the ``*.j2`` C++ templates."""
    return _first_existing(_PACKAGE / "templates", _CHECKOUT / "templates")


@functools.lru_cache(maxsize=1)
def include_dir() -> Path:
    """Folder holding ``model_abi.h`` (passed as ``-I`` when compiling the model source)."""
    return _first_existing(_PACKAGE / "include", _CHECKOUT / "native" / "include" / "aotpack")


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(template: str, **context) -> str:
    """Render ``templates/<template>`` with ``context`` (undefined names are errors)."""
    return _environment().get_template(template).render(**context)
