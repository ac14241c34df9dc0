"""The CPU backend's Jinja templates: ``templates/`` beside this module (package data).

Every CPU module renders through ``render`` here, so the folder is named once; it is also
what ``CpuBackend.template_dir()`` reports.
"""
from __future__ import annotations

from pathlib import Path

from aotpack.codegen.render import render_from

#: Folder of the CPU backend's ``*.j2`` templates.
TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"


def render(template: str, **context) -> str:
    """Render ``TEMPLATE_DIR/<template>`` with ``context``.

    Raises:
        jinja2.TemplateNotFound: no such template.
        jinja2.UndefinedError: the template uses a name ``context`` lacks.
    """
    return render_from(TEMPLATE_DIR, template, **context)
