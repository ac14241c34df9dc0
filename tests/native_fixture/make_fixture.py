"""Build tiny .aotpack archives by hand, without the aotpack compiler.

The archive holds the hand-written ``model.cpp`` next to this file (compiled with g++ against
``native/include`` only), a safetensors file with its constants and a manifest per
docs/archive.md. Variants (tampered bytes, unsafe entries, odd manifests) exercise the
runtime's refusals.

    /work/main/.venv/bin/python tests/native_fixture/make_fixture.py OUT_DIR

writes ``OUT_DIR/fixture_mlp-0.1.0.aotpack``, ``OUT_DIR/x.npy`` and ``OUT_DIR/expected.npz``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import safetensors.numpy
import torch
import zstandard

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))  # this checkout's archive paths, also when run as a script
from aotpack.archive import layout  # noqa: E402
MODEL_SOURCE = HERE / "model.cpp"

NAME, VERSION = "fixture_mlp", "0.1.0"
BATCH, IN, OUT = 4, 8, 16  # must match model.cpp


def compile_model(work_dir: Path) -> bytes:
    """Compile model.cpp into a shared object; returns its bytes."""
    work_dir.mkdir(parents=True, exist_ok=True)
    library = work_dir / "model.so"
    command = ["g++", "-O2", "-shared", "-fPIC", "-std=c++17", "-fvisibility=hidden",
               f"-I{REPO / 'native' / 'include'}", str(MODEL_SOURCE), "-o", str(library)]
    subprocess.run(command, check=True)
    return library.read_bytes()


def make_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """w: float32[8, 16] (stored row-major, laid out with strides [1, 8] at run time),
    b: float32[16], calls: int64[1]."""
    rng = np.random.default_rng(seed)
    return {
        "w": rng.standard_normal((IN, OUT)).astype(np.float32),
        "b": rng.standard_normal(OUT).astype(np.float32),
        "calls": np.zeros(1, dtype=np.int64),
    }


def spec(name: str, dtype: str, shape: list[int], strides: list[int]) -> dict:
    return {"name": name, "dtype": dtype, "shape": shape, "strides": strides}


def make_manifest(files: dict[str, bytes], **overrides) -> dict:
    """manifest.json content for `files` (path -> bytes); overrides replace top-level keys."""
    manifest = {
        "format_version": layout.FORMAT_VERSION,
        "name": NAME,
        "version": VERSION,
        "aotpack_version": "0.0.0+fixture",
        "torch_version": torch.__version__,
        "backend": "cpu",
        "target_isa": {"march": "x86-64", "features": ["sse2"]},
        "device_limit": 2,
        "model": {"library": layout.MODEL_LIBRARY_PATH, "source": layout.MODEL_SOURCE_PATH, "abi_version": 2},
        "constants": [
            spec("w", "float32", [IN, OUT], [1, IN]),
            spec("b", "float32", [OUT], [1]),
            spec("calls", "int64", [1], [1]),
        ],
        "inputs": [spec("x", "float32", [BATCH, IN], [IN, 1])],
        "outputs": [spec("y", "float32", [BATCH, OUT], [OUT, 1]),
                    spec("calls", "int64", [1], [1])],
        "mutated_buffers": ["calls"],
        "kernels": [],
        "files": {path: {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
                  for path, data in sorted(files.items())},
    }
    manifest.update(overrides)
    return manifest


def _tar_member(path: str, data: bytes) -> tuple[tarfile.TarInfo, io.BytesIO]:
    info = tarfile.TarInfo(path)
    info.size = len(data)
    info.mode = 0o755 if path.endswith(".so") else 0o644
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info, io.BytesIO(data)


def write_archive(path: Path, manifest: dict | bytes | None, files: dict[str, bytes],
                  extra_members: list[tarfile.TarInfo] = ()) -> Path:
    """Deterministic tar.zst: manifest.json and its manifest.sha256 first, then files sorted by path, then any
    `extra_members` (for hostile variants: links, devices...)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if manifest is not None:
            text = manifest if isinstance(manifest, bytes) else json.dumps(manifest, indent=2).encode()
            tar.addfile(*_tar_member(layout.MANIFEST_PATH, text))
            digest = (hashlib.sha256(text).hexdigest() + "\n").encode()
            tar.addfile(*_tar_member(layout.MANIFEST_DIGEST_PATH, digest))
        for name in sorted(files):
            tar.addfile(*_tar_member(name, files[name]))
        for member in extra_members:
            tar.addfile(member)
    path.write_bytes(zstandard.ZstdCompressor(level=19).compress(buffer.getvalue()))
    return path


def archive_files(model_so: bytes, weights: dict[str, np.ndarray]) -> dict[str, bytes]:
    return {
        layout.MODEL_LIBRARY_PATH: model_so,
        layout.MODEL_SOURCE_PATH: MODEL_SOURCE.read_bytes(),
        layout.WEIGHTS_PATH: safetensors.numpy.save(weights),
    }


def expected_outputs(x: np.ndarray, weights: dict[str, np.ndarray], runs: int = 1) -> dict:
    y = np.maximum(x @ weights["w"] + weights["b"], 0).astype(np.float32)
    return {"y": y, "calls": weights["calls"] + runs}


def build_fixture(out_dir: Path, model_so: bytes | None = None) -> dict:
    """The good archive plus an input and its expected outputs, all under out_dir."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model_so = model_so if model_so is not None else compile_model(out_dir / "build")
    weights = make_weights()
    files = archive_files(model_so, weights)
    archive = write_archive(out_dir / f"{NAME}-{VERSION}.aotpack", make_manifest(files), files)
    x = np.random.default_rng(1).standard_normal((BATCH, IN)).astype(np.float32)
    np.save(out_dir / "x.npy", x)
    expected = expected_outputs(x, weights)
    np.savez(out_dir / "expected.npz", **expected)
    return {"archive": archive, "x": out_dir / "x.npy", "x_array": x, "expected": expected,
            "files": files, "weights": weights, "model_so": model_so}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    fixture = build_fixture(args.out_dir)
    print(fixture["archive"])


if __name__ == "__main__":
    main()
