"""A sample of the hostile corpus (tests/hostile_corpus.py) against the native runtime and
`aotpack verify`, under address-space limits: no signal, no hang, nothing left behind, both
readers agreeing, every manifest edit refused. `make fuzz` runs the whole corpus (~600
archives) on a real sample model."""
from __future__ import annotations

import pytest

import hostile_corpus as hc
from conftest import MODELS

pytestmark = pytest.mark.native

SAMPLE_EVERY = 12  # ~50 of ~600 cases: under a minute on 2 cores


def test_corpus_is_large_and_varied(build_model):
    archive = build_model(MODELS / "dict_outputs.py").archive.read_bytes()
    names = [case.name for case in hc.corpus(archive)]
    assert len(names) >= 500 and len(set(names)) == len(names)
    for kind in ("truncate-", "bitflip-", "overwrite-", "tar-overwrite-", "entry-", "elf-truncate-",
                 "manifest-edit-", "manifest-bad-", "bomb-", "declared-", "many-", "weights-"):
        assert any(n.startswith(kind) for n in names), kind


def test_corpus_sample_fails_cleanly_everywhere(build_model):
    import itertools

    archive = build_model(MODELS / "dict_outputs.py").archive.read_bytes()
    sample = itertools.islice(hc.corpus(archive), 0, None, SAMPLE_EVERY)
    must = [c for c in hc.corpus(archive) if c.name.startswith(("manifest-edit-", "elf-", "bomb-"))][::4]
    result = hc.run_corpus(itertools.chain(sample, must), log=lambda line: None)
    assert result["cases"] >= 50
    assert result["problems"] == {}
