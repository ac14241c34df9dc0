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
