"""aotpack: ship a PyTorch model as a versioned archive that a C++ runtime runs.

Commands: build (export, fuse, autotune, package), run (the native runtime), inspect
(manifest and autotune report), verify (reading rules, signature; with --run native load
and stored self-test), diff (compare two archives), sign (Ed25519-sign an archive), keygen
(make a signing key pair), cache (list or prune the runtime's extraction cache),
serve (aotpack-serve: a model repository over HTTP).
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from aotpack import backends
from aotpack.runtime import extraction_cache as runtime_cache
from aotpack.config import Settings
from aotpack.errors import AotpackError

log = logging.getLogger("aotpack")


def _parser(backend_flags: bool = True) -> argparse.ArgumentParser:
    """The command line; ``backend_flags``: with the backends' own build flags (importing
    every backend, seconds: only where the build command needs them)."""
    parser = argparse.ArgumentParser(prog="aotpack", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also every candidate's timing during autotune; with run, the signature line")
    parser.add_argument("--traceback", action="store_true", help="show Python tracebacks of internal errors")
    sub = parser.add_subparsers(dest="command", required=True)

    b = sub.add_parser("build", help="export, fuse, autotune and package a model file")
    b.add_argument("model", help="model file defining model() and example_inputs(), or a "
                                 "torch.export.save .pt2 file (with --inputs)")
    b.add_argument("--inputs", dest="inputs_path", metavar="INPUTS.pt",
                   help="for a .pt2: torch.save'd tuple of example inputs, or a list of tuples "
                        "(example set, then calibration sets)")
    b.add_argument("-o", "--output-dir", default="dist", help="where the archive goes (default: dist)")
    b.add_argument("--name", help="archive name (default: the model file's stem)")
    b.add_argument("--version", help="semantic version X.Y.Z (default: the file's __version__ or 0.1.0)")
    b.add_argument("--topn", help="candidate tilings per kernel, 1-10 (env AOTPACK_AUTOTUNE_TOPN, default 1)")
    b.add_argument("--cost-model", action="store_true", default=None,
                   help="rank the solver's whole space (up to 10 tilings) with the cost model and "
                        "compile only the best --cost-model-ratio of it, at most --topn (env AOTPACK_COSTMODEL=1)")
    b.add_argument("--cost-model-ratio", metavar="R",
                   help="share of the space the cost model keeps, in (0, 1] (env AOTPACK_COSTMODEL_RATIO, default 0.25)")
    b.add_argument("--tiny-kernel-us", metavar="US",
                   help="a kernel whose default tiling is estimated under US microseconds compiles only "
                        "that default; 0: every kernel gets --topn (env AOTPACK_TINY_KERNEL_US, default 10)")
    b.add_argument("--far-behind-factor", metavar="F",
                   help="a template candidate (GEMM, convolution, Winograd, bmm) whose estimate is at "
                        "least F times its kernel's best is dropped before compiling; 0: off "
                        "(env AOTPACK_FAR_BEHIND_FACTOR, default 1.4)")
    b.add_argument("--device-limit", help="cores the kernels may use (env AOTPACK_DEVICE_LIMIT)")
    if backend_flags:
        backends.build_options(b)
    b.add_argument("--backend", help="kernel backend: cpu (default) or npu (env AOTPACK_BACKEND)")
    b.add_argument("--cache-dir", help="kernel cache (env AOTPACK_CACHE_DIR)")
    b.add_argument("--debug-dir", help="keep generated sources here (env AOTPACK_DEBUG=1)")
    b.add_argument("--retune", action="store_true",
                   help="ignore cached autotune results (the tuning records) and time again")
    b.add_argument("--allow-mismatch", action="store_true",
                   help="write the archive even if outputs differ from eager PyTorch")
    b.add_argument("--selftest", action="store_true",
                   help="store example inputs and eager outputs so `aotpack verify` can re-check them")
    b.add_argument("--sign", metavar="KEY.pem", help="sign the archive with this Ed25519 private key")
    b.add_argument("--tuning-from", metavar="OLD.aotpack",
                   help="replay the winners recorded in an earlier archive of this model (no profiling)")
    b.add_argument("--require-coverage", action="store_true",
                   help="fail if a kernel is not reached by the example and calibration inputs")

    r = sub.add_parser("run", help="run an archive with the native runtime, in-process (aotpack.load)")
    r.add_argument("archive")
    r.add_argument("--inputs", nargs="+", required=True, help=".npy files, one per model input")
    r.add_argument("--output", help="write outputs to this .npz")
    r.add_argument("--bench", type=int, default=0, help="time N runs and print latency")
    r.add_argument("--device-limit", type=int, default=0)
    r.add_argument("--trusted-key", action="append", default=[], metavar="PUB.pem",
                   help="require a signature by this public key (repeatable; adds to AOTPACK_TRUSTED_KEYS)")
    r.add_argument("--require-signature", action="store_true",
                   help="refuse unless trusted keys are set (env AOTPACK_REQUIRE_SIGNATURE=1)")
    r.add_argument("-v", "--verbose", dest="show_signature", action="store_true",
                   help="first print whether the archive was signed and by which key (as aotpack-run -v)")

    v = sub.add_parser("verify", help="check an archive without running it; --run also loads it and reruns its self-test")
    v.add_argument("archive")
    v.add_argument("--run", action="store_true",
                   help="also load it with the native runtime and run its self-test (executes archive code)")
    v.add_argument("--trusted-key", action="append", default=[], metavar="PUB.pem",
                   help="require a signature by this public key (repeatable; adds to AOTPACK_TRUSTED_KEYS)")
    v.add_argument("--require-signature", action="store_true",
                   help="fail unless trusted keys are set (env AOTPACK_REQUIRE_SIGNATURE=1)")

    s = sub.add_parser("sign", help="sign an archive in place with an Ed25519 private key")
    s.add_argument("archive")
    s.add_argument("--key", required=True, metavar="KEY.pem", help="PEM private key (see `aotpack keygen`)")

    k = sub.add_parser("keygen", help="create an Ed25519 key pair for signing archives")
    k.add_argument("private_key", metavar="KEY.pem", help="where the private key goes (mode 0600)")
    k.add_argument("--public", metavar="PUB.pem", help="where the public key goes (default KEY.pub.pem)")

    d = sub.add_parser("diff", help="compare two archives (exit 0 same, 1 different, 2 trouble)")
    d.add_argument("a", metavar="A")
    d.add_argument("b", metavar="B")
    d.add_argument("--json", action="store_true", help="print the differences as JSON")

    sub.add_parser("serve", add_help=False,
                   help="serve a model repository over HTTP with the KServe v2 protocol: runs the "
                        "native aotpack-serve with these arguments (aotpack serve --help)")
    i = sub.add_parser("inspect", help="print an archive's signature, kernel table (autotune) and extern calls")
    i.add_argument("archive")
    i.add_argument("--json", action="store_true",
                   help="print the whole manifest as JSON, plus the derived tables under 'report'")
    i.add_argument("--ir", action="store_true", help="print the lowered graph and every fused kernel's IR")
    runtime_cache.add_subcommand(sub)
    return parser


def _build(args) -> int:
    from aotpack.build import build

    settings = Settings.from_env(topn=args.topn, device_limit=args.device_limit, **backends.settings_from(args),
                                 cache_dir=args.cache_dir, debug_dir=args.debug_dir,
                                 retune=args.retune or None, backend=args.backend,
                                 tuning_from=args.tuning_from, require_coverage=args.require_coverage,
                                 cost_model=args.cost_model, cost_model_ratio=args.cost_model_ratio,
                                 tiny_kernel_us=args.tiny_kernel_us, far_behind_factor=args.far_behind_factor)
    from aotpack.commands.progress import BuildProgress, summary

    result = build(args.model, args.output_dir, args.name, args.version, settings,
                   allow_mismatch=args.allow_mismatch, selftest=args.selftest,
                   inputs_path=args.inputs_path, sign_key=args.sign, progress=BuildProgress(live=not args.quiet))
    if not args.quiet:
        print("phase times:")
        print("\n".join(summary(result.seconds)))
    print(result.archive)
    return 0


def _run(args) -> int:
    from aotpack.commands.run import run

    # the keys go to aotpack.load; the runtime adds AOTPACK_TRUSTED_KEYS's itself
    for line in run(args.archive, args.inputs, args.output, args.bench, args.device_limit,
                    trusted_keys=args.trusted_key, require_signature=args.require_signature,
                    verbose=args.show_signature or args.verbose):
        print(line)
    return 0


def _target(manifest: dict) -> str:
    """The phrase for the manifest's target (``target ?`` where it has none), as the runtime
    reads every host backend's target keys (``manifest_rules.HOST_RULES``)."""
    from aotpack.archive import manifest_rules

    try:
        return manifest_rules.HOST_RULES.describe_target(manifest)
    except (KeyError, AttributeError):
        return "target ?"


def _print_ir(archive: Path) -> int:
    from aotpack.archive import layout
    from aotpack.archive.writer import read_members

    text = read_members(archive).get(layout.KERNEL_IR_PATH)
    if text is None:
        raise AotpackError(f"{archive} holds no {layout.KERNEL_IR_PATH} (built by an older aotpack); "
                           "rebuild it, or use --debug-dir at build time")
    sys.stdout.write(text.decode())
    return 0


def _inspect(args) -> int:
    from aotpack.archive import layout
    from aotpack.archive import reader
    from aotpack.commands import report
    from aotpack.archive.writer import read_manifest

    archive = Path(args.archive)
    manifest = read_manifest(archive)
    if args.ir:
        return _print_ir(archive)
    try:  # one pass: check every file, keep the kernel IR for the report
        checked = reader.check(archive, keep=lambda name: name == layout.KERNEL_IR_PATH)
        problems, kernel_ir = [], checked.members.get(layout.KERNEL_IR_PATH)
    except AotpackError as exc:
        problems, kernel_ir = [str(exc)], None
    derived = report.build_report(manifest, kernel_ir.decode(errors="replace") if kernel_ir is not None else None)
    if args.json:
        print(json.dumps({**manifest, "report": derived}, indent=2))
        return 1 if problems else 0
    print(f"{manifest['name']} {manifest['version']}  (format {manifest['format_version']}, "
          f"backend {manifest['backend']}, torch {manifest['torch_version']}, "
          f"{_target(manifest)}, device limit {manifest.get('device_limit', '?')})")
    for kind in ("inputs", "outputs"):
        for t in manifest[kind]:
            print(f"  {kind[:-1]:6} {t['name']}: {t['dtype']}{t['shape']}")
    for line in report.text_lines(derived):
        print(line)
    if problems:
        print(f"  files: {len(problems)} problem(s): " + "; ".join(problems))
        return 1
    print(f"  files: {len(manifest['files'])}, sizes and sha256 match the manifest")
    return 0


def _diff(args) -> int:
    from aotpack.commands.diff import compare, report

    try:
        result = compare(args.a, args.b)
    except AotpackError as exc:  # diff's convention: 2 is trouble, 1 means "different"
        print(f"aotpack: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else "\n".join(report(result)))
    return 0 if result["same"] else 1


def _verify(args) -> int:
    from aotpack.archive.reader import trusted_keys_from_env
    from aotpack.commands.verify import verify

    keys = trusted_keys_from_env() + args.trusted_key
    for line in verify(args.archive, run=args.run, trusted_keys=keys,
                       require_signature=args.require_signature or None):
        print(line)
    return 0


def _sign(args) -> int:
    from aotpack.archive.writer import sign_archive

    print(f"signed {sign_archive(args.archive, args.key)}")
    return 0


def _keygen(args) -> int:
    from aotpack.archive.signing import keygen

    private, public = keygen(args.private_key, args.public)
    print(f"private key: {private} (keep it secret)\npublic key:  {public} (give it to --trusted-key)")
    return 0


def _stop_on_terminate() -> None:
    """SIGTERM and SIGHUP unwind like Ctrl-C, so temp files and partial archives are removed."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(sig, interrupt)
        except (ValueError, OSError):  # not the main thread
            pass


def _serve(arguments: list[str]) -> int:
    """``aotpack serve ARGS``: replaces this process with ``aotpack-serve ARGS`` (no Python
    stays between the server and its signals); returns 1 when the binary is not found."""
    import os

    from aotpack.runtime.native import find_server

    try:
        server = find_server()
    except AotpackError as exc:
        print(f"aotpack: error: {exc}", file=sys.stderr)
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(server, [str(server), *arguments])


def _builds(argv: list[str]) -> bool:
    """Whether ``argv`` runs the build command (the first word not an option: the top-level
    options take no value)."""
    return next((word for word in argv if not word.startswith("-")), None) == "build"


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``aotpack`` command; returns the exit status (0 ok, 1 user error,
    2 internal error, 130 interrupted)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["serve"]:
        return _serve(argv[1:])
    args = _parser(backend_flags=_builds(argv)).parse_args(argv)
    logging.basicConfig(level=logging.WARNING if args.quiet else logging.INFO,
                        format="aotpack: %(message)s")
    if not getattr(args, "verbose", False):
        logging.getLogger("aotpack.tune.autotune").setLevel(logging.WARNING)
    _stop_on_terminate()
    handlers = {"build": _build, "run": _run, "inspect": _inspect, "verify": _verify, "diff": _diff,
                "sign": _sign, "keygen": _keygen, "cache": runtime_cache.run_subcommand}
    try:
        return handlers[args.command](args)
    except AotpackError as exc:
        print(f"aotpack: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("aotpack: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a bug: say so in one line, traceback on request
        if args.traceback:
            raise
        print(f"aotpack: internal error: {type(exc).__name__}: {exc}\n"
              "aotpack: this is a bug; rerun with --traceback and report it with the model file",
              file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
