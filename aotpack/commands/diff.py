"""``aotpack diff A B``: what differs between two archives, like ``diff`` for builds.

Compared, from the manifests and the archives' contents:

- metadata: name, version, torch/aotpack versions, backend, target, device limit;
- signature: inputs and outputs (name, dtype, shape, strides);
- kernels: added / removed (by name), and for kernels in both the winner's
  ``kernel_key``, ``tiling_repr``, ``block_dim`` and ``workspace``;
- steps: the GEMM/conv steps (choice points other than kernels, by name) whose winning
  implementation differs;
- weights: tensors added / removed / changed, by a sha256 of each tensor's dtype, shape
  and bytes in ``weights/weights.safetensors``;
- files: entries added / removed / changed by the manifest's sha256 (the model library, kernels).

Also reported, but not making the archives "different" (they are measurements, not
content): the best autotune time of each common kernel and the size of the archives and
their entries. Exit status: 0 same, 1 different, 2 trouble (as ``diff``).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import safetensors

from aotpack.errors import AotpackError
from aotpack.archive.layout import WEIGHTS_PATH as WEIGHTS
from aotpack.archive.writer import read_manifest, read_members
from aotpack.tune.replay import choice_entries

METADATA = ("name", "version", "aotpack_version", "torch_version", "backend", "target_isa", "device_limit")
WINNER_FIELDS = ("kernel_key", "tiling_repr", "block_dim", "workspace")


def tensor_checksums(weights: bytes, where: str) -> dict[str, str]:
    """sha256 (hex) of each tensor of a safetensors file, over ``dtype|shape|`` + its bytes.

    Raises:
        AotpackError: the bytes are not a safetensors file.
    """
    try:
        tensors = safetensors.deserialize(weights)
    except Exception as exc:  # the Rust binding raises its own SafetensorError
        raise AotpackError(f"{where}: {WEIGHTS} is not a safetensors file: {exc}") from None
    sums = {}
    for name, info in tensors:
        digest = hashlib.sha256(f"{info['dtype']}|{list(info['shape'])}|".encode())
        digest.update(bytes(info["data"]))
        sums[name] = digest.hexdigest()
    return sums


def _added_removed_changed(a: dict, b: dict) -> dict[str, list[str]]:
    return {"added": sorted(set(b) - set(a)), "removed": sorted(set(a) - set(b)),
            "changed": sorted(k for k in set(a) & set(b) if a[k] != b[k])}


def _signature(entries: list[dict]) -> list[dict]:
    return [{k: e[k] for k in ("name", "dtype", "shape", "strides")} for e in entries]


def _best(kernel: dict) -> float | None:
    return min(kernel["timings_us"]) if kernel.get("timings_us") else None


def compare(a_path: str | Path, b_path: str | Path) -> dict:
    """The differences between archives A and B (see the module docstring), as a dict
    that ``--json`` prints; ``same`` is False when anything but timings and sizes differs.

    Raises:
        AotpackError: either archive is missing, unreadable or has no valid manifest.
    """
    a_path, b_path = Path(a_path), Path(b_path)
    ma, mb = read_manifest(a_path), read_manifest(b_path)
    fa, fb = read_members(a_path), read_members(b_path)
    metadata = {k: [ma.get(k), mb.get(k)] for k in METADATA if ma.get(k) != mb.get(k)}
    signature = {kind: {"a": _signature(ma[kind]), "b": _signature(mb[kind])}
                 for kind in ("inputs", "outputs") if _signature(ma[kind]) != _signature(mb[kind])}
    ka = {k["name"]: k for k in ma.get("kernels", [])}
    kb = {k["name"]: k for k in mb.get("kernels", [])}
    common = [name for name in ka if name in kb]
    changed = []
    for name in common:
        fields = {f: [ka[name].get(f), kb[name].get(f)] for f in WINNER_FIELDS
                  if ka[name].get(f) != kb[name].get(f)}
        if fields:
            changed.append({"name": name, **fields})
    timings = []
    for name in common:
        best_a, best_b = _best(ka[name]), _best(kb[name])
        if best_a is not None and best_b is not None:
            timings.append({"name": name, "a_us": best_a, "b_us": best_b,
                            "delta_us": round(best_b - best_a, 3),
                            "delta_pct": round(100 * (best_b - best_a) / best_a, 1) if best_a else None})
    weights = _added_removed_changed(tensor_checksums(fa.get(WEIGHTS, b""), str(a_path)) if WEIGHTS in fa else {},
                                     tensor_checksums(fb.get(WEIGHTS, b""), str(b_path)) if WEIGHTS in fb else {})
    files = _added_removed_changed({p: e["sha256"] for p, e in ma["files"].items()},
                                   {p: e["sha256"] for p, e in mb["files"].items()})
    sizes = {"archive": [a_path.stat().st_size, b_path.stat().st_size],
             "entries": [sum(e["size"] for e in ma["files"].values()),
                         sum(e["size"] for e in mb["files"].values())]}
    kernels = {"added": sorted(set(kb) - set(ka)), "removed": sorted(set(ka) - set(kb)), "changed": changed}
    steps = _step_winners(ma, mb)
    same = not (metadata or signature or kernels["added"] or kernels["removed"] or changed or steps
                or any(weights.values()) or any(files.values()))
    return {"same": same, "a": str(a_path), "b": str(b_path), "metadata": metadata,
            "signature": signature, "kernels": kernels, "steps": steps, "weights": weights, "files": files,
            "timings": timings, "sizes": sizes}


def _step_winners(ma: dict, mb: dict) -> list[dict]:
    """``[{"name", "winner": [a, b]}]`` of the steps in both archives whose winner differs."""
    sa, sb = ({c.get("name"): c.get("winner") for c in choice_entries(m) if c.get("kind") != "kernel"}
              for m in (ma, mb))
    return [{"name": name, "winner": [sa[name], sb[name]]} for name in sa if name in sb and sa[name] != sb[name]]


def _spec(entry: dict) -> str:
    return f"{entry['name']}: {entry['dtype']}{entry['shape']}"


def _delta(a: int, b: int) -> str:
    return f"{a} -> {b} bytes ({b - a:+d})"


def report(result: dict) -> list[str]:
    """Lines for a person: one per difference, then timings and sizes."""
    lines = [f"{'same' if result['same'] else 'different'}: {result['a']} vs {result['b']}"]
    for key, (a, b) in result["metadata"].items():
        lines.append(f"metadata {key}: {a!r} -> {b!r}")
    for kind, sides in result["signature"].items():
        lines.append(f"signature {kind}: ({', '.join(map(_spec, sides['a']))}) -> "
                     f"({', '.join(map(_spec, sides['b']))})")
    kernels = result["kernels"]
    for word in ("added", "removed"):
        if kernels[word]:
            lines.append(f"kernels {word}: {', '.join(kernels[word])}")
    for change in kernels["changed"]:
        fields = ", ".join(f"{f} {change[f][0]!r} -> {change[f][1]!r}" for f in WINNER_FIELDS if f in change)
        lines.append(f"winner {change['name']}: {fields}")
    for change in result["steps"]:
        lines.append(f"step {change['name']}: winner {change['winner'][0]!r} -> {change['winner'][1]!r}")
    for group in ("weights", "files"):
        for word in ("added", "removed", "changed"):
            if result[group][word]:
                lines.append(f"{group} {word}: {', '.join(result[group][word])}")
    for t in result["timings"]:
        pct = f", {t['delta_pct']:+.1f}%" if t["delta_pct"] is not None else ""
        lines.append(f"timing {t['name']}: best {t['a_us']:.2f} -> {t['b_us']:.2f} us "
                     f"({t['delta_us']:+.2f} us{pct})")
    lines.append(f"size archive: {_delta(*result['sizes']['archive'])}; entries: "
                 f"{_delta(*result['sizes']['entries'])}")
    return lines
