"""The package's shape: no import cycle among aotpack's modules (every import counted, those
inside functions and under ``TYPE_CHECKING`` too), no module over ``MAX_LINES`` lines, and
``docs/layout.md`` naming every module and template file that exists and nothing else."""
from __future__ import annotations

import ast
import re
from pathlib import Path



REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "aotpack"
LAYOUT = REPO / "docs" / "layout.md"
#: A module longer than this is split (by stage, op family or concern).
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under aotpack/ (a package is its ``__init__``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The aotpack modules ``name`` imports anywhere in its file. ``from p import x`` counts
    as an import of ``p.x`` where that is a module, else of ``p``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, one level up per extra dot
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (a path back to its start) per strongly connected component of ``graph`` with
    more than one module (Tarjan's algorithm); ``_components`` has all their members."""
    return [_path_in(graph, component) for component in _components(graph)]


def _components(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of ``graph`` with more than one module."""
    index, low, stack, on_stack, components = {}, {}, [], set(), []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                components.append(set(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def _path_in(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A cycle through the first module of ``component``, staying inside it (breadth first)."""
    start = min(component)
    previous, frontier = {start: None}, [start]
    while frontier:
        node = frontier.pop(0)
        for other in sorted(graph[node] & component):
            if other == start:
                path = [node]
                while previous[path[-1]] is not None:
                    path.append(previous[path[-1]])
                return list(reversed(path)) + [start]
            if other not in previous:
                previous[other] = node
                frontier.append(other)
    return sorted(component)


def test_the_import_graph_finder_sees_every_kind_of_import_and_reports_a_cycle(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    source = tmp_path / "m.py"
    source.write_text("import aotpack.ir.kernel\nfrom aotpack.ir import graph\nfrom . import gemm\n"
                      "def f():\n    from aotpack.lower.ops import users\n"
                      "if TYPE_CHECKING:\n    from aotpack.archive import layout\n")
    modules = dict.fromkeys(["aotpack.ir.m", "aotpack.ir.kernel", "aotpack.ir.graph", "aotpack.ir.gemm",
                             "aotpack.lower.ops", "aotpack.archive.layout"])
    assert _imports("aotpack.ir.m", source, modules) == set(modules) - {"aotpack.ir.m"}


def test_no_import_cycle_among_aotpack_modules():
    modules = _modules()
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    found = [(_path_in(graph, c), sorted(c)) for c in _components(graph)]
    lines = [f"{' -> '.join(cycle)} (modules in the cycle: {', '.join(members)})" for cycle, members in found]
    assert not found, "import cycles:\n" + "\n".join(lines)


def test_no_module_is_longer_than_the_limit():
    lengths = {name: len(path.read_text().splitlines()) for name, path in _modules().items()}
    assert not {n: k for n, k in lengths.items() if k > MAX_LINES}, f"modules over {MAX_LINES} lines"


def _documented_modules() -> set[str]:
    """Paths of every module layout.md must name: all but the ``__init__.py`` files that hold
    nothing but a docstring (a folder's marker; the folder's row describes it)."""
    found = set()
    for path in _modules().values():
        body = ast.parse(path.read_text()).body
        empty = all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body)
        if not (path.name == "__init__.py" and empty):
            found.add(str(path.relative_to(REPO)))
    return found


def _templates() -> set[str]:
    """Every Jinja template file, by name, in the repository's ``templates/`` or under aotpack/."""
    return {path.name for folder in (REPO / "templates", PACKAGE) if folder.is_dir() for path in folder.rglob("*.j2")}


def _named_paths(text: str) -> set[str]:
    """Every ``aotpack/...py`` path layout.md names: a row's paths (``aotpack/archive/reader.py``,
    ``manifest_rules.py``: a bare name is in the folder of the path before it), or a folder's
    row listing its modules (``aotpack/backends/cpu/`` ... ``tiling.py``, ``renderer.py``)."""
    named = set()
    for line in text.splitlines():
        if not line.startswith("| `aotpack/"):
            continue
        cells = line.split("|")
        first = cells[1].strip()
        base = ""
        for path in re.findall(r"`([\w/]+\.py)`", first):  # a bare name: in the folder of the one before
            if path.startswith("aotpack/"):
                base = path.rpartition("/")[0] + "/"
            named.add(path if path.startswith("aotpack/") else base + path)
        folder = re.match(r"`(aotpack/[\w/]*/)`", first)
        if folder:  # a folder's modules by file name, in its own cell or the description
            base = folder.group(1)
            for module in re.findall(r"`([\w/]+\.py)`", line):
                named.add(module if module.startswith("aotpack/") else base + module)
    return named


def test_layout_md_names_every_module_and_template_and_nothing_that_is_gone():
    text = LAYOUT.read_text()
    modules = _documented_modules()
    existing = {str(path.relative_to(REPO)) for path in _modules().values()}
    named = _named_paths(text)
    missing = sorted(modules - named)
    stale = sorted(named - existing)
    assert not missing, f"docs/layout.md does not name: {missing}"
    assert not stale, f"docs/layout.md names modules that do not exist: {stale}"
    templates = _templates()
    named_templates = set(re.findall(r"[\w.]+\.j2", text))
    assert not sorted(templates - named_templates), "docs/layout.md does not name these templates"
    assert not sorted(named_templates - templates), "docs/layout.md names templates that do not exist"
