"""--tuning-from replays recorded winners without timing anything; --require-coverage names
the kernels the real inputs never reach."""
import logging

import pytest

from aotpack.build import build
from aotpack.config import Settings
from aotpack.errors import AotpackError
from aotpack.archive.writer import read_manifest
from helpers import MODELS, SAMPLES, assert_native_parity



def test_tuning_from_replays_the_winners_with_zero_timing_runs(tmp_path, caplog):
    model = SAMPLES / "transformer_block.py"
    old = build(model, tmp_path / "old", settings=Settings.from_env(topn=3, cache_dir=tmp_path / "a"))
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="aotpack"):
        new = build(model, tmp_path / "new", settings=Settings.from_env(
            topn=3, cache_dir=tmp_path / "b", tuning_from=old.archive))
    assert "Timing" not in caplog.text and "Autotune completed" not in caplog.text
    before = {k["name"]: (k["kernel_id"], k["kernel_key"]) for k in read_manifest(old.archive)["kernels"]}
    after = read_manifest(new.archive)
    assert {k["name"]: (k["kernel_id"], k["kernel_key"]) for k in after["kernels"]} == before
    assert after["tuning_from"] == {"archive": old.archive.name, "replayed": len(before)}
    assert_native_parity(new.archive, model, tmp_path / "run")


def test_tuning_from_needs_an_archive(tmp_path):
    with pytest.raises(AotpackError, match="cannot read"):
        build(SAMPLES / "mlp.py", tmp_path / "out", settings=Settings.from_env(
            topn=2, cache_dir=tmp_path / "c", tuning_from=tmp_path / "missing.aotpack"))


def test_require_coverage_names_the_unvisited_kernels(tmp_path):
    settings = Settings.from_env(topn=1, cache_dir=tmp_path / "cache", require_coverage=True)
    plain = build(MODELS / "branchy.py", tmp_path / "plain", settings=Settings.from_env(
        topn=1, cache_dir=tmp_path / "cache"))
    unvisited = [k["name"] for k in read_manifest(plain.archive)["kernels"] if not k["visited"]]
    assert unvisited
    with pytest.raises(AotpackError) as info:
        build(MODELS / "branchy.py", tmp_path / "strict", settings=settings)
    assert str(info.value) == (
        f"{MODELS / 'branchy.py'}: --require-coverage: {len(unvisited)} kernel(s) not reached by the example "
        f"and calibration inputs: {', '.join(unvisited)}; add calibration_inputs() that take those paths "
        "(e.g. both torch.cond branches), or drop --require-coverage")
    assert not (tmp_path / "strict").exists() or not list((tmp_path / "strict").iterdir())
