"""Process replay: the generated C++ of pinned models equals the checked-in sources.

A failure prints the unified diff; if the change is deliberate, regenerate with
``python tests/golden/replay.py --update`` and say why in the commit.
"""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import replay  # noqa: E402



@pytest.mark.parametrize("model", replay.MODELS)
def test_generated_sources_match_golden(model):
    lines = replay.diff(model)
    assert not lines, "generated sources changed:\n" + "".join(lines[:200])


def test_the_render_does_not_depend_on_the_build_machine(monkeypatch):
    """The golden render asks no compiler for the target: a host whose -march probe reports
    AVX-512 renders the same sources."""
    from aotpack.backends.cpu import toolchain

    def avx512_host(march):
        return {"march": "sapphirerapids", "features": [*replay.TARGET["features"], "avx512f", "avx512bw"]}

    monkeypatch.setattr(toolchain, "target_isa", avx512_host)
    monkeypatch.setattr("aotpack.backends.cpu.target_isa", avx512_host)
    assert replay.pinned_backend().target(None) == replay.TARGET
    assert not replay.diff("tests/models/depthwise_zoo.py")
