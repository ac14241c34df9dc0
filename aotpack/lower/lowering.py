"""Lower an exported, decomposed FX graph into the aotpack ``ir.Graph``.

The ``Lowerer`` walks the graph once, in order. Pointwise ops (with broadcasting), views
and reductions stay lazy and fuse; each ATen op is lowered by the handler registered for
it (``registry``: ``pointwise``, ``reductions``, ``shape_ops``), and a lazy value gets a
buffer (``realize``) when an extern call or a graph output needs it, or when several
users would otherwise recompute something costly. Every other op becomes an
``ExternCall`` into ATen, so any op torch.export produces runs, fused or not. Matched
GEMMs, convolutions, bmms and attention blocks go to their own lowering modules, which
drive the ``Lowerer`` through its public methods.
"""
from __future__ import annotations

import dataclasses
import logging
import operator
from typing import Any

import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind

from aotpack.errors import AotpackError
from aotpack.ir.graph import (
    Buffer, CondStep, CopyBack, ExternArg, ExternCall, Graph, Lazy, Pointwise, StridedView, Value,
    contiguous_strides, walk_steps,
)
from aotpack.ir.kernel import FusedKernel, Op, inner_access, input_buffers
from aotpack.lower import (attention_lowering, bmm_lowering, constant_folding, extern, gemm_lowering, gemm_match, ops,
                           realize, registry)
from aotpack.lower import pointwise, reductions, shape_ops  # noqa: F401  (their handlers register on import)
from aotpack.lower.registry import meta

log = logging.getLogger("aotpack")




class Lowerer:
    """Walks the FX graph once, in order, building steps and kernels."""

    def __init__(self, ep: ExportedProgram, backend):
        self.ep = ep
        self.backend = backend
        self.dtypes = frozenset(backend.dtypes)
        self.env: dict[Any, Any] = {}
        self.steps: list = []
        self.kernels: list[FusedKernel] = []
        self.inputs: list[Buffer] = []
        self.constants: list[Buffer] = []
        self.constant_tensors: dict[str, torch.Tensor] = {}
        self.constant_sources: dict[str, torch.Tensor] = {}  # as exported: storage identity kept
        self.counter = 0
        #: costly values with several users, one of them a row reduction: they get a
        #: buffer from the first kernel that reads them (``realize``)
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
        """A shared value written by a row kernel (``realize``) that no later step
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
        val = meta(node)
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
            found = self.strided(value)
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
            return self.strided(self.realize(copy))
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
        return self.lower_op(node)

    def lower_nodes(self, nodes) -> Any:
        """Lower ``nodes`` one by one as ordinary ops (no GEMM matching); the last one's value."""
        for node in nodes:
            self.env[node] = self.lower_op(node)
        return self.env[nodes[-1]]

    def lower_op(self, node):
        """Lower one node as an ordinary op (no GEMM or attention matching): a registered
        handler's lazy value, or an extern call; a fresh lazy value may get a buffer here."""
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
            return self.extern(node)
        if isinstance(result, Lazy) and result.realized is None:
            realize.maybe_realize(self, node, result)
        return result

    def _fusable(self, node) -> bool:
        """All tensors involved have a dtype the backend's kernels compute in."""
        tensors = [meta(a) for a in node.all_input_nodes] + [meta(node)]
        flat = []
        for t in tensors:
            flat.extend(t if isinstance(t, (list, tuple)) else [t])
        return all(isinstance(t, torch.Tensor) and t.dtype in self.dtypes for t in flat)

    def _lower_fusable(self, node):
        """Lower ``node`` through the handler registered for its op (``registry``); None
        when there is none or it declines this call (an extern call then)."""
        handler = registry.handler(node.target)
        return None if handler is None else handler(self, node)

    # ------------------------------------------------------------------ control flow
    def _cond(self, node) -> list[Buffer]:
        """Lower both branches of ``torch.cond`` into their own step lists.

        The predicate and operands get buffers first, so nothing computed outside a
        branch is recomputed (or half-computed) inside it.
        """
        pred_arg, true_attr, false_attr, operands = node.args[:4]
        pred = self.operand(pred_arg)
        if pred.dtype != torch.bool:  # cond takes any one-element tensor: test it against 0
            source = pred
            pred = Pointwise(tuple(source.shape), torch.bool,
                             lambda index: Op("ne_zero", (source.expr(index),), torch.bool, convert=False),
                             op_count=1, op_names=("ne",))
        pred = self.strided(pred)
        inputs = [StridedView(*self.strided(self.operand(o))) for o in operands]
        results = []
        for t in meta(node):  # contiguous: a branch may return an expanded (stride 0) view
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
                    self.steps.append(CopyBack(result, StridedView(*self.strided(self.env[value_node]))))
        branch_steps, self.steps = self.steps, outer_steps
        return branch_steps

    # ------------------------------------------------------------------ the surface op lowerings use
    def operand(self, arg) -> Any:
        """The value of an FX argument: a node's lowered value, anything else as it is."""
        return self.env[arg] if hasattr(arg, "op") else arg

    def realize(self, value: Value) -> Buffer | StridedView:
        """Give ``value`` storage (``realize.realize``): a buffer or view comes back as it is."""
        return realize.realize(self, value)

    def strided(self, value: Value) -> tuple:
        """``(base, shape, strides, offset)`` of ``value``, realised first when it is not a view."""
        return realize.strided(self, value)

    def read_parts(self, value: Value) -> tuple:
        """Strided parts for a reader that takes strides (an extern call, a GEMM's
        input): a lazy plain read of a buffer is passed as that view, with no copy."""
        return realize.read_parts(self, value)

    def pack_weight(self, kind: str, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (a constant, at build time) in the layout the backend's template
        kernels read as ``kind`` (``Backend.weight_transform``)."""
        return self.backend.weight_transform(kind)(tensor)

    def weight_transform(self, kind: str):
        """The backend's function for ``kind`` (``Backend.weight_transform``): what
        ``pack_weight`` applies, also run at load where a weight is packed there."""
        return self.backend.weight_transform(kind)

    # ------------------------------------------------------------------ extern
    def extern(self, node) -> Any:
        """An ATen call with every schema argument; its results become buffers."""
        op = node.target
        if not isinstance(op, torch._ops.OpOverload):
            raise AotpackError(f"unsupported construct: call to {op} in node '{node.name}' is not an "
                               "ATen operator; export the model so it uses torch operators only")
        args = [extern.argument(node, argument, value, self.operand, self.read_parts, self._scalar_constant)
                for argument, value in extern.schema_values(node)]
        val = meta(node)
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


def lower(ep: ExportedProgram, backend) -> Graph:
    """Lower ``ep`` (static shapes, decomposed) into an ``ir.Graph``.

    ``backend`` (a ``backends.base.Backend``) decides what is device-specific: the dtypes its
    kernels compute in (ops on other dtypes run as extern calls) and the layouts its
    template kernels read their weights in (``Backend.weight_transform``).

    Raises:
        AotpackError: for constructs aotpack cannot run (control flow, non-tensor
            outputs, data-dependent shapes), naming the node.
    """
    return Lowerer(ep, backend).run()
