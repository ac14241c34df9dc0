"""``aotpack verify``: can this machine trust and run this archive?

Three checks, each printed as one line:

1. files: every entry's size and sha256 against the manifest (Python side);
2. load: the native runtime opens it as a deployment would (checksums again, torch
   version, CPU features of the target ISA, model.so and every kernel's wrapper);
3. self-test, when the archive was built with ``--selftest``: the native runtime runs
   the stored example inputs in-process (``aotpack.load``) and its outputs are compared
   with the stored eager outputs (``aotpack.parity`` tolerances).
"""
from __future__ import annotations

import subprocess
from pathlib import Path

import safetensors.torch

from aotpack import parity
from aotpack.errors import AotpackError
from aotpack.layout import SELFTEST_INPUTS_PATH, SELFTEST_OUTPUTS_PATH
from aotpack.package import read_manifest, read_members, verify_files
from aotpack.runtime import find_runtime


def selftest_files(inputs, outputs, output_names) -> dict[str, bytes]:
    """Archive entries holding the example inputs and eager outputs (contiguous copies)."""
    return {
        SELFTEST_INPUTS_PATH: safetensors.torch.save(
            {f"input_{i}": t.detach().contiguous().clone() for i, t in enumerate(inputs)}),
        SELFTEST_OUTPUTS_PATH: safetensors.torch.save(
            {name: t.detach().contiguous().clone() for name, t in zip(output_names, outputs)}),
    }


def verify(archive: str | Path) -> list[str]:
    """Run the checks; returns report lines.

    Raises:
        AotpackError: the first failed check, with the lines of the passed ones before it.
    """
    archive = Path(archive)
    lines = []
    members = read_members(archive)
    problems = verify_files(archive, members)
    if problems:
        raise AotpackError(f"{archive}: files: " + "; ".join(problems))
    manifest = read_manifest(archive)
    lines.append(f"files: {len(manifest['files'])} entries match their sha256")
    check = subprocess.run([str(find_runtime()), str(archive), "--check"], capture_output=True, text=True)
    if check.returncode != 0:
        raise AotpackError("\n".join(lines + [check.stderr.strip().removeprefix("aotpack-run: error: ")]))
    lines.append(f"load: {check.stdout.strip()}")
    if "selftest" not in manifest:
        lines.append("self-test: none stored (build with --selftest to include one)")
        return lines
    stored = safetensors.torch.load(members[SELFTEST_INPUTS_PATH])  # a dict: order by name
    inputs = [stored[f"input_{i}"] for i in range(len(manifest["inputs"]))]
    expected = safetensors.torch.load(members[SELFTEST_OUTPUTS_PATH])
    from aotpack.loader import load

    with load(archive) as model:
        outputs = model.run(*inputs)
    names = [o["name"] for o in manifest["outputs"]]
    tolerance = manifest["selftest"]
    result = parity.compare(outputs, [expected[n] for n in names], atol=tolerance.get("atol", parity.ATOL),
                            rtol=tolerance.get("rtol", parity.RTOL))
    if not result.ok:
        raise AotpackError("\n".join(lines + ["self-test failed: " + "; ".join(result.problems)]))
    lines.append(f"self-test: {len(names)} outputs match eager PyTorch (max abs error "
                 f"{result.max_abs_error:.3g})")
    return lines
