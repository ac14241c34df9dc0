"""The CPU backend's CppWrapper: the model's C++ (model.cpp), rendered after autotuning.

``templates/model.cpp.j2`` holds the frame (handles, kernel state objects, the C
entry points of ``model_abi.h``); this module turns the lowered graph's steps into the
lines of ``run()``: buffer allocation, kernel launches with the winning ``kernel_key``,
extern calls through the host's dispatcher entry, mutation write-back and outputs.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from aotpack import env
from aotpack.archive import layout
from aotpack.errors import AotpackError
from aotpack.ir.graph import Buffer, CondStep, CopyBack, ExternCall, Graph, KernelCall
from aotpack.backends.cpu.weights import pack_panels
from aotpack.backends.cpu.templating import render


#: Model ABI (AOTPACK_MODEL_ABI_VERSION_MAJOR/_MINOR in model_abi.h). The manifest's
#: ``model.abi_version`` records the MAJOR, which the runtime requires to match.
MODEL_ABI_VERSION_MAJOR, MODEL_ABI_VERSION_MINOR = layout.MODEL_ABI_VERSION_MAJOR, 0
MODEL_ABI_VERSION = MODEL_ABI_VERSION_MAJOR

#: torch dtype -> c10::ScalarType code (AotpackDType in model_abi.h).
DTYPE_CODES = {getattr(torch, name): code for name, code in layout.DTYPE_CODES.items()}
MEMORY_FORMATS = {torch.contiguous_format: 0, torch.preserve_format: 1,
                  torch.channels_last: 2, torch.channels_last_3d: 3}


#: Ops model.so calls typed (unboxed) through the host's ``call_typed`` (host ABI 1.1),
#: their handles resolved once in ``create()``: the GEMM/conv implementations aotpack tunes.
TYPED_OPS = {("aten::addmm", ""), ("aten::mm", ""), ("aten::bmm", ""), ("aten::convolution", ""),
             ("mkl::_mkl_linear", ""), ("mkldnn::_linear_pointwise", ""),
             ("mkldnn::_linear_pointwise", "binary"), ("mkldnn::_convolution_pointwise", "")}


def dtype_code(dtype: torch.dtype) -> int:
    """c10::ScalarType code of ``dtype``.

    Raises:
        AotpackError: dtype the archive format does not carry (e.g. complex).
    """
    if dtype not in DTYPE_CODES:
        raise AotpackError(f"dtype {dtype} is not supported in model inputs, outputs or buffers")
    return DTYPE_CODES[dtype]


@dataclass
class KernelLiteral:
    """What the C++ bakes in for one kernel (paths are inside the archive)."""

    name: str
    wrapper: str
    kernel_dir: str
    lib_kernel: str
    kernel_key: str


def kernel_literal(kernel, winner) -> KernelLiteral:
    """Archive paths and winning kernel_key of one kernel (a ``FusedKernel`` and its winner)."""
    name, key = kernel.name, winner.kernel_key
    return KernelLiteral(name, layout.wrapper_path(name), layout.kernel_dir(name),
                         layout.lib_kernel_path(name, key), key)


def _dims(values) -> str:
    return "{" + ", ".join(str(int(v)) for v in values) + "}"


class IntArrays:
    """The int64 arrays of ``run()`` (sizes, strides, int-list arguments) as static data,
    one ``kInts<n>`` per distinct list: a literal ``std::vector`` per call cost a heap
    allocation at run time and most of model.so's compile time."""

    def __init__(self):
        self.names: dict[tuple, str] = {}

    def ref(self, values) -> str:
        """The array's name (``nullptr`` for an empty list)."""
        key = tuple(int(v) for v in values)
        if not key:
            return "nullptr"
        return self.names.setdefault(key, f"kInts{len(self.names)}")

    def shape(self, sizes, strides) -> str:
        """``rank, sizes, strides`` arguments of alloc/view/conform/as_strided."""
        return f"{len(sizes)}, {self.ref(sizes)}, {self.ref(strides)}"

    def lines(self) -> list[str]:
        """The definitions, at namespace scope before ``run()``."""
        return [f"constexpr int64_t {name}[] = {_dims(values)};" for values, name in self.names.items()]


class RunEmitter:
    """Builds the body of ``run()`` from the graph's steps."""

    def __init__(self, graph: Graph, kernel_index: dict[str, int]):
        self.graph = graph
        self.kernel_index = kernel_index
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.ops: list[tuple[str, str]] = []
        self.typed: list[tuple[str, str]] = []
        self.temp = 0
        self.declared = 0
        self.pack_lines: list[str] = []
        self.ints = IntArrays()
        self.panel_packs = False  # a weight packed into GEMM panels at load: emit pack_panels

    def name(self, buf: Buffer) -> str:
        """C++ variable holding ``buf``'s handle."""
        return self.names[id(buf)]

    def _tmp(self) -> str:
        self.temp += 1
        return f"v{self.temp}"

    def tensor_ref(self, parts) -> str:
        """C++ expression for a view (base, sizes, strides, offset): the base itself or a view."""
        base, sizes, strides, offset = parts
        if tuple(sizes) == base.shape and tuple(strides) == base.strides and offset == 0:
            return self.name(base)
        tmp = self._tmp()
        self.lines.append(f"Tensor {tmp} = view({self.name(base)}, {self.ints.shape(sizes, strides)}, {offset});")
        return tmp

    def emit(self) -> list[str]:
        """Lines of ``run()``: conform inputs, the steps in order, then the outputs."""
        for i, buf in enumerate(self.graph.inputs):
            self.names[id(buf)] = f"in{i}"
            self.lines.append(f"Tensor in{i} = conform(Tensor(inputs[{i}], false), "
                              f"{self.ints.shape(buf.shape, buf.strides)}, {dtype_code(buf.dtype)});")
        for i, buf in enumerate(self.graph.constants):
            self.names[id(buf)] = f"c{i}"
            self.lines.append(f"const Borrowed c{i}{{m.constants[{i}]}};")
        for i, packed in enumerate(self.graph.packed):
            self.names[id(packed.buffer)] = f"p{i}"
            self.lines.append(f"const Borrowed p{i}{{m.packed[{i}]}};")
            self._pack(i, packed)
        last_use = self._last_uses()
        for index, step in enumerate(self.graph.steps):
            self._step(step)
            for buf_id in last_use.get(index, []):
                self.lines.append(f"{self.names[buf_id]}.reset();")
        for i in range(len(self.graph.outputs)):
            self.lines.append(f"outputs[{i}] = nullptr;")
        for i, parts in enumerate(self.graph.outputs):
            base, sizes, strides, offset = parts
            self.lines.append(f"check(g_host->as_strided({self.name(base)}.get(), {self.ints.shape(sizes, strides)}, "
                              f"{offset}, &outputs[{i}]), \"returning output {i}\");")
        return self.lines

    def _step(self, step) -> None:
        self.lines.append("{")
        if isinstance(step, KernelCall):
            self._kernel(step)
        elif isinstance(step, ExternCall):
            self._extern(step)
        elif isinstance(step, CopyBack):
            self._copy_back(step)
        elif isinstance(step, CondStep):
            self._cond(step)
        else:
            raise AotpackError(f"internal error: {type(step).__name__} step left in the graph at codegen")
        self.lines.append("}")

    def _cond(self, step: CondStep) -> None:
        """``if (pred) {...} else {...}``; both branches fill the same result buffers."""
        for buf in step.results:
            self._declare(buf)
            self.lines.append(f"b_{buf.name} = alloc({self.ints.shape(buf.shape, buf.strides)}, "
                              f"{dtype_code(buf.dtype)});")
        pred = self.tensor_ref(step.pred)
        self.lines.append(f"if (*static_cast<const bool*>(ptr({pred}))) {{")
        for inner in step.true_steps:
            self._step(inner)
        self.lines.append("} else {")
        for inner in step.false_steps:
            self._step(inner)
        self.lines.append("}")

    def _declare(self, buf: Buffer) -> None:
        self.names[id(buf)] = f"b_{buf.name}"
        # declared at function scope (after earlier declarations) so later steps see it
        self.lines.insert(self._decl_pos() + self.declared, f"Tensor b_{buf.name};")
        self.declared += 1

    def _decl_pos(self) -> int:
        return len(self.graph.inputs) + len(self.graph.constants) + len(self.graph.packed)

    def _pack(self, index: int, packed) -> None:
        """Lines of ``create()`` that pack a weight once (``gemm.PackedWeight``) into m.packed."""
        constants = {id(b): i for i, b in enumerate(self.graph.constants)}
        if packed.op is pack_panels:  # aotpack's own layout: a loop in model.cpp, no ATen op
            weight = packed.args[0].value[0]
            n, k = weight.shape
            self.panel_packs = True
            self.pack_lines.append(f"pack_panels(Tensor(m.constants[{constants[id(weight)]}], false), {n}, {k}, "
                                   f"{packed.buffer.shape[2]}, &m.packed[{index}]);  // {packed.buffer.name}")
            return
        saved, self.lines = self.lines, []
        exprs = []
        for arg in packed.args:
            if arg.kind == "tensor":
                exprs.append(f"arg_tensor(Tensor(m.constants[{constants[id(arg.value[0])]}], false))")
            else:
                exprs.append(self._arg(arg))
        body, self.lines = self.lines, saved
        self.pack_lines += ["{", *body, f"const AotpackArg a[] = {{{', '.join(exprs)}}};",
                            f"check(g_host->call_op(m.ops[{self._op_slot(packed.op)}], a, {len(exprs)}, "
                            f"&m.packed[{index}], 1), \"packing {packed.buffer.name} ({packed.op})\");", "}"]

    def _kernel(self, step: KernelCall) -> None:
        kernel = step.kernel
        for buf in kernel.outputs:
            self._declare(buf)
            self.lines.append(f"b_{buf.name} = alloc({self.ints.shape(buf.shape, buf.strides)}, {dtype_code(buf.dtype)});")
        args = [f"ptr({self.name(b)})" for b in kernel.inputs + kernel.outputs]
        self.lines.append(f"void* const args[] = {{{', '.join(args)}}};")
        self.lines.append(f"m.kernels[{self.kernel_index[kernel.kernel_id]}].launch(args);  // {kernel.name}")

    def _op_slot(self, op) -> int:
        key = (op._schema.name, op._schema.overload_name)
        if key not in self.ops:
            self.ops.append(key)
        return self.ops.index(key)

    def _typed(self, step: ExternCall) -> None:
        """A typed call: every schema argument, one result, no IValue stack."""
        key = (step.op._schema.name, step.op._schema.overload_name)
        if key not in self.typed:
            self.typed.append(key)
        arg_exprs = [self._arg(arg) for arg in step.args]
        buf = step.outputs[0]
        self.lines.append(f"const AotpackArg a[] = {{{', '.join(arg_exprs)}}};")
        self.lines.append("AotpackTensor out = nullptr;")
        self.lines.append(f"check(g_host->call_typed(m.typed[{self.typed.index(key)}], a, {len(arg_exprs)}, &out), "
                          f"\"{step.op}\");")
        self._declare(buf)
        self.lines.append(f"b_{buf.name} = conform(Tensor(out, true), {self.ints.shape(buf.shape, buf.strides)}, "
                          f"{dtype_code(buf.dtype)});")

    def _extern(self, step: ExternCall) -> None:
        key = (step.op._schema.name, step.op._schema.overload_name)
        if key in TYPED_OPS and len(step.outputs) == 1 and step.outputs[0] is not None:
            return self._typed(step)
        arg_exprs = [self._arg(arg) for arg in step.args]
        self.lines.append(f"const AotpackArg a[] = {{{', '.join(arg_exprs) or 'arg_none()'}}};")
        count = len(step.outputs)
        self.lines.append(f"AotpackTensor outs[{max(count, 1)}] = {{}};")
        slot = self._op_slot(step.op)
        self.lines.append(f"check(g_host->call_op(m.ops[{slot}], a, {len(arg_exprs)}, outs, {count}), "
                          f"\"{step.op}\");")
        for i, buf in enumerate(step.outputs):
            if buf is None:
                self.lines.append(f"g_host->release(outs[{i}]);")
                continue
            self._declare(buf)
            self.lines.append(f"b_{buf.name} = conform(Tensor(outs[{i}], true), "
                              f"{self.ints.shape(buf.shape, buf.strides)}, {dtype_code(buf.dtype)});")

    def _arg(self, arg) -> str:
        kind, value = arg.kind, arg.value
        if kind == "tensor":
            return f"arg_tensor({self.tensor_ref(value)})"
        if kind == "tensor_list":
            refs = ["nullptr" if p is None else f"{self.tensor_ref(p)}.get()" for p in value]
            if not refs:
                return "arg_tensors(nullptr, 0)"
            tmp = self._tmp()
            self.lines.append(f"const AotpackTensor {tmp}[] = {{{', '.join(refs)}}};")
            return f"arg_tensors({tmp}, {len(refs)})"
        if kind in ("int_list", "bool_list"):
            return f"arg_ints({self.ints.ref(value)}, {len(value)}, AOTPACK_ARG_{kind.upper()})"
        if kind == "double_list":
            if not value:
                return "arg_doubles(nullptr, 0)"
            tmp = self._tmp()
            self.lines.append(f"const double {tmp}[] = {{{', '.join(repr(float(v)) for v in value)}}};")
            return f"arg_doubles({tmp}, {len(value)})"
        if kind == "none":
            return "arg_none()"
        if kind == "int":
            return f"arg_int({int(value)}LL)"
        if kind == "bool":
            return f"arg_int({int(value)}, AOTPACK_ARG_BOOL)"
        if kind == "double":
            text = repr(float(value))
            if text in ("inf", "-inf", "nan"):
                text = {"inf": "__builtin_inf()", "-inf": "-__builtin_inf()", "nan": "__builtin_nan(\"\")"}[text]
            return f"arg_double({text})"
        if kind == "scalar_type":
            return f"arg_int({dtype_code(value)}, AOTPACK_ARG_SCALAR_TYPE)"
        if kind == "layout":
            if value != torch.strided:
                raise AotpackError(f"layout {value} is not supported; use dense (strided) tensors")
            return "arg_int(0, AOTPACK_ARG_LAYOUT)"
        if kind == "memory_format":
            return f"arg_int({MEMORY_FORMATS[value]}, AOTPACK_ARG_MEMORY_FORMAT)"
        if kind == "device":
            return f"arg_str(\"{value}\", AOTPACK_ARG_DEVICE)"
        if kind == "string":
            escaped = value.replace("\\", "\\\\").replace('"', '\\"')
            return f"arg_str(\"{escaped}\")"
        raise AotpackError(f"internal error: argument kind {kind}")

    def _copy_back(self, step: CopyBack) -> None:
        src = step.source
        ref = self.tensor_ref((src.base, src.shape, src.strides, src.offset))
        if step.target.kind == "input":  # the caller's tensor, not a re-laid-out copy of it
            target = f"inputs[{self.graph.inputs.index(step.target)}]"
        else:
            target = f"{self.name(step.target)}.get()"
        self.lines.append(f"check(g_host->copy_({target}, {ref}.get()), "
                          f"\"writing back mutated {step.target.name}\");")

    def _last_uses(self) -> dict[int, list[int]]:
        """step index -> buffers (ids) that no later step or output reads."""
        keep = {id(parts[0]) for parts in self.graph.outputs}
        keep |= {id(b) for b in self.graph.inputs + self.graph.constants}
        keep |= {id(p.buffer) for p in self.graph.packed}  # borrowed from the model: nothing to release
        last: dict[int, int] = {}
        for index, step in enumerate(self.graph.steps):
            for buf in step.buffers():
                last[id(buf)] = index
        by_step: dict[int, list[int]] = {}
        for buf_id, index in last.items():
            if buf_id not in keep:
                by_step.setdefault(index, []).append(buf_id)
        return by_step


def generate(graph: Graph, kernels: list, meta: dict) -> str:
    """model.cpp for ``graph`` with each kernel's autotuned winner baked in.

    Args:
        kernels: ``(FusedKernel, winner)`` per distinct kernel (one ``KernelState`` each),
            in order; launches find theirs by ``kernel_id``.
        meta: name, version, aotpack_version, device_limit.
    """
    kernel_index = {kernel.kernel_id: i for i, (kernel, _) in enumerate(kernels)}
    emitter = RunEmitter(graph, kernel_index)
    lines = emitter.emit()
    return render("model.cpp.j2", kernels=[kernel_literal(k, w) for k, w in kernels], ops=emitter.ops,
                  typed=emitter.typed,
                  run_lines=lines, array_lines=emitter.ints.lines(), pack_lines=emitter.pack_lines, num_packed=len(graph.packed),
                  panel_packs=emitter.panel_packs,
                  num_constants=len(graph.constants), num_inputs=len(graph.inputs),
                  num_outputs=len(graph.outputs), abi_version=MODEL_ABI_VERSION,
                  profile_variable=env.PROFILE.name, **meta)
