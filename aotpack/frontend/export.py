"""Stage 1: load the user's model file and export it with static shapes.

Model file contract: ``model() -> torch.nn.Module`` and ``example_inputs() ->
tuple[Tensor, ...]`` (the real inputs the kernels are tuned on); optional
``calibration_inputs() -> Iterable[tuple]`` (more real input sets, same shapes and
dtypes, timed too) and ``__version__ = "X.Y.Z"``.

Or an exported program: a ``torch.export.save`` file (``.pt2``) plus a ``torch.save`` file
of inputs (a tuple of tensors, or a list of such tuples: the first is the example set,
the rest calibration sets); it fills the same ``ModelFile`` and skips ``torch.export``.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import importlib.util
import logging
import re
import sys
import threading
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import _decomp

from aotpack.frontend import export_errors
from aotpack.config import env_debug_dir
from aotpack.errors import AotpackError
from aotpack.frontend.torch_output import captured_torch_output

log = logging.getLogger("aotpack")

aten = torch.ops.aten
#: semver.org 2.0: X.Y.Z without leading zeros, optional -prerelease and +build.
SEMVER = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")

#: Composite ops broken up so their pieces fuse (row-wise softmax/layer_norm become
#: reductions + pointwise). SDPA stays whole: it runs as an extern call (decomposed, it breaks later views in some real models).
EXTRA_DECOMPOSITIONS = [aten.native_layer_norm, aten._softmax, aten._log_softmax, aten.gelu,
                        aten.silu, aten.hardswish, aten.hardsigmoid]
KEEP_WHOLE = [aten.scaled_dot_product_attention, aten._scaled_dot_product_flash_attention_for_cpu]


@dataclass
class ModelFile:
    """What a model file provides: the module, its real inputs and its version."""

    path: Path
    module: torch.nn.Module
    example_inputs: tuple
    version: str | None
    calibration_inputs: list = field(default_factory=list)
    #: Set for a .pt2 file: the program itself (``module`` is then ``exported.module()``).
    exported: torch.export.ExportedProgram | None = None


def _fail(path: Path, problem: str) -> AotpackError:
    return AotpackError(f"{path}: {problem}")


def _user_frame(exc: BaseException, path: Path) -> str:
    """'line N' of the deepest frame inside the model file, for error messages."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if Path(f.filename) == path]
    return f" (line {frames[-1].lineno})" if frames else ""


def load_model_file(path: str | Path) -> ModelFile:
    """Import a model file and call its ``model()`` and ``example_inputs()``.

    Raises:
        AotpackError: the file is missing or fails to import, a required function is
            missing, or they return the wrong types; the message names the file.
    """
    path = Path(path).resolve()
    if not path.is_file():
        raise _fail(path, "model file not found")
    spec = importlib.util.spec_from_file_location(f"aotpack_model_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(path.parent))
    sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # the user's code: report it, don't crash
        sys.modules.pop(spec.name, None)
        raise _fail(path, f"importing the model file failed{_user_frame(exc, path)}: "
                          f"{type(exc).__name__}: {exc}") from exc
    finally:
        sys.path.remove(str(path.parent))
    for name, signature in (("model", "def model() -> torch.nn.Module"),
                            ("example_inputs", "def example_inputs() -> tuple[torch.Tensor, ...]")):
        found = getattr(module, name, None)
        if found is None or not callable(found):
            raise _fail(path, f"missing function '{name}'; add `{signature}` to the model file")
        if isinstance(found, torch.nn.Module):
            raise _fail(path, f"'{name}' is a module instance, not a function; write `{signature}` "
                              "that returns it")
    try:
        net = module.model()
    except Exception as exc:
        raise _fail(path, f"model() raised{_user_frame(exc, path)}: {type(exc).__name__}: {exc}") from exc
    if not isinstance(net, torch.nn.Module):
        raise _fail(path, f"model() must return a torch.nn.Module, got {type(net).__name__}")
    try:
        inputs = module.example_inputs()
    except Exception as exc:
        raise _fail(path, f"example_inputs() raised{_user_frame(exc, path)}: {type(exc).__name__}: {exc}") from exc
    if isinstance(inputs, torch.Tensor):
        inputs = (inputs,)
    if not isinstance(inputs, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in inputs):
        raise _fail(path, "example_inputs() must return a tuple of tensors")
    version = getattr(module, "__version__", None)
    return ModelFile(path, net, tuple(inputs), version, _calibration_sets(module, path, tuple(inputs)))


PT2_SUFFIX = ".pt2"


def load_model(path: str | Path, inputs_path: str | Path | None = None) -> ModelFile:
    """A model file (``.py``, see :func:`load_model_file`) or an exported program
    (``.pt2`` with ``inputs_path``, see :func:`load_exported_program`).

    Raises:
        AotpackError: ``--inputs`` missing for a .pt2 or given for a model file, or what
            the loader raises.
    """
    path = Path(path)
    if path.suffix == PT2_SUFFIX:
        if inputs_path is None:
            raise _fail(path.resolve(), "an exported program needs its inputs: pass --inputs INPUTS.pt "
                                        "(a torch.save'd tuple of example tensors)")
        return load_exported_program(path, inputs_path)
    if path.suffix != ".py":
        raise _fail(path.resolve(), "expected a model file (.py) or an exported program (.pt2)")
    if inputs_path is not None:
        raise _fail(path.resolve(), "--inputs is for .pt2 exported programs; a model file provides "
                                    "example_inputs()")
    return load_model_file(path)


def _input_sets(loaded, inputs_path: Path) -> list[tuple]:
    """The sets of a torch.save'd inputs file: a tensor, a tuple of tensors, or a list of
    tuples (example set first)."""
    if isinstance(loaded, torch.Tensor):
        return [(loaded,)]
    if isinstance(loaded, (tuple, list)) and loaded and all(isinstance(t, torch.Tensor) for t in loaded):
        return [tuple(loaded)]
    if (isinstance(loaded, list) and loaded
            and all(isinstance(s, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in s)
                    for s in loaded)):
        return [tuple(s) for s in loaded]
    raise _fail(inputs_path, "expected a tuple of tensors (the example inputs) or a list of such tuples "
                             f"(example set first, then calibration sets), got {type(loaded).__name__}")


def load_exported_program(path: str | Path, inputs_path: str | Path) -> ModelFile:
    """Load a ``torch.export.save`` file and its ``torch.save``'d inputs into a ModelFile.

    Raises:
        AotpackError: either file is missing or unreadable, the inputs file does not hold
            tensor sets, the sets differ in dtype or shape, or the program rejects them.
    """
    path, inputs_path = Path(path).resolve(), Path(inputs_path).resolve()
    for file in (path, inputs_path):
        if not file.is_file():
            raise _fail(file, "file not found")
    try:
        with _quiet_torch():
            exported = torch.export.load(path)
    except Exception as exc:
        raise _fail(path, f"not a torch.export.save file: {type(exc).__name__}: "
                          f"{_first_line(exc)}") from None
    try:
        loaded = torch.load(inputs_path, weights_only=True)
    except Exception as exc:
        raise _fail(inputs_path, f"not a torch.save file of tensors: {type(exc).__name__}: "
                                 f"{_first_line(exc)}") from None
    example, *calibration = _input_sets(loaded, inputs_path)
    _check_sets(inputs_path, example, calibration, lambda n: f"input set {n + 1}", "the example inputs are")
    module = exported.module()
    try:  # on a copy: the program's buffers share storage with it and may be updated
        with torch.no_grad(), _quiet_torch():
            copy.deepcopy(module)(*[t.clone() for t in example])
    except Exception as exc:
        raise _fail(inputs_path, f"the example inputs do not fit {path.name}: {type(exc).__name__}: "
                                 f"{_first_line(exc)}") from None
    return ModelFile(path, module, example, None, calibration, exported)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _check_sets(path: Path, example: tuple, sets: list[tuple], set_name, example_is: str) -> None:
    """Raises AotpackError unless every set matches the example's dtypes and shapes.

    ``set_name(i)`` names set ``i`` in the message; ``example_is`` names the example inputs.
    """
    want = [(t.dtype, tuple(t.shape)) for t in example]
    for number, inputs in enumerate(sets):
        got = [(t.dtype, tuple(t.shape)) if isinstance(t, torch.Tensor) else (type(t).__name__, ())
               for t in inputs]
        if got != want:
            raise _fail(path, f"{set_name(number)} is {_describe(got)}, but {example_is} "
                              f"{_describe(want)}; shapes are static, so every set must match")


def _calibration_sets(module, path: Path, example: tuple) -> list[tuple]:
    """The optional ``calibration_inputs()`` sets, checked against the example inputs.

    Raises:
        AotpackError: it raises, or a set differs in count, dtype or shape (static shapes).
    """
    function = getattr(module, "calibration_inputs", None)
    if function is None:
        return []
    try:
        sets = [tuple(s) if isinstance(s, (tuple, list)) else (s,) for s in function()]
    except Exception as exc:
        raise _fail(path, f"calibration_inputs() raised{_user_frame(exc, path)}: "
                          f"{type(exc).__name__}: {exc}") from exc
    _check_sets(path, example, sets, lambda n: f"calibration_inputs() set {n}", "example_inputs() is")
    return sets


def _describe(signature) -> str:
    return "(" + ", ".join(f"{str(d).removeprefix('torch.')}{list(s)}" for d, s in signature) + ")"


def check_version(version: str) -> str:
    """Raises AotpackError unless ``version`` is semantic (``X.Y.Z``)."""
    if not SEMVER.match(version):
        raise AotpackError(f"version {version!r} is not a semantic version; use X.Y.Z, e.g. 1.0.0")
    return version


def decomposition_table() -> dict:
    """torch's core ATen decompositions + ``EXTRA_DECOMPOSITIONS``, minus ``KEEP_WHOLE``."""
    table = _decomp.core_aten_decompositions()
    table.update(_decomp.get_decompositions(EXTRA_DECOMPOSITIONS))
    for op in KEEP_WHOLE:
        for overload in [getattr(op, name) for name in op.overloads()] if hasattr(op, "overloads") else [op]:
            table.pop(overload, None)
    return table


@contextlib.contextmanager
def _quiet_torch():
    """Keep torch's logs, stderr dumps and warnings off the user's screen (dropped): a
    failure is reported once, as an AotpackError naming the model file."""
    with captured_torch_output():
        yield


def export_model(model_file: ModelFile, debug_dir: str | Path | None = None) -> torch.export.ExportedProgram:
    """torch.export (static shapes) + decompositions, on a copy of the user's module.

    ExportedProgram shares storage with the module it came from, so the
    export works on a deep copy: the user's module and tensors are never modified.
    torch's own output (FX graph dumps, log lines, warnings) is captured, never printed;
    when the export fails it goes to ``<debug_dir>/<model stem>/export.log``
    (``debug_dir`` None: ``AOTPACK_DEBUG=1`` selects ``aotpack_debug``, else it is dropped).

    Raises:
        AotpackError: export failed, or the program has data-dependent shapes; one line
            (``export_errors.MAX_MESSAGE``) naming the model file, the failing frame in
            user or library code, the cause and what to do.
    """
    path = model_file.path
    debug_dir = Path(debug_dir) if debug_dir is not None else env_debug_dir()
    if model_file.exported is not None:  # a .pt2: already exported, decompose a copy
        _check_static(path, model_file.exported)
        try:
            with _quiet_torch():
                return copy.deepcopy(model_file.exported).run_decompositions(decomposition_table())
        except Exception as exc:
            raise _fail(path, f"decomposing the exported graph failed: {type(exc).__name__}: "
                              f"{_first_line(exc)}") from exc
    ep = _export_one_pass(model_file)
    if ep is not None:
        _check_static(path, ep)
        return ep
    module = copy.deepcopy(model_file.module).eval()
    inputs = tuple(t.clone() for t in model_file.example_inputs)
    output = None
    try:
        with torch.no_grad(), captured_torch_output() as output:
            ep = torch.export.export(module, inputs, strict=False)
    except Exception as exc:
        log_file = export_errors.write_log(debug_dir, path, exc, output.text()) if debug_dir else None
        raise AotpackError(export_errors.export_failure(path, exc, log_file)) from exc
    _check_static(path, ep)
    try:
        with _quiet_torch():
            return ep.run_decompositions(decomposition_table())
    except Exception as exc:
        raise _fail(path, f"decomposing the exported graph failed: {type(exc).__name__}: "
                          f"{_first_line(exc)}") from exc


#: The torch release whose internal one-pass export (``_export_one_pass``) was checked to
#: give the lowering the same program as ``export`` + ``run_decompositions``.
ONE_PASS_TORCH = "2.13."
_ONE_PASS_LOCK = threading.Lock()


def _export_one_pass(model_file: ModelFile) -> torch.export.ExportedProgram | None:
    """The decomposed program in one trace, or None (another torch release, or any error:
    the caller then takes the public two-pass path, which also reports the error).

    ``torch.export.export`` traces to the training IR and ``run_decompositions`` traces
    that again; torch's non-strict aot-dispatch export applies the decomposition table
    during its one trace, holding the composite ops the table keeps whole (SDPA, upsample)
    as ``run_decompositions`` does. Same kernel IR (``tests/unit/test_export_one_pass.py``) in
    less export time (docs/measurements.md, "One-pass export"); it leaves out the no-op
    ``_assert_tensor_metadata`` checks of ``.to()`` and the constants only they read. A module with tied tensors
    (``_has_tied_tensors``), and a program that updates buffers or inputs in place or has
    data-dependent shapes, takes the two-pass path.
    """
    if not torch.__version__.startswith(ONE_PASS_TORCH) or _has_tied_tensors(model_file.module):
        return None
    from torch.export import _trace
    from torch.export.exported_program import (_override_composite_implicit_decomp,
                                                _split_decomp_table_to_cia_and_python_decomp)
    module = copy.deepcopy(model_file.module).eval()
    inputs = tuple(t.clone() for t in model_file.example_inputs)
    # as run_decompositions does: composite ops the table keeps (SDPA, interpolate's
    # upsample) stay whole instead of being broken up by the dispatcher
    composite, python = _split_decomp_table_to_cia_and_python_decomp(decomposition_table())
    with _ONE_PASS_LOCK:  # the table goes in through a module attribute of torch's
        original = _trace._export_to_aten_ir
        _trace._export_to_aten_ir = functools.partial(original, decomp_table=python)
        try:
            with torch.no_grad(), captured_torch_output(), _override_composite_implicit_decomp(composite):
                ep = _trace._export(module, inputs, strict=False, pre_dispatch=False)
        except Exception:  # noqa: BLE001 - the public path reports it
            return None
        finally:
            _trace._export_to_aten_ir = original
    # in-place updates come out in another (equivalent) order, and unbacked symbols under
    # other numbers: those programs take the checked path (and its error messages)
    signature = ep.graph_signature
    if signature.buffers_to_mutate or signature.user_inputs_to_mutate or export_errors.data_dependent_node(ep):
        return None
    return ep


def _has_tied_tensors(module: torch.nn.Module) -> bool:
    """Whether two of the module's parameters, buffers or tensor attributes share storage
    (tied embeddings, a table that is a weight's view): the one-pass trace lifts each name
    on its own, where the lowering must see one tensor."""
    tensors = [t for _, t in module.named_parameters(remove_duplicate=False)]
    tensors += [t for _, t in module.named_buffers(remove_duplicate=False)]
    tensors += [v for m in module.modules() for v in vars(m).values() if isinstance(v, torch.Tensor)]
    storages = {t.untyped_storage().data_ptr() for t in tensors if t.device.type != "meta"}
    return len(storages) != len(tensors)


def _check_static(path: Path, ep: torch.export.ExportedProgram) -> None:
    """Raises AotpackError (one line, see ``export_errors``) at the first data-dependent
    shape or value in ``ep``: aotpack compiles static shapes only."""
    node = export_errors.data_dependent_node(ep)
    if node is not None:
        raise AotpackError(export_errors.data_dependent_output(path, node))
