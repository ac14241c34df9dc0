"""Settings: the TopN and device-limit rules, with their exact messages."""
import logging

import pytest

from aotpack.config import MAX_TOPN, Settings, available_cores, parse_device_limit, parse_topn
from aotpack.errors import AotpackError



def test_topn_accepts_positive_integers():
    assert parse_topn("3") == 3
    assert parse_topn(1) == 1


@pytest.mark.parametrize("raw", ["abc", "2.5", ""])
def test_topn_rejects_non_integers(raw):
    with pytest.raises(AotpackError) as err:
        parse_topn(raw)
    assert str(err.value) == f"AOTPACK_AUTOTUNE_TOPN must be a positive integer, got {raw!r}"


@pytest.mark.parametrize("raw", ["0", "-2"])
def test_topn_rejects_values_below_one(raw):
    with pytest.raises(AotpackError) as err:
        parse_topn(raw)
    assert str(err.value) == f"AOTPACK_AUTOTUNE_TOPN must be >= 1, got {int(raw)}"


def test_topn_above_max_warns_and_clamps(caplog):
    with caplog.at_level(logging.WARNING, logger="aotpack"):
        assert parse_topn("25") == MAX_TOPN
    assert "AOTPACK_AUTOTUNE_TOPN=25 exceeds the maximum of 10 candidates; using 10" in caplog.text


def test_env_topn_is_read_and_flag_wins(monkeypatch):
    monkeypatch.setenv("AOTPACK_AUTOTUNE_TOPN", "4")
    assert Settings.from_env().topn == 4
    assert Settings.from_env(topn="2").topn == 2


def test_device_limit_is_bounded_by_available_cores():
    assert parse_device_limit(None) == available_cores()
    assert parse_device_limit("1") == 1
    assert parse_device_limit(str(available_cores() + 7)) == available_cores()
    with pytest.raises(AotpackError, match="must be >= 1"):
        parse_device_limit("0")


def test_npu_backend_without_torch_npu_is_a_clear_error():
    with pytest.raises(AotpackError) as err:
        Settings.from_env(backend="npu")
    assert str(err.value) == ("backend 'npu' needs torch_npu and CANN >= 9.1.0 on an Ascend NPU "
                              "(pip install 'aotpack[npu]'); use --backend cpu here")


def test_unknown_backend():
    with pytest.raises(AotpackError, match="unknown backend 'gpu'; choose one of cpu, npu"):
        Settings.from_env(backend="gpu")
