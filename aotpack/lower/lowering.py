"""Lower an exported, decomposed FX graph into the aotpack ``ir.Graph``.

Pointwise ops (with broadcasting), views and innermost-dimension reductions stay lazy
and fuse; a lazy value gets a buffer (``realize``) when an extern call or a graph
output needs it, or when several users would otherwise recompute something costly.
Every other op becomes an ``ExternCall`` into ATen, so any op torch.export produces
runs, fused or not.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import operator
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from aotpack.lower import (attention_lowering, bmm_lowering, constant_folding, extern, gemm_lowering, gemm_match, ops,
                           pooling, views)
from aotpack import backends
from aotpack.errors import AotpackError
from aotpack.ir.graph import (
    Buffer, CondStep, CopyBack, ExternArg, ExternCall, Graph, Index, KernelCall, Lazy, Pointwise,
    Reduction, StridedView, Value, affine_read, as_strided_parts, contiguous_strides, flat_index, unflatten_index,
    walk_steps,
)
from aotpack.ir.kernel import (
    Cast, Const, FusedKernel, Load, Op, Piecewise, foreign_reduction, has_reduce, inner_access, inner_var, input_buffers,
    row_vars, walk,
)

log = logging.getLogger("aotpack")

#: A lazy chain longer than this gets a buffer, to bound kernel size and compile time.
MAX_FUSED_OPS = 48
#: Inner loops shorter than this vectorise poorly: try merging outer dimensions in.
NARROW_INNER = 64


def _meta(node) -> Any:
    return node.meta.get("val")


class Lowerer:
    """Walks the FX graph once, in order, building steps and kernels."""

    def __init__(self, ep: ExportedProgram, dtypes: frozenset, backend):
        self.ep = ep
        self.dtypes = dtypes
        self.backend = backend  # its GEMM implementations and fusion budget
        self.env: dict[Any, Any] = {}
        self.steps: list = []
        self.kernels: list[FusedKernel] = []
        self.inputs: list[Buffer] = []
        self.constants: list[Buffer] = []
        self.constant_tensors: dict[str, torch.Tensor] = {}
        self.constant_sources: dict[str, torch.Tensor] = {}  # as exported: storage identity kept
        self.counter = 0
        #: costly values with several users, one of them a row reduction: they get a
        #: buffer from the first kernel that reads them (``_shared_outputs``)
        self.shared: list[Lazy] = []
        self.packed: list = []  # gemm.PackedWeight
        self.gemms: dict = {}  # final FX node -> gemm_match.GemmMatch
        self.absorbed: set = set()  # FX nodes a GEMM match lowers (all but its final node)
        self.attentions: dict = {}  # second bmm FX node -> attention_lowering.AttentionMatch
        self.folded = constant_folding.Folded({}, frozenset())  # input-free nodes

    # ------------------------------------------------------------------ entry
    def run(self) -> Graph:
        """Lower every node, in graph order."""
        placeholders = [n for n in self.ep.graph.nodes if n.op == "placeholder"]
        written = {s.target for s in self.ep.graph_signature.output_specs if s.kind == OutputKind.BUFFER_MUTATION}
        for node, spec in zip(placeholders, self.ep.graph_signature.input_specs):
            self.env[node] = self._placeholder(node, spec, read=bool(node.users) or spec.target in written)
        weights = {node.name for node, spec in zip(placeholders, self.ep.graph_signature.input_specs)
                   if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)}
        readonly = {node: self.constant_sources[spec.target]
                    for node, spec in zip(placeholders, self.ep.graph_signature.input_specs)
                    if spec.kind in (InputKind.BUFFER, InputKind.CONSTANT_TENSOR) and spec.target not in written}
        self.folded = constant_folding.find(self.ep.graph, readonly)
        self.gemms = gemm_match.find(self.ep.graph, weights)
        self.absorbed = {n for m in self.gemms.values() for n in m.nodes[:-1]}
        self.attentions = {node: m for node, m in attention_lowering.find(self.ep.graph).items()
                           if not any(n in self.folded.skipped or n in self.gemms for n in m.nodes)}
        self.absorbed |= {n for m in self.attentions.values() for n in m.nodes[:-1]}
        outputs, mutated = [], {"constant": [], "input": []}
        for node in self.ep.graph.nodes:
            if node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "output":
                outputs, mutated = self._outputs(node)
            elif node.op == "get_attr":  # a control-flow branch; its user reports it
                self.env[node] = getattr(self.ep.graph_module, node.target)
        self._drop_unread_shared_outputs(outputs)
        return Graph(self.inputs, self.constants, self.constant_tensors, self.steps,
                     outputs, self.kernels, mutated["constant"], mutated["input"],
                     constant_sources=self.constant_sources, packed=self.packed)

    def _drop_unread_shared_outputs(self, outputs: list) -> None:
        """A shared value written by a row kernel (``_shared_outputs``) that no later step
        and no graph output reads is dropped from that kernel: its users were all inside it."""
        steps = list(walk_steps(self.steps))
        read = {id(b) for step in steps for b in step.reads()} | {id(parts[0]) for parts in outputs}
        for step in steps:
            kernel = getattr(step, "kernel", None)
            if kernel is None or len(kernel.outputs) < 2 or kernel.row_outputs:
                continue
            keep = [k for k, out in enumerate(kernel.outputs) if k == 0 or id(out) in read]
            if len(keep) == len(kernel.outputs):
                continue
            exprs = tuple(kernel.exprs[k] for k in keep)
            step.kernel = dataclasses.replace(kernel, inputs=tuple(input_buffers(exprs)),
                                              outputs=tuple(kernel.outputs[k] for k in keep), exprs=exprs,
                                              access=inner_access(exprs, kernel.inner_size))
            self.kernels[next(i for i, k in enumerate(self.kernels) if k is kernel)] = step.kernel

    def _placeholder(self, node, spec, read: bool) -> Buffer | None:
        """The buffer of one graph input. A parameter, buffer or lifted constant that
        forward never reads (``read`` False: a tied weight's other names, an unused
        buffer) gets none; its tensor is kept in ``constant_sources`` only, so the
        archive can record it as an alias of a stored weight (``aotpack.archive.weights``)."""
        val = _meta(node)
        if spec.kind == InputKind.USER_INPUT:
            if not isinstance(val, torch.Tensor):
                raise AotpackError(f"input '{node.name}' is not a tensor ({type(val).__name__}); "
                                   "example_inputs() must return a tuple of tensors")
            buf = Buffer(node.name, tuple(val.shape), tuple(val.stride()), val.dtype, "input")
            self.inputs.append(buf)
            return buf
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR):
            tensor = self.ep.state_dict.get(spec.target)
            if tensor is None:
                tensor = self.ep.constants[spec.target]
            self.constant_sources[spec.target] = tensor.detach()
            if not read:
                return None
            tensor = tensor.detach().contiguous().clone()
            buf = Buffer(spec.target, tuple(tensor.shape), contiguous_strides(tensor.shape),
                         tensor.dtype, "constant")
            self.constants.append(buf)
            self.constant_tensors[spec.target] = tensor
            return buf
        raise AotpackError(f"unsupported graph input kind {spec.kind.name} for '{node.name}'; "
                           "only tensors, parameters and buffers are supported")

    def _scalar_constant(self, value) -> Buffer:
        """A 0-d constant holding a Python number (float32, int64 or bool, like a wrapped
        number: it does not promote the other operands' dtype)."""
        tensor = torch.tensor(value, dtype=torch.float32 if isinstance(value, float) else None)
        self.counter += 1
        buf = Buffer(f"_scalar_{self.counter}", (), (), tensor.dtype, "constant")
        self.constants.append(buf)
        self.constant_tensors[buf.name] = self.constant_sources[buf.name] = tensor
        return buf

    def _folded_constant(self, node) -> Buffer:
        """The build-time value of an input-free node (``constant_folding``) as a constant."""
        tensor = self.folded.values[node]
        buf = Buffer(f"_folded_{node.name}", tuple(tensor.shape), contiguous_strides(tensor.shape),
                     tensor.dtype, "constant")
        self.constants.append(buf)
        self.constant_tensors[buf.name] = self.constant_sources[buf.name] = tensor
        return buf

    def _outputs(self, node):
        """Graph outputs and write-backs of mutated buffers/inputs, in a safe order.

        Every output is realised before the first write-back, so no kernel reads a
        buffer after it was overwritten; an output or write-back source that is a view
        of a mutated tensor is snapshotted first for the same reason.
        """
        specs = self.ep.graph_signature.output_specs
        values = []
        for value_node, spec in zip(node.args[0], specs):
            value = self.env[value_node] if hasattr(value_node, "op") else value_node
            if not isinstance(value, Value):
                raise AotpackError(f"model output {spec.arg.name} is not a tensor; return tensors only")
            values.append(value)
        mutation = (OutputKind.BUFFER_MUTATION, OutputKind.USER_INPUT_MUTATION)
        targets = {s.target: self._target_buffer(s) for s in specs if s.kind in mutation}
        written = {id(t) for t in targets.values()}
        parts = []
        for value in values:
            found = self._strided(value)
            # a copy, not a view, of a tensor written back below, or of a weight: the
            # caller may modify its outputs, and must not change the model by doing so
            if any(id(root) in written or root.kind == "constant" for root in found[0].roots()):
                found = self._fresh_copy(found)
            parts.append(found)
        results, mutated = [], {"constant": [], "input": []}
        for spec, found in zip(specs, parts):
            if spec.kind == OutputKind.USER_OUTPUT:
                results.append(found)
            elif spec.kind in mutation:
                target = targets[spec.target]
                self.steps.append(CopyBack(target, StridedView(*found)))
                mutated[target.kind].append(target.name)
            else:
                raise AotpackError(f"unsupported output kind {spec.kind.name}")
        return results, mutated

    def _fresh_copy(self, parts: tuple) -> tuple:
        """A fresh contiguous copy of a view: a fused kernel, or ATen's clone for dtypes
        the kernels do not compute in."""
        view = StridedView(*parts)
        if view.dtype in self.dtypes:
            copy = Pointwise(tuple(view.shape), view.dtype, lambda index: view.expr(index), op_names=("copy",))
            return self._strided(self.realize(copy))
        self.counter += 1
        buf = Buffer(f"buf{self.counter}", view.shape, contiguous_strides(view.shape), view.dtype, "extern")
        self.steps.append(ExternCall(torch.ops.aten.clone.default,
                                     [ExternArg("tensor", parts), ExternArg("memory_format", torch.contiguous_format)],
                                     [buf]))
        return buf, buf.shape, buf.strides, 0

    def _target_buffer(self, spec) -> Buffer:
        for buf in self.constants + self.inputs:
            if buf.name == spec.target:
                return buf
        raise AotpackError(f"mutated tensor '{spec.target}' not found among inputs and buffers")

    # ------------------------------------------------------------------ dispatch
    def _call(self, node):
        if node in self.folded.skipped:  # computed at build time: a constant, or unread
            return self._folded_constant(node) if node in self.folded.values else None
        if node in self.absorbed:  # lowered with its GEMM match, at the match's last node
            return None
        if node in self.gemms:
            return gemm_lowering.lower(self, self.gemms[node])
        if node in self.attentions:
            return attention_lowering.lower(self, self.attentions[node])
        if bmm_lowering.applies(node):
            return bmm_lowering.lower(self, node)
        return self._call_op(node)

    def lower_nodes(self, nodes) -> Any:
        """Lower ``nodes`` one by one as ordinary ops (no GEMM matching); the last one's value."""
        for node in nodes:
            self.env[node] = self._call_op(node)
        return self.env[nodes[-1]]

    def _call_op(self, node):
        op = node.target
        if op is operator.getitem:
            return self.env[node.args[0]][node.args[1]]
        if op is torch.ops.higher_order.cond:
            return self._cond(node)
        if isinstance(op, torch._ops.HigherOrderOperator):
            raise AotpackError(f"unsupported construct: {op.name()} (control flow) in node "
                               f"'{node.name}'; aotpack lowers torch.cond but not this yet: move the "
                               "loop out of the model or unroll it")
        if op in ops.ASSERTIONS:
            return None
        result = None
        if self._fusable(node):
            result = self._lower_fusable(node)
        if result is None:
            return self._extern(node)
        if isinstance(result, Lazy) and result.realized is None:
            self._maybe_realize(node, result)
        return result

    def _fusable(self, node) -> bool:
        """All tensors involved have a dtype the backend's kernels compute in."""
        tensors = [_meta(a) for a in node.all_input_nodes] + [_meta(node)]
        flat = []
        for t in tensors:
            flat.extend(t if isinstance(t, (list, tuple)) else [t])
        return all(isinstance(t, torch.Tensor) and t.dtype in self.dtypes for t in flat)

    def _lower_fusable(self, node):
        op = node.target
        if op in ops.VIEWS:
            return self._view(node)
        if op is torch.ops.aten.cat.default:
            return self._cat(node)
        if op is torch.ops.aten.flip.default:
            return self._flip(node)
        if op is torch.ops.aten.max_pool2d_with_indices.default:
            return self._max_pool(node)
        if op in ops.COPIES:
            return self._copy(node)
        if op in ops.UNARY:
            name, expensive = ops.UNARY[op]
            source_dtype = _meta(node.args[0]).dtype
            if op is torch.ops.aten.bitwise_not.default and source_dtype == torch.bool:
                name = "logical_not"  # ~true is -2, which is true again as a bool
            if op in ops.ROUNDING and not source_dtype.is_floating_point:
                name = "identity"  # integers are already whole (a double round trip loses bits)
            # predicates (isnan, logical_not) test the input, not its cast to bool
            predicate = _meta(node).dtype == torch.bool and source_dtype != torch.bool
            return self._pointwise(node, [node.args[0]], name, expensive, compare=predicate)
        if op in ops.BINARY:
            a, b = node.args[0], node.args[1]
            alpha = node.kwargs.get("alpha", node.args[2] if len(node.args) > 2 else 1)
            params = ()
            if alpha != 1 and op in (torch.ops.aten.add.Tensor, torch.ops.aten.sub.Tensor):
                params = (alpha,)
            elif op is torch.ops.aten.pow.Tensor_Scalar and b in ops.POW_SPECIAL:
                return self._pointwise(node, [a], ops.POW_SPECIAL[b], False)
            return self._pointwise(node, [a, b], ops.BINARY[op], op in ops.EXPENSIVE_BINARY,
                                   compare=op in ops.COMPARISONS, params=params)
        if op is torch.ops.aten.where.self:
            return self._pointwise(node, list(node.args[:3]), "where", False, where=True)
        if op in (torch.ops.aten.clamp.default, torch.ops.aten.clamp_min.default,
                  torch.ops.aten.clamp_max.default):
            return self._clamp(node)
        if op in ops.CLAMP_TENSOR:
            return self._clamp_tensor(node)
        if op in ops.PARAMETRIC:
            name, expensive = ops.PARAMETRIC[op]
            params = tuple(value for _, value in extern.schema_values(node)[1:])
            return self._pointwise(node, [node.args[0]], name, expensive, params=params)
        if op in ops.DIV_WITH_MODE or op in ops.REMAINDERS:
            return self._rounding_division(node)
        if op is torch.ops.aten.gelu.default:
            if node.kwargs.get("approximate", "none") != "none":
                return None
            return self._pointwise(node, [node.args[0]], "gelu", True)
        if op in ops.REDUCTIONS:
            return self._reduction(node)
        if op is torch.ops.aten.var_mean.correction:
            return self._var_mean(node)
        if op in ops.VARIANCES:
            found = self._var_mean(node)
            return None if found is None else found[0]
        if op is torch.ops.aten._native_batch_norm_legit_no_training.default:
            return self._batch_norm(node)
        return None

    # ------------------------------------------------------------------ control flow
    def _cond(self, node) -> list[Buffer]:
        """Lower both branches of ``torch.cond`` into their own step lists.

        The predicate and operands get buffers first, so nothing computed outside a
        branch is recomputed (or half-computed) inside it.
        """
        pred_arg, true_attr, false_attr, operands = node.args[:4]
        pred = self._operand(pred_arg)
        if pred.dtype != torch.bool:  # cond takes any one-element tensor: test it against 0
            source = pred
            pred = Pointwise(tuple(source.shape), torch.bool,
                             lambda index: Op("ne_zero", (source.expr(index),), torch.bool, convert=False),
                             op_count=1, op_names=("ne",))
        pred = self._strided(pred)
        inputs = [StridedView(*self._strided(self._operand(o))) for o in operands]
        results = []
        for t in _meta(node):  # contiguous: a branch may return an expanded (stride 0) view
            self.counter += 1
            results.append(Buffer(f"buf{self.counter}", tuple(t.shape), contiguous_strides(t.shape), t.dtype,
                                  "cond"))
        branches = [self._branch(self.env[attr], inputs, results) for attr in (true_attr, false_attr)]
        self.steps.append(CondStep(pred, results, *branches))
        return results

    def _branch(self, module, inputs: list[Value], results: list[Buffer]) -> list:
        """The steps of one branch subgraph, ending in copies into ``results``."""
        outer_steps, self.steps = self.steps, []
        placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
        for node, value in zip(placeholders, inputs):
            self.env[node] = value
        for node in module.graph.nodes:
            if node.op == "call_function":
                self.env[node] = self._call(node)
            elif node.op == "get_attr":
                self.env[node] = getattr(module, node.target)
            elif node.op == "output":
                for value_node, result in zip(node.args[0], results):
                    self.steps.append(CopyBack(result, StridedView(*self._strided(self.env[value_node]))))
        branch_steps, self.steps = self.steps, outer_steps
        return branch_steps

    # ------------------------------------------------------------------ realize
    def _maybe_realize(self, node, value: Lazy) -> None:
        fanout = len(ops.users(node))
        if fanout > 1 and not value.reduces and _disjoint_slices(node):
            fanout = 1  # split into head and tail: each element is still computed once
        # recomputing a few ops on a small tensor in each user is cheaper than a kernel
        # launch of its own plus a round trip through memory
        cheap = not value.expensive and value.numel * value.op_count * (fanout - 1) <= self.backend.recompute_budget
        costly = (value.op_count >= 2 or value.expensive) and not cheap
        if value.op_count > MAX_FUSED_OPS:
            self.realize(value)
        elif fanout > 1 and costly and not (value.reduces and self._row_local_users(node)):
            if not value.reduces and not value.expensive and self._feeds_row_reduction(node):
                self.shared.append(value)  # written by the row kernel that first reads it
            else:
                self.realize(value)

    @staticmethod
    def _feeds_row_reduction(node) -> bool:
        """Some user reduces ``node``'s trailing dims (a LayerNorm after a residual add)."""
        rank = len(_meta(node).shape)
        for user in ops.users(node):
            if user.target in ops.REDUCTIONS or user.target in ops.VARIANCES or \
                    user.target is torch.ops.aten.var_mean.correction:
                dims = user.args[1] if len(user.args) > 1 else user.kwargs.get("dim")
                dims = [dims] if isinstance(dims, int) else list(dims or range(rank))
                if rank and sorted(d % rank for d in dims) == list(range(rank - len(dims), rank)):
                    return True
        return False

    def _shared_outputs(self, value: Lazy, outer: tuple, inner: int, build, absorb: bool) -> list[Lazy]:
        """Shared values (``self.shared``) the kernel of ``value`` over ``outer x (inner,)``
        reads, each written as an extra output of that kernel when ``absorb`` and it is
        read at the kernel's own element only; any other read gives it a kernel of its
        own first (so a shared value is never recomputed by two kernels).

        Found by giving each pending shared value a stand-in buffer while the kernel's
        IR is built (``build(values)`` -> exprs): a load of a stand-in is a read of that value.
        """
        absorbed = []
        while True:
            pending = [v for v in self.shared if v.realized is None and all(v is not a for a in absorbed)]
            for v in pending:
                v.realized = Buffer("shared", tuple(v.shape), contiguous_strides(v.shape), v.dtype, "kernel")
            exprs = build([value])
            stand_ins = {id(v.realized): v for v in pending}
            loads = [node for expr in exprs for node in walk(expr)
                     if isinstance(node, Load) and id(node.buffer) in stand_ins]
            read = {id(node.buffer): node.buffer for node in loads}
            own = {}
            for v in pending:
                stand_in = v.realized
                v.realized = None
                if id(stand_in) in read and v.numel == math.prod(outer) * inner:
                    position = flat_index(row_vars(outer) + [inner_var(inner)], tuple(outer) + (inner,))
                    own[id(stand_in)] = stand_in.expr(unflatten_index(position, v.shape)).index
            if not read:
                return absorbed
            for key, stand_in in read.items():
                v = stand_ins[key]
                if absorb and key in own and all(n.index == own[key] for n in loads if n.buffer is stand_in):
                    absorbed.append(v)
                else:
                    self.realize(v)

    @staticmethod
    def _row_local_users(node) -> bool:
        """Every user reduces ``node``'s rows or maps them elementwise (softmax's exp).

        Such a value is recomputed per row inside one row kernel, from data already
        in cache, instead of costing a second kernel and a round trip to memory.
        """
        shape = tuple(_meta(node).shape)
        for user in ops.users(node):
            if (user.target in ops.REDUCTIONS or user.target in ops.VARIANCES
                    or user.target is torch.ops.aten.var_mean.correction):
                continue
            elementwise = user.target in ops.UNARY or user.target in ops.BINARY
            if not elementwise or tuple(_meta(user).shape) != shape:
                return False
        return True

    def realize(self, value: Value) -> Buffer | StridedView:
        """Give ``value`` storage: a fused kernel writes it into a contiguous buffer."""
        if not isinstance(value, Lazy):
            return value
        if value.realized is not None:
            return value.realized
        shape = tuple(value.shape)
        if isinstance(value, Reduction):
            outer, inner = tuple(value.outer_shape), value.reduce_size
        else:
            outer, inner = (shape[:-1], shape[-1]) if shape else ((), 1)
        self.counter += 1
        buf = Buffer(f"buf{self.counter}", shape, contiguous_strides(shape), value.dtype, "kernel")
        if value.numel == 0:  # nothing to compute: just allocate
            value.realized = buf
            self.steps.append(self._empty(buf))
            return buf
        names = "_".join(dict.fromkeys(value.op_names)) or "copy"
        base_name = f"fused_{names[:48]}"
        name = f"{base_name}_{self.counter}"
        row_outputs = (0,) if isinstance(value, Reduction) else ()
        build = functools.partial(_output_exprs, outer=outer, inner=inner)
        while True:  # a reduction read at other rows than its own needs a buffer first
            exprs = _output_exprs([value], outer, inner)
            foreign = foreign_reduction(exprs, outer)
            if foreign is None:
                break
            epilogue = None if row_outputs else _row_epilogue(value, foreign)
            if epilogue is not None:  # computed once per row of the reduction it reads
                outer, inner, exprs = epilogue
                row_outputs = (0,)
                build = functools.partial(_row_exprs, outer=outer)
                break
            self.realize(foreign.origin)
        outputs, values = [buf], [value]
        if self.shared:
            values += self._shared_outputs(value, outer, inner, build, absorb=has_reduce(exprs) and not row_outputs)
            exprs = build(values)
            for v in values[1:]:
                self.counter += 1
                outputs.append(Buffer(f"buf{self.counter}", tuple(v.shape), contiguous_strides(v.shape), v.dtype,
                                      "kernel"))
        access = inner_access(exprs, inner)
        if not has_reduce(exprs) and (access.divisors or inner < NARROW_INNER):
            outer, inner, exprs, access = _choose_domain(value, outer, inner, exprs, access)
        kernel = FusedKernel(name, base_name, tuple(outer), inner, tuple(input_buffers(exprs)), tuple(outputs),
                             tuple(exprs), access, has_reduce(exprs), row_outputs)
        for v, out in zip(values, outputs):
            v.realized = out
        self.kernels.append(kernel)
        self.steps.append(KernelCall(kernel))
        return buf

    @staticmethod
    def _empty(buf: Buffer) -> ExternCall:
        """``aten::empty_strided`` writing ``buf`` (for tensors with no elements)."""
        args = [ExternArg("int_list", list(buf.shape)), ExternArg("int_list", list(buf.strides)),
                ExternArg("scalar_type", buf.dtype), ExternArg("none", None),
                ExternArg("none", None), ExternArg("none", None)]
        return ExternCall(torch.ops.aten.empty_strided.default, args, [buf])

    def _read_parts(self, value: Value) -> tuple:
        """Strided parts for a reader that takes strides (an extern call, a GEMM's
        input): a lazy plain read of a buffer is passed as that view, with no copy."""
        return affine_read(value) or self._strided(value)

    def _strided(self, value: Value) -> tuple:
        parts = as_strided_parts(value)
        if parts is None:
            self.realize(value)
            parts = as_strided_parts(value)
        return parts

    # ------------------------------------------------------------------ pointwise
    def _operand(self, arg):
        return self.env[arg] if hasattr(arg, "op") else arg

    def _compute_dtype(self, node, operands, compare: bool) -> torch.dtype:
        """The op's output dtype, or for comparisons the dtype torch compares in
        (``torch.result_type``: 0-d tensors and Python scalars promote weakly)."""
        out = _meta(node).dtype
        if not compare:
            return out
        probes = [torch.empty(v.shape, dtype=v.dtype, device="meta") if isinstance(v, Value) else v
                  for v in operands]
        if len(probes) == 1:
            return probes[0].dtype
        a, b = probes
        return torch.result_type(b, a) if not isinstance(a, torch.Tensor) else torch.result_type(a, b)

    def _pointwise(self, node, args, name: str, expensive: bool, compare=False, where=False, params=()):
        operands = [self._operand(a) for a in args]
        if any(not isinstance(v, (Value, int, float, bool)) for v in operands):
            return None
        out_shape = tuple(_meta(node).shape)
        out_dtype = _meta(node).dtype
        compute = self._compute_dtype(node, operands, compare)
        lazy = [v for v in operands if isinstance(v, Lazy) and v.realized is None]

        def fn(index):
            exprs = []
            for pos, v in enumerate(operands):
                want = torch.bool if where and pos == 0 else compute
                if isinstance(v, Value):
                    expr = v.expr(views.broadcast_index(v.shape, out_shape, index))
                    exprs.append(expr if v.dtype == want else Cast(expr, want))
                else:
                    exprs.append(Const(v, want))
            return Op(name, tuple(exprs), out_dtype, tuple(params))

        return Pointwise(out_shape, out_dtype, fn,
                         op_count=(name != "identity") + sum(v.op_count for v in lazy),
                         expensive=expensive or any(v.expensive for v in lazy),
                         op_names=sum((v.op_names for v in lazy), ()) + (ops.short_name(node.target),),
                         reduces=any(v.reduces for v in lazy))

    def _clamp(self, node):
        op = node.target
        low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min")
        high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max")
        if op is torch.ops.aten.clamp_max.default:
            low, high = None, node.args[1]
        if any(hasattr(b, "op") for b in (low, high)):
            return None
        return self._pointwise(node, [node.args[0]], "clamp", False, params=(low, high))

    def _clamp_tensor(self, node):
        """clamp with tensor bounds: min(max(x, low), high) in the promoted dtype (ATen's
        clamp kernel; a missing bound makes it ATen's maximum or minimum)."""
        op, values = node.target, dict((a.name, v) for a, v in extern.schema_values(node))
        if op is torch.ops.aten.clamp_min.Tensor:
            low, high = values["min"], None
        elif op is torch.ops.aten.clamp_max.Tensor:
            low, high = None, values["max"]
        else:
            low, high = values["min"], values["max"]
        if low is None and high is None:
            return None  # ATen raises: at least one bound is required
        name = "clamp_tensor" if low is not None and high is not None else ("maximum" if high is None else "minimum")
        return self._pointwise(node, [node.args[0]] + [b for b in (low, high) if b is not None], name, False)

    def _rounding_division(self, node):
        """div with rounding_mode and remainder, in the promoted dtype, as ATen computes them.

        Integer division fuses only by a nonzero Python number: ATen raises on an
        integer division by zero, which a kernel cannot, so a tensor divisor stays an
        extern call there. Float division by zero gives inf/nan, as in eager.
        """
        values = dict((a.name, v) for a, v in extern.schema_values(node))
        if node.target in ops.REMAINDERS:
            name = "remainder"
        else:
            mode = values.get("rounding_mode")
            if mode not in ops.DIV_ROUNDING:
                return None
            name = ops.DIV_ROUNDING[mode]
        a, b = node.args[0], node.args[1]
        if not _meta(node).dtype.is_floating_point:
            if not isinstance(b, (int, float)) or isinstance(b, bool) or b == 0:
                return None
        return self._pointwise(node, [a, b], name, name in ("remainder", "div_floor"))  # fmod inside

    def _copy(self, node):
        source = self._operand(node.args[0])
        val = _meta(node)
        if val.device != _meta(node.args[0]).device or tuple(val.shape) != tuple(source.shape):
            return None
        return self._pointwise(node, [node.args[0]], "identity", False)

    def _batch_norm(self, node):
        """Eval-mode batch norm: a per-channel (dim 1) affine map, fused as pointwise."""
        x, weight, bias, mean, var = (self._operand(a) for a in node.args[:5])
        eps = node.args[6] if len(node.args) > 6 else 1e-5
        stats = [v for v in (weight, bias, mean, var) if v is not None]
        if not isinstance(x, Value) or len(x.shape) < 2:
            return None
        channels = x.shape[1]
        if any(not isinstance(v, Value) or tuple(v.shape) != (channels,) for v in stats):
            return None
        out_shape = tuple(x.shape)

        def fn(index):
            channel = [index[1]]
            value = x.expr(index)
            m = mean.expr(channel) if mean is not None else Const(0.0, x.dtype)
            v = var.expr(channel) if var is not None else Const(1.0, x.dtype)
            scale = Op("rsqrt_eps", (v,), x.dtype, (float(eps),), convert=False)
            y = Op("normalize", (value, m, scale), x.dtype, convert=False)
            if weight is not None:
                y = Op("mul", (y, weight.expr(channel)), x.dtype, convert=False)
            if bias is not None:
                y = Op("add", (y, bias.expr(channel)), x.dtype, convert=False)
            return y

        lazy = [x] if isinstance(x, Lazy) and x.realized is None else []
        out = Pointwise(out_shape, x.dtype, fn, op_count=4 + sum(v.op_count for v in lazy),
                        expensive=any(v.expensive for v in lazy),
                        op_names=sum((v.op_names for v in lazy), ()) + ("batch_norm",),
                        reduces=any(v.reduces for v in lazy))
        return (out, None, None)

    # ------------------------------------------------------------------ views
    def _reindexed_operand(self, arg) -> Value:
        """The value of ``arg`` for an op that reads it at other indices (a view, flip or
        cat): one that reads an unrealised reduction gets a buffer first, so reductions
        stay in the rows they were computed in (a remapped index would hide that a row
        reads only its own reduction result)."""
        value = self._operand(arg)
        if isinstance(value, Lazy) and value.realized is None and value.reduces:
            self.realize(value)
        return value

    def _view(self, node):
        source = self._reindexed_operand(node.args[0])
        parts = as_strided_parts(source)
        if parts is not None:
            viewed = views.strided_view(node.target, parts, [self._operand(a) for a in node.args[1:]],
                                        node.kwargs)
            if viewed is not None:
                return viewed
        return self._lazy_view(node, source)

    def _flip(self, node):
        """``torch.flip``: a copy in eager, index arithmetic here (``i -> size - 1 - i``)."""
        source = self._reindexed_operand(node.args[0])
        shape = tuple(_meta(node).shape)
        return self._remap(source, shape, views.flip_index_map(shape, node.args[1]))

    def _max_pool(self, node):
        """``max_pool2d`` whose indices are unread: (values as a lazy value, no indices);
        None (an ATen call) otherwise (``pooling``)."""
        source = self._reindexed_operand(node.args[0])
        params = pooling.pool_params([self._operand(a) for a in node.args[1:]])
        if params is None or not pooling.is_values_only(node) or not pooling.supported(source):
            return None
        kernel, stride, padding, dilation = params
        out_shape = tuple(_meta(node)[0].shape)
        rows = pooling.row_max(source, out_shape[-2], kernel, stride, padding, dilation)
        if padding != (0, 0) or stride[1] > 1:
            self.realize(rows)  # separable: the rows' maximum over the padded width, then the columns'
        return pooling.column_max(rows, out_shape, kernel, stride, dilation), None

    def _cat(self, node):
        """``torch.cat`` as a lazy value: element ``index`` is read from the input whose
        slice of the cat dimension holds it (a ``Piecewise`` node), so the consumer's
        kernel reads the inputs directly and no copy is made. Inputs with no elements are
        left out (torch accepts a 1-D empty tensor next to any shape); inputs of another
        dtype are cast to the result's, as torch promotes them.
        """
        out = _meta(node)
        if out.numel() == 0:
            return None
        dim = (node.args[1] if len(node.args) > 1 else node.kwargs.get("dim", 0)) % out.dim()
        parts = [self._reindexed_operand(arg) for arg in node.args[0] if _meta(arg).numel() > 0]
        bounds = tuple(itertools.accumulate(value.shape[dim] for value in parts))

        def fn(index):
            pieces = []
            for value, end in zip(parts, bounds):
                start = end - value.shape[dim]
                expr = value.expr(index[:dim] + [index[dim] + (-start)] + index[dim + 1:])
                pieces.append(expr if expr.dtype == out.dtype else Cast(expr, out.dtype))
            return pieces[0] if len(pieces) == 1 else Piecewise(index[dim], bounds, tuple(pieces), out.dtype)

        lazy = [v for v in parts if isinstance(v, Lazy) and v.realized is None]
        return Pointwise(tuple(out.shape), out.dtype, fn, op_count=sum(v.op_count for v in lazy),
                         expensive=any(v.expensive for v in lazy),
                         op_names=("cat",) + sum((v.op_names for v in lazy), ()))

    def _lazy_view(self, node, source: Value):
        """Views of lazy values: new index -> old index arithmetic."""
        val = _meta(node)
        args = [self._operand(a) for a in node.args[1:]]
        if isinstance(val, (list, tuple)):
            pieces = [tuple(v.shape) for v in val]
            maps = [views.piece_index_map(node.target, args, tuple(source.shape), pieces, i)
                    for i in range(len(pieces))]
            return [self._remap(source, piece, m) for piece, m in zip(pieces, maps)]
        index_map = views.view_index_map(node.target, args, tuple(source.shape), tuple(val.shape))
        return self._remap(source, tuple(val.shape), index_map)

    def _remap(self, source: Value, shape: tuple, index_map):
        def fn(index):
            return source.expr(index_map(index))

        lazy = isinstance(source, Lazy) and source.realized is None
        return Pointwise(shape, source.dtype, fn, op_count=source.op_count if lazy else 0,
                         expensive=lazy and source.expensive,
                         op_names=source.op_names if lazy else (), reduces=lazy and source.reduces)

    # ------------------------------------------------------------------ reductions
    @staticmethod
    def _reduced_dims(node, shape) -> tuple[tuple[int, ...], bool]:
        """(sorted reduced dims, keepdim) of a reduction node over a tensor of ``shape``."""
        args = node.args
        dims = args[1] if len(args) > 1 else node.kwargs.get("dim")
        if dims is None or dims == []:
            dims = list(range(len(shape)))
        dims = [dims] if isinstance(dims, int) else list(dims)
        dims = sorted({d % max(len(shape), 1) for d in dims}) if shape else []
        keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
        return tuple(dims), bool(keepdim)

    def _reduce_dims(self, node, shape) -> tuple[int, bool] | None:
        """(first reduced dim, keepdim) when the reduced dims are a suffix of ``shape``."""
        dims, keepdim = self._reduced_dims(node, shape)
        if list(dims) != list(range(len(shape) - len(dims), len(shape))):
            return None
        return (len(shape) - len(dims) if shape else 0), keepdim

    def _make_reduction(self, node, source: Value, kind: str, mean: bool, dims: tuple, keepdim: bool,
                        out_dtype, src_fn=None) -> Reduction:
        """The reduction of ``source`` over ``dims`` (sorted). Its rows are the kept dims in
        their order and ``j`` runs over the reduced ones row-major: a reduction over leading
        dims (``x.sum(0)``) reads ``source`` with a stride along ``j``, which the backend's
        loop order handles (``kernel_ir.column_access``)."""
        shape = tuple(source.shape)
        kept = [d for d in range(len(shape)) if d not in dims]
        reduced_shape = tuple(shape[d] for d in dims)
        outer, inner = tuple(shape[d] for d in kept), math.prod(reduced_shape)
        out_shape = tuple(1 if d in dims else shape[d] for d in range(len(shape))) if keepdim else outer
        kept_dims = tuple(dims) if keepdim else ()
        red_shape_src = outer + (inner,)
        if src_fn is None:
            def src_fn(index):
                full = [None] * len(shape)
                for d, idx in zip(kept, index[:-1]):
                    full[d] = idx
                for d, idx in zip(dims, unflatten_index(index[-1], reduced_shape)):
                    full[d] = idx
                value = source.expr(full)
                return value if source.dtype == out_dtype else Cast(value, out_dtype)
        lazy = [source] if isinstance(source, Lazy) and source.realized is None else []
        src = Pointwise(red_shape_src, source.dtype, src_fn)
        return Reduction(out_shape, out_dtype, src, outer, inner, kind,
                         scale=(1.0 / inner if mean else 1.0), kept_dims=kept_dims,
                         op_count=1 + sum(v.op_count for v in lazy),
                         op_names=sum((v.op_names for v in lazy), ()) + (ops.short_name(node.target),))

    def _reduction(self, node):
        """sum/mean/prod/amax/amin over trailing dims. A result dtype other than the
        input's (``dtype=``, or bool/integer sum and prod accumulating in int64 as in
        eager) converts each element first."""
        source = self._operand(node.args[0])
        kind, mean = ops.REDUCTIONS[node.target]
        if source.numel == 0:
            return None
        out_dtype = _meta(node).dtype
        if out_dtype != source.dtype and kind not in ("sum", "prod"):
            return None
        return self._make_reduction(node, source, kind, mean, *self._reduced_dims(node, tuple(source.shape)),
                                    out_dtype)

    def _var_mean(self, node):
        """var_mean(x, dims, correction, keepdim) as two per-row passes (mean, then the sum
        of squared deviations; float sums accumulate in double), also for ``var``.

        Returns (var, mean), or None (an extern call) for dims that are not a suffix."""
        source = self._operand(node.args[0])
        if not source.dtype.is_floating_point or source.numel == 0:
            return None
        found = self._reduce_dims(node, tuple(source.shape))
        if found is None:
            return None
        first, keepdim = found
        keepdim = node.kwargs.get("keepdim", keepdim)
        correction = node.kwargs.get("correction", 1)
        correction = 1 if correction is None else correction
        shape = tuple(source.shape)
        inner = math.prod(shape[first:])
        reduced = tuple(range(first, len(shape)))
        row_mean = self._make_reduction(node, source, "sum", True, reduced, True, source.dtype)

        def squared_deviation(index):
            x = source.expr(index[:-1] + unflatten_index(index[-1], shape[first:]))
            m = row_mean.expr(index[:-1] + [Index.constant(0)] * (len(shape) - first))
            deviation = Op("sub", (x, m), source.dtype, convert=False)
            return Op("mul", (deviation, deviation), source.dtype, convert=False)

        var = self._make_reduction(node, source, "sum", False, reduced, keepdim, source.dtype,
                                   src_fn=squared_deviation)
        # ATen divides by max(N - correction, 0): 0/0 is nan, a positive sum over 0 is inf
        var.scale = 1.0 / (inner - correction) if inner - correction > 0 else math.inf
        var.op_count += row_mean.op_count
        mean = row_mean
        if not keepdim:  # a new value: squared_deviation keeps reading row_mean at its own rows
            mean = self._remap(row_mean, tuple(var.shape),
                               lambda index: index + [Index.constant(0)] * (len(shape) - first))
        return (var, mean)

    # ------------------------------------------------------------------ extern
    def _extern(self, node) -> Any:
        """An ATen call with every schema argument; its results become buffers."""
        op = node.target
        if not isinstance(op, torch._ops.OpOverload):
            raise AotpackError(f"unsupported construct: call to {op} in node '{node.name}' is not an "
                               "ATen operator; export the model so it uses torch operators only")
        args = [extern.argument(node, argument, value, self._operand, self._read_parts, self._scalar_constant)
                for argument, value in extern.schema_values(node)]
        val = _meta(node)
        outs = val if isinstance(val, (list, tuple)) else ([] if val is None else [val])
        # ops returning views (diagonal, unfold, ...) share their inputs' memory
        views = any(r.alias_info is not None for r in op._schema.returns)
        inputs = tuple(p[0] for a in args if a.kind in ("tensor", "tensor_list")
                       for p in (a.value if a.kind == "tensor_list" else [a.value]) if p is not None)
        buffers = []
        for t in outs:
            if t is None:
                buffers.append(None)
                continue
            if not isinstance(t, torch.Tensor):
                raise AotpackError(f"unsupported construct: {op} in node '{node.name}' returns a "
                                   f"{type(t).__name__}, not tensors (data-dependent values are not supported)")
            self.counter += 1
            buffers.append(Buffer(f"buf{self.counter}", tuple(t.shape), tuple(t.stride()), t.dtype, "extern",
                                  aliases=inputs if views else ()))
        self.steps.append(ExternCall(op, args, buffers))
        return buffers if isinstance(val, (list, tuple)) else buffers[0]


def _disjoint_slices(node) -> bool:
    """Every user of ``node`` takes a unit-step slice along one and the same dim, and no
    two slices overlap (``x[:4]`` and ``x[4:]``): together they read each element once."""
    users = ops.users(node)
    shape = tuple(_meta(node).shape)
    if not shape or any(u.target is not torch.ops.aten.slice.Tensor or u.kwargs for u in users):
        return False
    spans = []
    for user in users:
        dim, start, end, step = (list(user.args[1:]) + [0, None, None, 1][len(user.args) - 1:])[:4]
        dim = dim % len(shape)
        size = shape[dim]
        start, end = (0 if start is None else start), (size if end is None else end)
        start, end = [min(max(v + size if v < 0 else v, 0), size) for v in (start, end)]
        spans.append((dim, start, end, step))
    spans.sort(key=lambda span: span[1])
    return (len({span[0] for span in spans}) == 1 and all(span[3] == 1 for span in spans)
            and all(a[2] <= b[1] for a, b in zip(spans, spans[1:])))


def _output_exprs(values: list, outer: tuple, inner: int) -> list:
    """IR of each output over the domain ``outer x (inner,)``.

    A reduction output is read once per row; any other output may refine its shape
    in the domain (same elements, row-major), so its index is re-derived from the
    domain's flat position.
    """
    own_rows = row_vars(tuple(outer))
    domain = own_rows + [inner_var(inner)]
    exprs = []
    for value in values:
        if isinstance(value, Reduction):  # the kernel's own reduction (bypass .realized)
            exprs.append(value.node(own_rows))
        else:
            exprs.append(value.fn(unflatten_index(flat_index(domain, tuple(outer) + (inner,)), value.shape)))
    return exprs


def _row_exprs(values: list, outer: tuple) -> list:
    """IR of each value, one element per row of ``outer`` (row-major)."""
    rows = row_vars(outer)
    return [value.fn(unflatten_index(flat_index(rows, outer), value.shape)) for value in values]


def _row_epilogue(value, foreign) -> tuple | None:
    """(outer, inner, exprs) computing pointwise ``value`` once per row of the reduction
    ``foreign`` it reads (``sqrt(var)``, a mean reshaped to drop its kept dims), or None.

    ``value`` must have one element per reduction row, in row order, and every
    reduction it reads must then be read at its own rows (checked on the IR: a
    transposing view of the result does not qualify and gets a buffer as before).
    """
    red = foreign.origin
    if not isinstance(red, Reduction) or red.realized is not None or value.numel != red.numel:
        return None
    outer = tuple(red.outer_shape)
    exprs = _row_exprs([value], outer)
    if foreign_reduction(exprs, outer) is not None:
        return None
    return outer, red.reduce_size, exprs


def _choose_domain(value, outer: tuple, inner: int, exprs: list, access, depth: int = 0):
    """Reshape a pointwise kernel's iteration domain when that makes loads affine in j.

    The output is contiguous, so any row-major refinement of its shape is exact:
    * a narrow inner dimension merges with the dimensions before it while every load
      stays affine ((1M, 3) becomes one long vectorisable loop);
    * an inner dimension read as ``j // d`` and ``j % d`` (a reshape merging heads
      back) splits into ``(N/d, d)``, so the inner loop carries no div/mod; again while
      the new inner dimension is still divided (up to three splits: a cat of halves read
      with a step, ``(j % 64) % 32``, needs two).

    Returns:
        (outer, inner, exprs, access) of the chosen domain (the given one if no trial wins).
    """
    shape = tuple(outer) + (inner,)
    trials = []
    if inner < NARROW_INNER:
        trials += [(shape[:k], math.prod(shape[k:])) for k in range(len(shape) - 2, -1, -1)]
    trials += [(tuple(outer) + (inner // d,), d) for d in access.divisors if d < inner and inner % d == 0]
    for trial_outer, trial_inner in trials:
        trial_exprs = _output_exprs([value], trial_outer, trial_inner)
        trial = inner_access(trial_exprs, trial_inner)
        if trial.divisors and trial_inner < inner and depth < 2:
            trial_outer, trial_inner, trial_exprs, trial = _choose_domain(
                value, trial_outer, trial_inner, trial_exprs, trial, depth + 1)
        if not trial.divisors and trial.strided <= access.strided:
            return tuple(trial_outer), trial_inner, trial_exprs, trial
    return tuple(outer), inner, exprs, access


def lower(ep: ExportedProgram, dtypes: frozenset, backend=None) -> Graph:
    """Lower ``ep`` (static shapes, decomposed) into an ``ir.Graph``.

    ``dtypes`` are the dtypes the backend's kernels compute in: ops on other dtypes
    run as extern calls. ``backend``: the ``Backend`` whose GEMM implementations and
    fusion budget apply (default: the default backend).

    Raises:
        AotpackError: for constructs aotpack cannot run (control flow, non-tensor
            outputs, data-dependent shapes), naming the node.
    """
    return Lowerer(ep, frozenset(dtypes), backend or backends.get(backends.DEFAULT)).run()
