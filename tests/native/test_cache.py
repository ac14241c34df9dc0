"""Kernel cache: its documented layout, hits skip compile and profiling, archives reproduce."""
import json
import logging

from aotpack.backends.cpu.toolchain import CpuToolchain
from aotpack.build import build
from aotpack.config import Settings
from aotpack.archive import layout
from aotpack.archive.writer import read_manifest, read_members
from helpers import MODELS, SAMPLES


def test_second_build_hits_cache_and_reproduces_archive(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    settings = Settings.from_env(topn=3, cache_dir=tmp_path / "cache")
    first = build(SAMPLES / "mlp.py", tmp_path / "a", settings=settings)
    assert first.compiled > 0
    caplog.clear()
    compiles = []
    monkeypatch.setattr(CpuToolchain, "_compile", lambda self, source, output, kind: compiles.append(kind))
    with caplog.at_level(logging.INFO, logger="aotpack"):
        second = build(SAMPLES / "mlp.py", tmp_path / "b", settings=settings)
    assert second.compiled == 0 and compiles == []  # model.so too comes from the cache
    assert len(list((tmp_path / "cache" / "cpu" / "models").glob("*/lib.so"))) == 1
    assert "Timing" not in caplog.text and "Autotune completed" not in caplog.text
    assert first.archive.read_bytes() == second.archive.read_bytes()


def test_cache_layout_is_the_documented_one(tmp_path):
    cache = tmp_path / "cache"
    result = build(SAMPLES / "mlp.py", tmp_path / "out", settings=Settings.from_env(topn=3, cache_dir=cache))
    manifest = read_manifest(result.archive)
    for kernel in manifest["kernels"]:
        base = kernel["name"].rsplit("_", 1)[0]
        (folder,) = (cache / "cpu" / base).iterdir()
        assert (folder / "compile.lock").exists()
        assert (folder / "wrapper.so").is_file()
        keys = sorted(p.name for p in (folder / "static_kernel").iterdir())
        assert len(keys) == kernel["candidates"]
        assert all((folder / "static_kernel" / k / "kernel.so").is_file() for k in keys)
        assert not (folder / "optimize_tiling").exists()  # the choice is a tuning record, not a kernel file
    # one tuning record per timed choice point (the shipped ones, and the kernels of GEMM variants
    # that lost), kernels and GEMM steps alike, winner by name
    records = [json.loads(p.read_text()) for p in (cache / "cpu" / "choices").glob("*.json")]
    timed = [c for c in manifest["choices"] if c["timings_us"]]
    recorded = {(r["id"], r["winner"], tuple(r["timings_us"])) for r in records}
    assert timed and {(c["id"], c["winner"], tuple(c["timings_us"])) for c in timed} <= recorded
    assert all(set(r) == {"id", "candidates", "winner", "timings_us", "contended"} for r in records)


def test_device_limit_is_part_of_the_cache_key_and_bounds_block_dim(tmp_path):
    cache = tmp_path / "cache"
    one = build(SAMPLES / "mlp.py", tmp_path / "one",
                settings=Settings.from_env(topn=3, cache_dir=cache, device_limit="1"))
    manifest = read_manifest(one.archive)
    assert manifest["device_limit"] == 1
    assert all("block_dim=1;" in t for k in manifest["kernels"] for t in k["candidate_tilings"])
    again = build(SAMPLES / "mlp.py", tmp_path / "again",
                  settings=Settings.from_env(topn=3, cache_dir=cache, device_limit="1"))
    assert again.compiled == 0  # same limit: same key, a cache hit
    # the limit alone changes the key (static kernels are tuned for a core count)
    from aotpack.tune.cache import artifact_hash
    assert artifact_hash("kernel", "toolchain", 1) != artifact_hash("kernel", "toolchain", 2)


def test_concurrent_builds_share_the_cache_safely(tmp_path):
    """Two processes building the same model at once: compile.lock serialises them,
    both archives are written, and they agree on every winner."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, AOTPACK_CACHE_DIR=str(tmp_path / "cache"), SOURCE_DATE_EPOCH="0")
    procs = [subprocess.Popen([sys.executable, "-m", "aotpack", "-q", "build", str(SAMPLES / "mlp.py"),
                               "-o", str(tmp_path / f"out{i}"), "--topn", "2"],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(2)]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    manifests = [read_manifest(tmp_path / f"out{i}" / "mlp-0.1.0.aotpack") for i in range(2)]
    assert [k["kernel_key"] for k in manifests[0]["kernels"]] == [k["kernel_key"] for k in manifests[1]["kernels"]]


def test_untaken_branch_is_not_cached_as_tuned(tmp_path, caplog):
    """A kernel the example inputs never reach keeps candidate 0 in that archive only: a
    later build whose inputs do reach it times it (nothing was cached for it)."""
    from helpers import MODELS

    settings = Settings.from_env(topn=2, cache_dir=tmp_path / "cache")
    negative = build(MODELS / "branchy.py", tmp_path / "neg", settings=settings)
    unvisited = [k for k in read_manifest(negative.archive)["kernels"] if not k["visited"]]
    assert unvisited and all(k["timings_us"] == [] for k in unvisited)
    positive_model = tmp_path / "branchy_positive.py"
    positive_model.write_text((MODELS / "branchy.py").read_text().replace(
        "(-torch.rand(4, 4, generator=g)", "(torch.rand(4, 4, generator=g)"))
    with caplog.at_level(logging.INFO, logger="aotpack"):
        positive = build(positive_model, tmp_path / "pos", settings=settings)
    kernels = {k["name"]: k for k in read_manifest(positive.archive)["kernels"]}
    for k in unvisited:
        assert kernels[k["name"]]["visited"] and len(kernels[k["name"]]["timings_us"]) == 2
    assert "native runtime vs eager PyTorch: max abs error" in caplog.text


def test_tiny_kernels_compile_only_their_default(tmp_path):
    """mobilenet_block.py's kernels (13x13 images) are all tiny: at the default bound each
    compiles one candidate. At the suite's bound (0) each gets its TopN."""
    settings = Settings.from_env(topn=3, cache_dir=tmp_path / "cache", tiny_kernel_us="10")
    result = build(MODELS / "mobilenet_block.py", tmp_path / "out", settings=settings)
    kernels = read_manifest(result.archive)["kernels"]
    assert all(k["candidates"] == 1 and k["timings_us"] == [] for k in kernels)  # one candidate: nothing to time
    full = build(MODELS / "mobilenet_block.py", tmp_path / "full",
                 settings=Settings.from_env(topn=3, cache_dir=tmp_path / "c2"))
    assert all(k["candidates"] == 3 for k in read_manifest(full.archive)["kernels"])  # the suite's bound is 0


def test_archive_ships_the_pgo_wrapper_of_every_kernel(tmp_path):
    """The wrapper PGO launched through is the archive's wrapper, byte for byte: it lists
    every candidate's TilingInfo, the archive holds the winner's kernel.so only, and the
    build compiles no second wrapper."""
    cache = tmp_path / "cache"
    result = build(MODELS / "mobilenet_block.py", tmp_path / "out",
                   settings=Settings.from_env(topn=3, cache_dir=cache))
    members = read_members(result.archive)
    for k in read_manifest(result.archive)["kernels"]:
        pgo = [w.read_bytes() for w in cache.glob("cpu/*/*/wrapper.so")
               if (w.parent / "static_kernel" / k["kernel_key"]).is_dir()]
        assert members[layout.wrapper_path(k["name"])] in pgo
        source = members[layout.wrapper_source_path(k["name"])].decode()
        assert len(k["candidate_tilings"]) == 3 and all(f'|{t}|' in source for t in k["candidate_tilings"])
        assert sorted(p for p in members if p.startswith(f"kernels/{k['name']}/static_kernel/")) == sorted([
            k["lib_kernel"], layout.lib_kernel_source_path(k["name"], k["kernel_key"])])
    assert not list(cache.glob("cpu/*/*/ship"))


def test_model_library_key_covers_the_headers_model_cpp_includes(tmp_path, monkeypatch):
    """model.so is cached by model.cpp's text, the compiler, its flags and the headers it
    includes: an ABI header edited without a new model.cpp gets a new key."""
    from aotpack.backends.cpu import toolchain
    headers = tmp_path / "include"
    headers.mkdir()
    (headers / "model_abi.h").write_text("#define AOTPACK_MODEL_ABI_VERSION 1\n")
    monkeypatch.setattr(toolchain, "include_dir", lambda: headers)
    chain = CpuToolchain("native")
    before = chain.model_fingerprint()
    assert before == chain.model_fingerprint()
    (headers / "model_abi.h").write_text("#define AOTPACK_MODEL_ABI_VERSION 2\n")
    assert chain.model_fingerprint() != before


def test_one_compile_thread_runs_one_compiler_at_a_time(tmp_path, monkeypatch):
    """AOTPACK_COMPILE_THREADS=1 (debugging): every compile, model.so included, runs alone."""
    import threading
    running, most, kinds, lock = [0], [0], [], threading.Lock()
    original = CpuToolchain._compile

    def counted(self, source, output, kind):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            kinds.append(kind)
        try:
            original(self, source, output, kind)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(CpuToolchain, "_compile", counted)
    monkeypatch.setenv("AOTPACK_COMPILE_THREADS", "1")
    settings = Settings.from_env(topn=3, cache_dir=tmp_path / "cache")
    build(SAMPLES / "mlp.py", tmp_path / "out", settings=settings)
    assert most[0] == 1 and kinds.count("model") == 1 and kinds.count("kernel") > 1


def test_jobs_with_one_source_compile_once(tmp_path):
    """Candidates sharing a binary (Backend.share_binaries) are jobs with equal sources: the
    first compiles into the binary store, the others link to it after the parallel pool."""
    import time
    from threading import Lock
    from aotpack.tune import cache
    from aotpack.tune.compile import run_parallel
    compiled, lock = [], Lock()

    def compile_fn(source, output):
        with lock:
            compiled.append(source)
        time.sleep(0.2)  # long enough that two threads would start the same source together
        output.write_bytes(b"binary of " + source.read_bytes())

    store = cache.BinaryStore(tmp_path / "binaries", "fingerprint", ".so", ".cpp")
    jobs = [(compile_fn, tmp_path / f"k{i}" / "kernel.cpp", "same source", tmp_path / f"k{i}" / "kernel.so", True)
            for i in range(3)]
    jobs.append((compile_fn, tmp_path / "k3" / "kernel.cpp", "other source", tmp_path / "k3" / "kernel.so", True))
    done = []
    assert run_parallel(jobs, store, threads=2, on_done=lambda d, total: done.append((d, total))) == 2
    assert len(compiled) == 2
    assert [(tmp_path / f"k{i}" / "kernel.so").read_bytes() for i in range(4)] == [b"binary of same source"] * 3 + [
        b"binary of other source"]
    assert done[-1] == (4, 4)
