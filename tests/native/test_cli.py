"""The aotpack command as a user meets it: inspect, run, messages."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from aotpack.archive import layout
from aotpack.archive.writer import read_manifest
from helpers import MODELS, assert_native_parity


def aotpack(*args, env=None):
    return subprocess.run([sys.executable, "-m", "aotpack", *map(str, args)], capture_output=True,
                          text=True, env=env)


def test_dict_outputs_are_named_by_their_keys(build_model, tmp_path):
    result = build_model(MODELS / "dict_outputs.py")
    assert [o["name"] for o in read_manifest(result.archive)["outputs"]] == ["logits", "aux.0", "aux.1"]
    assert_native_parity(result.archive, MODELS / "dict_outputs.py", tmp_path)


def test_inspect_lists_signature_kernels_and_checks_files(build_model):
    result = aotpack("inspect", build_model(MODELS / "dict_outputs.py").archive)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"dict_outputs 0.1.0  (format {layout.FORMAT_VERSION}, backend cpu, torch 2.13.0")
    assert "  input  x: float32[6]" in lines
    assert "  output aux.1: float32[]" in lines
    assert lines[-1].endswith("sizes and sha256 match the manifest")


def test_inspect_reports_a_modified_file(build_model, tmp_path):
    import io
    import tarfile

    import zstandard
    archive = build_model(MODELS / "dict_outputs.py").archive
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(archive.read_bytes()), read_across_frames=True).read()
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for member in src:
            data = src.extractfile(member).read()
            if member.name == layout.MODEL_SOURCE_PATH:
                data = data.replace(b"aotpack", b"AOTPACK", 1)
            dst.addfile(member, io.BytesIO(data))
    tampered = tmp_path / "tampered.aotpack"
    tampered.write_bytes(zstandard.ZstdCompressor().compress(out.getvalue()))
    result = aotpack("inspect", tampered)
    assert result.returncode == 1
    assert result.stdout.splitlines()[-1] == (
        f"  files: 1 problem(s): {tampered}: sha256 mismatch for '{layout.MODEL_SOURCE_PATH}' "
        "(the archive is corrupt or was modified)")


@pytest.mark.parametrize("content,message", [
    (None, "cannot read {path}: No such file or directory"),
    (b"garbage", "{path}: not zstd-compressed (an .aotpack archive is a zstd-compressed tar)"),
])
def test_inspect_bad_files_give_one_line(tmp_path, content, message):
    path = tmp_path / "x.aotpack"
    if content is not None:
        path.write_bytes(content)
    result = aotpack("inspect", path)
    assert result.returncode == 1
    assert result.stderr == f"aotpack: error: {message.format(path=path)}\n"


def test_run_writes_named_outputs(build_model, tmp_path):
    archive = build_model(MODELS / "dict_outputs.py").archive
    x = tmp_path / "x.npy"
    np.save(x, np.linspace(-1, 1, 6, dtype=np.float32))
    out = tmp_path / "out.npz"
    result = aotpack("run", archive, "--inputs", x, "--output", out)
    assert result.returncode == 0, result.stderr
    with np.load(out) as npz:
        assert npz.files == ["logits", "aux.0", "aux.1"]
        np.testing.assert_allclose(npz["logits"], np.linspace(-1, 1, 6) * 2, rtol=1e-6)


def test_runtime_override_must_exist(build_model, tmp_path):
    import os
    archive = build_model(MODELS / "dict_outputs.py").archive
    env = dict(os.environ, AOTPACK_RUNTIME_LIB=str(tmp_path / "missing"))
    result = aotpack("run", archive, "--inputs", tmp_path / "x.npy", env=env)
    assert result.returncode == 1
    assert result.stderr == (f"aotpack: error: AOTPACK_RUNTIME_LIB={tmp_path / 'missing'} is not a "
                             "file; point it at libaotpack_runtime.so or unset it\n")
    result = aotpack("verify", archive, "--run", env=env)  # verify --run loads in-process too
    assert result.returncode == 1
    assert result.stderr == (f"aotpack: error: AOTPACK_RUNTIME_LIB={tmp_path / 'missing'} is not a "
                             "file; point it at libaotpack_runtime.so or unset it\n")


def test_run_prints_outputs_and_benchmarks(build_model, tmp_path):
    archive = build_model(MODELS / "dict_outputs.py").archive
    x = tmp_path / "x.npy"
    np.save(x, np.linspace(-1, 1, 6, dtype=np.float32))
    result = aotpack("run", archive, "--inputs", x)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "logits: float32[6] = -2 -1.2 -0.4 0.4 1.2 2"
    result = aotpack("run", archive, "--inputs", x, "--bench", "5")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("load_ms=")
    assert re.fullmatch(r"latency_us median=[0-9.]+ p10=[0-9.]+ p90=[0-9.]+ runs=5", lines[1])
    result = aotpack("run", archive, "--inputs", x, x)
    assert result.returncode == 1
    assert result.stderr == ("aotpack: error: model 'dict_outputs' takes 1 input(s) (x: float32[6]), got 2 "
                             ".npy file(s)\n")  # aotpack-run's message


@pytest.mark.parametrize("version", ["01.2.3", "1.2", ""])
def test_versions_must_be_semantic(tmp_path, version):
    result = aotpack("build", MODELS / "dict_outputs.py", "-o", tmp_path, "--version", version)
    assert result.returncode == 1
    assert result.stderr == (f"aotpack: error: version {version!r} is not a semantic version; "
                             "use X.Y.Z, e.g. 1.0.0\n")


def test_module_instead_of_function_is_explained(tmp_path):
    path = tmp_path / "instance.py"
    path.write_text("import torch\nmodel = torch.nn.Linear(2, 2)\n"
                    "def example_inputs():\n    return (torch.ones(2),)\n")
    result = aotpack("build", path, "-o", tmp_path / "out")
    assert result.returncode == 1
    assert result.stderr == (f"aotpack: error: {path}: 'model' is a module instance, not a function; "
                             "write `def model() -> torch.nn.Module` that returns it\n")


def test_verify_reruns_the_stored_selftest(build_model):
    archive = build_model(MODELS / "dict_outputs.py", selftest=True).archive
    assert read_manifest(archive)["selftest"]["atol"] == 1e-4
    result = aotpack("verify", archive, "--run")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("files: ") and lines[0].endswith(
        " entries match their sha256, the manifest its digest, every .so passes the ELF check")
    assert lines[1] == "signature: none (unsigned archive)"
    assert lines[2].startswith("load: ok: dict_outputs 0.1.0")
    assert lines[3].startswith("self-test: 3 outputs match eager PyTorch (max abs error ")


def test_verify_does_not_run_archive_code_without_run(build_model):
    result = aotpack("verify", build_model(MODELS / "dict_outputs.py", selftest=True).archive)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == (
        "load: not run, no archive code was executed (pass --run to load it natively and rerun its self-test)")


def test_verify_run_without_selftest_fails_naming_selftest(build_model):
    result = aotpack("verify", build_model(MODELS / "dict_outputs.py").archive, "--run")
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith("aotpack: error: files: ")
    assert lines[2].startswith("load: ok: dict_outputs 0.1.0")
    assert lines[3:] == ["self-test: none stored, so --run has nothing to compare the native outputs with; "
                         "rebuild with `aotpack build --selftest`"]
    assert result.stdout == ""


def test_verify_without_run_notes_a_missing_selftest(build_model):
    result = aotpack("verify", build_model(MODELS / "dict_outputs.py").archive)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-2:] == [
        "self-test: none stored (build with --selftest to include one)",
        "load: not run, no archive code was executed (pass --run to load it natively and rerun its self-test)"]


def test_verify_without_run_does_not_mention_a_stored_selftest(build_model):
    result = aotpack("verify", build_model(MODELS / "dict_outputs.py", selftest=True).archive)
    assert not any(line.startswith("self-test") for line in result.stdout.splitlines())


def test_inspect_tables_choices_and_extern_calls(build_model):
    from aotpack.commands import report
    archive = build_model(MODELS / "branchy.py", topn=2).archive
    manifest = read_manifest(archive)
    result = aotpack("inspect", archive)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    start = lines.index("  5 fused kernel launches of 5 distinct kernels")
    # one table: the 5 kernels' tilings, then the untaken branch's x @ w, a bmm step (unvisited: ATen runs)
    assert lines[start + 1] == "  6 choice points (candidates timed by PGO):"
    assert lines[start + 2].split() == list(report.CHOICE_COLUMNS)
    rows = [line.split() for line in lines[start + 3:start + 9]]
    kernels, (step,) = manifest["choices"][:5], manifest["choices"][5:]
    assert [k["id"] for k in kernels] == [k["kernel_id"] for k in manifest["kernels"]]
    for row, kernel in zip(rows, manifest["kernels"]):
        timed = kernel["visited"]
        assert row[:5] == [kernel["name"], "kernel", "-", kernel["tiling_repr"], "2"]
        if timed:
            assert [float(row[5]), float(row[6])] == [round(min(kernel["timings_us"]), 2),
                                                      round(max(kernel["timings_us"]), 2)]
        state = "contended" if kernel["timing_contended"] else "ok"
        assert row[5:] == (row[5:7] + ["yes", state] if timed else ["-", "-", "no", "-"])
    assert [r[-2] for r in rows[:5]].count("no") == 2  # the branch the example inputs skip
    assert rows[5] == [step["name"], "bmm", step["shape"] + "+none", "aten", "2", "-", "-", "no", "-"]
    assert step["id"] == f"gemm:{step['name']}" and step["candidates"] == ["aten", "template"]
    rest = lines[start + 9:]
    if any(c["timing_contended"] for c in manifest["choices"]):  # a busy machine: one line says so
        assert rest.pop(0).startswith("  timing contended for ")
    assert rest[:3] == ["  1 extern call of 1 ATen op (not fused):",
                        "    op               count", "    aten.mm.default  1"]


def test_inspect_json_keeps_the_manifest_and_adds_the_report(build_model):
    import json
    archive = build_model(MODELS / "branchy.py", topn=2).archive
    result = aotpack("inspect", "--json", archive)
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    manifest = read_manifest(archive)
    assert {k: v for k, v in data.items() if k != "report"} == manifest
    derived = data["report"]
    assert (derived["launch_sites"], derived["distinct_kernels"]) == (5, 5)
    assert derived["extern_calls"] == [{"op": "aten.mm.default", "count": 1}]
    assert [c["choice"] for c in derived["choices"]] == [c["name"] for c in manifest["choices"]]
    assert [c["choice"] for c in derived["choices"]][:5] == [k["name"] for k in manifest["kernels"]]
    assert derived["choices"][0]["best_us"] == min(manifest["kernels"][0]["timings_us"])


def test_verify_fails_on_a_wrong_expected_output(build_model, tmp_path):
    import io
    import tarfile

    import safetensors.torch
    import torch
    import zstandard
    from aotpack.archive.writer import write_archive
    archive = build_model(MODELS / "dict_outputs.py", selftest=True).archive
    raw = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(archive.read_bytes()), read_across_frames=True)
    with tarfile.open(fileobj=io.BytesIO(raw.read())) as tar:
        files = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    manifest = read_manifest(archive)
    expected = safetensors.torch.load(files[layout.SELFTEST_OUTPUTS_PATH])
    expected["logits"] = expected["logits"] + torch.tensor([0, 0, 1.0, 0, 0, 0])
    files[layout.SELFTEST_OUTPUTS_PATH] = safetensors.torch.save(expected)
    del files[layout.MANIFEST_PATH], files[layout.MANIFEST_DIGEST_PATH], manifest["files"]
    resigned = write_archive(tmp_path / "resigned.aotpack", manifest, files)  # checksums consistent
    result = aotpack("verify", resigned, "--run")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "self-test failed: output 0: 1 elements off, max abs error 1 (tolerance 0.0001 + 0.0001*|eager|)")


def test_build_reports_its_phases_and_their_times(tmp_path):
    result = aotpack("build", MODELS / "small_cnn.py", "-o", tmp_path, "--topn", "2",
                     env=dict(os.environ, AOTPACK_CACHE_DIR=str(tmp_path / "cache")))
    assert result.returncode == 0, result.stderr
    for line in ["aotpack: exporting small_cnn.py (torch.export) ...", "aotpack: compiling candidates ...",
                 "aotpack: autotuning on the real inputs (PGO) ...",
                 "aotpack: writing the archive and running it natively ..."]:
        assert line in result.stderr.splitlines()
    assert "fused kernel launches of" in result.stderr and "extern calls" in result.stderr
    assert "Timing" not in result.stderr  # per-candidate lines only with -v
    out = result.stdout.splitlines()
    assert out[0] == "phase times:" and out[-1] == str(tmp_path / "small_cnn-0.1.0.aotpack")
    phases = [line.split()[0] for line in out[1:-1]]
    assert phases == ["export", "lower", "compile_kernels", "autotune", "compile_model_so",
                      "package_and_native_check", "total"]
    verbose = aotpack("-v", "build", MODELS / "small_cnn.py", "-o", tmp_path / "v", "--topn", "2", "--retune",
                      env=dict(os.environ, AOTPACK_CACHE_DIR=str(tmp_path / "cache")))
    assert "Timing" in verbose.stderr
