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
    # the convolution templates: Winograd (small_cnn), depthwise and its channels layout
    # (depthwise_zoo), the direct and lanes layouts, strided and dilated (conv_bn_block, mobilenet_block)
    "tests/models/small_cnn.py", "tests/models/depthwise_zoo.py", "tests/models/conv_bn_block.py",
    "tests/models/mobilenet_block.py",
]
#: Candidates depend on the device limit: pin it so the sources do not depend on the host.
DEVICE_LIMIT = 4
#: The templates' vector width follows the target ISA: pin an AVX2 one (``vector_bytes`` 32).
TARGET_ISA = "x86-64-v3"
#: What ``CpuBackend.target`` reports for ``TARGET_ISA``, fixed here: the render asks no
#: compiler, so neither the build machine's ISA nor its compiler's -march table enters it.
TARGET = {"march": TARGET_ISA, "features": ["avx", "avx2", "bmi", "bmi2", "f16c", "fma", "popcnt", "sse", "sse2",
                                            "sse3", "sse4.1", "sse4.2", "ssse3"]}
SEPARATOR = "==== "


def pinned_backend():
    """The CPU backend with its target fixed to ``TARGET`` (the limits, the cost model and the
    templates' vector width all read ``target``)."""
    from aotpack.backends.cpu import CpuBackend

    class PinnedTarget(CpuBackend):
        def target(self, settings) -> dict:
            return TARGET

    return PinnedTarget()


def generate(model: str) -> dict[str, str]:
    """Archive-relative path -> generated source, for one model file (no compiler run)."""
    from aotpack.tune import candidates
    from aotpack.codegen import wrapper as codegen
    from aotpack.archive import layout
    from aotpack.ir import gemm
    from aotpack.tune.autotune import Choice
    from aotpack.config import Settings
    from aotpack.frontend.export import export_model, load_model_file
    from aotpack.lower.lowering import lower

    backend = pinned_backend()
    # every candidate of the space is pinned, tiny kernels and those estimated far behind too
    settings = Settings(topn=10, device_limit=DEVICE_LIMIT, backend="cpu", target_isa=TARGET_ISA, tiny_kernel_us=0,
                        far_behind_factor=0)
    graph = lower(export_model(load_model_file(REPO / model)), backend)
    sets = candidates.prepare(graph, backend, settings)
    sources = {}
    for cs in sets.values():
        for candidate, text in zip(cs.candidates, cs.sources):
            sources[layout.lib_kernel_source_path(cs.kernel.name, candidate.kernel_key)] = text
        sources[layout.wrapper_source_path(cs.kernel.name)] = cs.wrapper_source
    choices = {kid: Choice(0, (), True, False) for kid in sets}  # candidate 0 wins
    meta = {"name": Path(model).stem, "version": "0.1.0", "aotpack_version": "golden",
            "device_limit": DEVICE_LIMIT}
    sources[layout.MODEL_SOURCE_PATH] = codegen.generate(gemm.resolve(graph, choices), backend, sets, choices, meta)
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
