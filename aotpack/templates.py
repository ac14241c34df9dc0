"""Jinja environment over the repository's ``templates/`` folder (C++ templates)."""
from __future__ import annotations

import functools
from pathlib import Path

import jinja2

#: Repository root (aotpack runs from a checkout or an editable install).
REPO_ROOT = Path(__file__).resolve().parents[1]
TEMPLATE_DIR = REPO_ROOT / "templates"
NATIVE_INCLUDE_DIR = REPO_ROOT / "native" / "include"


@functools.lru_cache(maxsize=1)
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render(template: str, **context) -> str:
    """Render ``templates/<template>`` with ``context`` (undefined names are errors)."""
    return _environment().get_template(template).render(**context)
