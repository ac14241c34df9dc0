"""Process replay: the generated C++ of a fixed set of models, checked in.

A refactor of the compiler must not change what it generates. This module renders,
without running a compiler, every candidate's ``kernel.cpp``, every ``wrapper.cpp``
and the ``model.cpp`` (candidate 0 as each kernel's winner, a fixed device limit) of
the models in ``MODELS``, and compares them with ``tests/golden/<model>.txt``.

    python tests/golden/replay.py            # print a diff against the checked-in sources
    python tests/golden/replay.py --update   # regenerate them (say why in the commit)
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

GOLDEN = Path(__file__).resolve().parent
REPO = GOLDEN.parents[1]
sys.path.insert(0, str(REPO))

#: Models whose generated sources are pinned (paths relative to the repository).
MODELS = [
    "samples/mlp.py", "samples/transformer_block.py",
    "tests/models/pointwise_zoo.py", "tests/models/nested_reductions.py", "tests/models/lazy_views.py",
    "tests/models/branchy.py", "tests/models/extern_zoo.py", "tests/models/mutations.py",
    "tests/models/narrow_rows.py", "tests/models/promotion_and_specials.py", "tests/models/long_rows.py",
    "tests/models/scalar_reduce.py", "tests/models/edge_values.py", "tests/models/view_mutations.py",
]
#: Candidates depend on the device limit: pin it so the sources do not depend on the host.
DEVICE_LIMIT = 4
SEPARATOR = "==== "


def generate(model: str) -> dict[str, str]:
    """Archive-relative path -> generated source, for one model file (no compiler run)."""
    from types import SimpleNamespace

    from aotpack import cpp_wrapper
    from aotpack.export import export_model, load_model_file
    from aotpack.backends.cpu.formulas import C_TYPES
    from aotpack.backends.cpu.renderer import render_kernel
    from aotpack.backends.cpu.tiling import solve
    from aotpack.lowering import lower
    from aotpack.render import render

    graph = lower(export_model(load_model_file(REPO / model)), frozenset(C_TYPES))
    sources, unique, art_of = {}, {}, {}
    for kernel in graph.kernels:
        candidates = solve(kernel, DEVICE_LIMIT)
        kernel_sources = tuple(render_kernel(kernel, t) for t in candidates)
        wrapper = render("cpu_wrapper.cpp.j2", candidates=candidates)
        key = (kernel_sources, wrapper)
        if key not in unique:  # identical kernels share one artifact, as in a build
            unique[key] = SimpleNamespace(kernel=kernel, winner=candidates[0])
            folder = f"kernels/{kernel.name}"
            for tiling, text in zip(candidates, kernel_sources):
                sources[f"{folder}/static_kernel/{tiling.kernel_key}/kernel.cpp"] = text
            sources[f"{folder}/wrapper.cpp"] = wrapper
        art_of[id(kernel)] = unique[key]
    meta = {"name": Path(model).stem, "version": "0.1.0", "aotpack_version": "golden",
            "device_limit": DEVICE_LIMIT}
    sources["model/model.cpp"] = cpp_wrapper.generate(graph, list(unique.values()), art_of, meta)
    return sources


def serialise(sources: dict[str, str]) -> str:
    """One text holding every source, each after a ``==== path`` line (sorted by path)."""
    return "".join(f"{SEPARATOR}{path}\n{text}" for path, text in sorted(sources.items()))


def golden_path(model: str) -> Path:
    """``tests/golden/<stem>.txt`` of a model file."""
    return GOLDEN / f"{Path(model).stem}.txt"


def diff(model: str) -> list[str]:
    """Unified diff lines between the checked-in and the regenerated sources (empty = same)."""
    expected = golden_path(model).read_text().splitlines(keepends=True) if golden_path(model).exists() else []
    actual = serialise(generate(model)).splitlines(keepends=True)
    return list(difflib.unified_diff(expected, actual, f"golden/{golden_path(model).name}", "generated"))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update", action="store_true", help="rewrite the golden files")
    parser.add_argument("models", nargs="*", default=MODELS)
    args = parser.parse_args(argv)
    changed = 0
    for model in args.models:
        if args.update:
            golden_path(model).write_text(serialise(generate(model)))
            print(f"wrote {golden_path(model).relative_to(REPO)}")
            continue
        lines = diff(model)
        changed += bool(lines)
        sys.stdout.writelines(lines)
        print(f"{model}: {'differs' if lines else 'same'}")
    return 1 if changed else 0


if __name__ == "__main__":
    sys.exit(main())
