"""``aotpack verify``: can this machine trust and run this archive?

Each check prints one line:

1. files: the reading rules of docs/archive.md (``aotpack.archive.reader``): manifest digest,
   every entry's size and sha256, safe entries, the backend's check of every binary, the weights
   against the manifest's constants, all without executing archive code;
2. signature: checked against the trusted keys (``--trusted-key``/AOTPACK_TRUSTED_KEYS)
   when any are given, and then required; ``--require-signature``
   (AOTPACK_REQUIRE_SIGNATURE=1) fails without keys;
3. only with ``--run`` (this executes the archive's code): the native runtime loads it as
   a deployment would (torch version, target features, the model library and every kernel), runs the
   inputs stored by ``build --selftest`` and compares its outputs with the stored eager
   outputs (``aotpack.runtime.parity`` tolerances); an archive without a self-test fails ``--run``
   (there is nothing to compare), and is only noted without it.
"""
from __future__ import annotations

import time
from pathlib import Path

from aotpack.archive import manifest_rules, reader
from aotpack.archive import signing
from aotpack.errors import AotpackError
from aotpack.runtime.native import find_runtime_library
from aotpack.archive.layout import SELFTEST_INPUTS_PATH as SELFTEST_INPUTS
from aotpack.archive.layout import SELFTEST_OUTPUTS_PATH as SELFTEST_OUTPUTS


def selftest_files(inputs, outputs, output_names) -> dict[str, bytes]:
    """Archive entries holding the example inputs and eager outputs (contiguous copies)."""
    import safetensors.torch

    return {
        SELFTEST_INPUTS: safetensors.torch.save(
            {f"input_{i}": t.detach().contiguous().clone() for i, t in enumerate(inputs)}),
        SELFTEST_OUTPUTS: safetensors.torch.save(
            {name: t.detach().contiguous().clone() for name, t in zip(output_names, outputs)}),
    }


NO_SELFTEST_NOTE = "self-test: none stored (build with --selftest to include one)"
NO_SELFTEST_ERROR = ("self-test: none stored, so --run has nothing to compare the native outputs with; "
                     "rebuild with `aotpack build --selftest`")
NOT_RUN = ("load: not run, no archive code was executed (pass --run to load it natively "
           "and rerun its self-test)")


def verify(archive: str | Path, run: bool = False, trusted_keys: list[str] | None = None,
           require_signature: bool | None = None) -> list[str]:
    """Run the checks; returns report lines.

    Args:
        run: also load the archive natively and run its self-test (executes its code).
        trusted_keys: PEM public keys (default: $AOTPACK_TRUSTED_KEYS, which may not be set
            to name no key); when any are given, the archive must be signed by one of them.
        require_signature: fail unless trusted keys are given (default:
            $AOTPACK_REQUIRE_SIGNATURE), so an unsigned archive never passes.

    Raises:
        AotpackError: the first failed check, with the lines of the passed ones before it;
            with ``run``, also an archive without a stored self-test (built without
            ``--selftest``). Without ``run`` a missing self-test is only noted.
    """
    archive = Path(archive)
    keys = reader.trusted_keys_from_env() if trusted_keys is None else list(trusted_keys)
    required = signing.signature_required_from_env() if require_signature is None else require_signature
    if required and not keys:
        raise AotpackError(signing.NO_KEY_FOR_REQUIRED_SIGNATURE)
    wanted = {SELFTEST_INPUTS, SELFTEST_OUTPUTS} if run else set()
    report = reader.check(archive, trusted_keys=keys, keep=wanted.__contains__)
    manifest = report.manifest
    lines = [f"files: {report.files} entries match their sha256, the manifest its digest, "
             f"{manifest_rules.HOST_RULES.binary_check_phrase}"]
    if keys:  # reader.check verified it; this names the key, as aotpack-run -v does
        path, fingerprint = signing.verify_bytes(report.manifest_text, report.signature, keys)
        lines.append(f"signature: valid, key {path} (sha256 {fingerprint})")
    else:
        lines.append("signature: " + ("present, not checked (no trusted keys given)" if report.signature
                                      else "none (unsigned archive)"))
    if not run:
        if "selftest" not in manifest:
            lines.append(NO_SELFTEST_NOTE)
        lines.append(NOT_RUN)
        return lines
    from aotpack.runtime.loader import load

    find_runtime_library()  # a missing runtime is its own error, not a failed check
    started = time.perf_counter()
    try:  # one load and one run: the load line and the self-test come from the same model
        model = load(archive, trusted_keys=keys, require_signature=required)
    except AotpackError as exc:
        raise AotpackError("\n".join(lines + [str(exc)])) from None
    with model:
        lines.append(f"load: ok: {model.name} {model.version} (loaded in "
                     f"{(time.perf_counter() - started) * 1e3:.1f} ms)")
        if "selftest" not in manifest:
            raise AotpackError("\n".join(lines + [NO_SELFTEST_ERROR]))
        members = report.members
        if SELFTEST_INPUTS not in members or SELFTEST_OUTPUTS not in members:
            raise AotpackError("\n".join(lines + ["self-test: the manifest names one but its files are missing"]))
        import safetensors.torch  # torch is only needed to run the self-test

        from aotpack.runtime import parity

        stored = safetensors.torch.load(members[SELFTEST_INPUTS])  # a dict: order by name
        inputs = [stored[f"input_{i}"] for i in range(len(manifest["inputs"]))]
        expected = safetensors.torch.load(members[SELFTEST_OUTPUTS])
        outputs = model.run(*inputs)
    names = [o["name"] for o in manifest["outputs"]]
    tolerance = manifest["selftest"]
    if not isinstance(tolerance, dict):
        raise AotpackError("\n".join(lines + ["self-test: manifest.json 'selftest' is not an object"]))
    result = parity.compare(outputs, [expected[n] for n in names], atol=tolerance.get("atol", parity.ATOL),
                            rtol=tolerance.get("rtol", parity.RTOL))
    if not result.ok:
        raise AotpackError("\n".join(lines + ["self-test failed: " + "; ".join(result.problems)]))
    lines.append(f"self-test: {len(names)} outputs match eager PyTorch (max abs error "
                 f"{result.max_abs_error:.3g})")
    return lines
