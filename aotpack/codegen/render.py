"""Jinja rendering of a backend's C++ templates, and where the packaged C/C++ headers live.

Each backend keeps its templates in its own folder (``aotpack/backends/<name>/templates/``,
``Backend.template_dir()``) and renders them through ``render_from``: one Jinja environment
per folder, so one backend's templates never shadow another's. The folder is package data,
so the wheel and a source checkout find it at the same place. The model ABI header (repo
``native/include/aotpack/model_abi.h``) is copied into the wheel as ``aotpack/include/``
(see pyproject.toml); a source checkout uses the repository folder directly.
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
def include_dir() -> Path:
    """Folder holding ``model_abi.h`` (passed as ``-I`` when compiling the model source).

    Raises:
        FileNotFoundError: neither the wheel's ``aotpack/include`` nor the checkout's folder exists.
    """
    return _first_existing(_PACKAGE / "include", _CHECKOUT / "native" / "include" / "aotpack")


@functools.lru_cache(maxsize=None)
def environment(folder: Path) -> jinja2.Environment:
    """The Jinja environment of one template folder (cached per folder): undefined names are
    errors, block tags take their line with them, trailing newlines are kept.

    Raises:
        FileNotFoundError: ``folder`` is not a directory (a broken install).
    """
    folder = _first_existing(Path(folder))
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(folder)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_from(folder: Path, template: str, **context) -> str:
    """Render ``<folder>/<template>`` with ``context``.

    Raises:
        jinja2.TemplateNotFound: no such template in ``folder``.
        jinja2.UndefinedError: the template uses a name ``context`` lacks.
    """
    return environment(Path(folder)).get_template(template).render(**context)
