"""The aotpack IR: index arithmetic, buffers, and lazy tensor values.

Lowering turns every FX value into one of:

* ``Buffer`` – a materialised tensor (graph input, constant, extern-call result, or
  fused-kernel output) with static shape and strides (in elements);
* ``StridedView`` – a view of a buffer expressible as (sizes, strides, offset);
* ``Pointwise`` – a lazy value: a function from an index to a kernel IR node;
* ``Reduction`` – a lazy reduction over the innermost ``reduce_size`` elements.

Lazy values build the fused-kernel IR (Inductor's ``inner_fn`` idea): ``value.expr(index)``
returns the ``kernel_ir`` node of the element at ``index``. Views of lazy values become
index arithmetic (``Index``), so they cost nothing at run time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from aotpack.ir import kernel as kernel_ir
from aotpack.ir.choice import ChoiceStep
from aotpack.ir.index import Atom, Index, contiguous_strides, flat_index, unflatten_index  # noqa: F401

# ----------------------------------------------------------------------------- values


class Value:
    """A tensor value during lowering: static ``shape`` and ``dtype``."""

    shape: tuple[int, ...]
    dtype: torch.dtype

    def expr(self, index: Sequence[Index]):  # pragma: no cover - interface
        """The kernel IR node (``kernel_ir``) of element ``index``."""
        raise NotImplementedError

    @property
    def numel(self) -> int:
        """Element count."""
        return math.prod(self.shape)


@dataclass(eq=False)
class Buffer(Value):
    """A materialised tensor.

    ``kind`` is ``input`` (graph input), ``constant`` (weight/buffer, from the
    safetensors file), ``extern`` (result of an ATen call) or ``kernel`` (written by a
    fused kernel). Strides are in elements.
    """

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: torch.dtype
    kind: str
    #: buffers whose memory this one may share (an extern op that returns a view)
    aliases: tuple = ()

    def roots(self) -> list["Buffer"]:
        """This buffer and every buffer it may alias, transitively."""
        found, todo = [], [self]
        while todo:
            buf = todo.pop()
            if all(buf is not f for f in found):
                found.append(buf)
                todo.extend(buf.aliases)
        return found

    def expr(self, index):
        offset = Index.constant(0)
        for idx, stride in zip(index, self.strides):
            offset = offset + idx.scale(stride)
        return kernel_ir.Load(self, offset)


@dataclass(eq=False)
class StridedView(Value):
    """A view of ``base`` given as sizes, strides and element offset (as_strided)."""

    base: Buffer
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    offset: int

    @property
    def dtype(self):
        return self.base.dtype

    def expr(self, index):
        offset = Index.constant(self.offset)
        for idx, stride in zip(index, self.strides):
            offset = offset + idx.scale(stride)
        return kernel_ir.Load(self.base, offset)


class Lazy(Value):
    """A value computed inside a fused kernel until ``realize`` gives it a buffer."""

    realized: Buffer | None = None
    #: number of arithmetic ops in the expression tree (guides fan-out realisation)
    op_count: int = 0
    #: a reduction or transcendental op somewhere inside: costly to recompute
    expensive: bool = False
    #: short names of the ops inside, for kernel names
    op_names: tuple = ()
    #: reads an unrealised reduction: its kernel's rows are the reduction's rows
    reduces: bool = False


@dataclass(eq=False)
class Pointwise(Lazy):
    """Element ``index`` is the IR node ``fn(index)``."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    fn: Callable
    op_count: int = 0
    expensive: bool = False
    op_names: tuple = ()
    reduces: bool = False
    realized: Buffer | None = None

    def expr(self, index):
        if self.realized is not None:
            return self.realized.expr(index)
        return self.fn(list(index))


@dataclass(eq=False)
class Reduction(Lazy):
    """Reduce ``source`` over its innermost ``reduce_size`` elements.

    ``source`` has shape ``outer_shape + (reduce_size,)``; the value has ``shape``
    (``outer_shape`` with kept dims of size 1 where ``keepdim``). ``kind`` is one of
    ``sum``, ``max``, ``min``, ``prod``; ``scale`` multiplies the result (1/N for mean).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    source: Value
    outer_shape: tuple[int, ...]
    reduce_size: int
    kind: str
    scale: float = 1.0
    kept_dims: tuple[int, ...] = ()
    op_count: int = 1
    expensive: bool = True
    op_names: tuple = ()
    reduces: bool = True
    realized: Buffer | None = None

    def expr(self, index):
        if self.realized is not None:
            return self.realized.expr(index)
        return self.node([idx for dim, idx in enumerate(index) if dim not in self.kept_dims])

    def node(self, rows) -> "kernel_ir.Reduce":
        """The reduction read at row index ``rows`` (its source built at its own rows)."""
        own = kernel_ir.row_vars(tuple(self.outer_shape)) + [kernel_ir.inner_var(self.reduce_size)]
        return kernel_ir.Reduce(self.kind, self.source.fn(own), self.reduce_size, tuple(rows),
                                tuple(self.outer_shape), self.dtype, self.scale, origin=self)


def base_buffer(value: Value) -> Buffer | None:
    """The buffer behind a value that needs no kernel to read, else None."""
    if isinstance(value, Buffer):
        return value
    if isinstance(value, StridedView):
        return value.base
    if isinstance(value, Lazy) and value.realized is not None:
        return value.realized
    return None


def as_strided_parts(value: Value) -> tuple[Buffer, tuple, tuple, int] | None:
    """(base, sizes, strides, offset) when the value is a buffer or a view of one."""
    if isinstance(value, Lazy) and value.realized is not None:
        value = value.realized
    if isinstance(value, Buffer):
        return value, value.shape, value.strides, 0
    if isinstance(value, StridedView):
        return value.base, value.shape, value.strides, value.offset
    return None


def affine_read(value: Value) -> tuple[Buffer, tuple, tuple, int] | None:
    """(base, sizes, strides, offset) of a lazy value that only reads one buffer at an
    affine index (a ``clone``/``contiguous`` of a view, an expanded slice), else None.

    Such a value needs no copy for a reader that takes strides (an ATen call): it is
    that strided view of the buffer. Not for graph outputs, which must not alias.
    """
    if not isinstance(value, Lazy) or value.realized is not None or value.reduces:
        return None
    shape = tuple(value.shape)
    names = [f"i{k}" for k in range(len(shape))]
    expr = value.expr([Index.var(name, size) for name, size in zip(names, shape)])
    while isinstance(expr, kernel_ir.Op) and expr.name == "identity" and expr.args[0].dtype == expr.dtype:
        expr = expr.args[0]
    if not isinstance(expr, kernel_ir.Load) or expr.index.atoms() or expr.index.const < 0:
        return None
    if expr.index.variables() - set(names):
        return None
    return expr.buffer, shape, tuple(expr.index.coefficient(name) for name in names), expr.index.const


# ----------------------------------------------------------------------------- graph


@dataclass(eq=False)
class ExternArg:
    """One schema argument of an extern call, already normalised.

    ``kind`` is an ``AotpackArgKind`` name (``tensor``, ``int``, ``double``, ``bool``,
    ``int_list``, ``double_list``, ``bool_list``, ``tensor_list``, ``none``, ``string``,
    ``scalar_type``, ``layout``, ``device``, ``memory_format``); tensors are
    ``(base, sizes, strides, offset)`` tuples.
    """

    kind: str
    value: object


# ----------------------------------------------------------------------------- steps
# Every step says once which buffers it reads and writes; the Python-mode executor,
# buffer liveness and the C++ emitters all use these (``buffers`` in first-use order).


@dataclass(eq=False)
class ExternCall:
    """``outputs = aten::<op>.<overload>(*args)`` through the ATen dispatcher."""

    op: object  # torch._ops.OpOverload
    args: list[ExternArg]
    outputs: list[Buffer | None]

    def reads(self) -> list[Buffer]:
        """Base buffers of the tensor arguments."""
        found = []
        for arg in self.args:
            if arg.kind == "tensor":
                found.append(arg.value[0])
            elif arg.kind == "tensor_list":
                found.extend(p[0] for p in arg.value if p is not None)
        return found

    def writes(self) -> list[Buffer]:
        """The result buffers (None results, e.g. unused optional outputs, skipped)."""
        return [b for b in self.outputs if b is not None]

    def buffers(self) -> list[Buffer]:
        """Every buffer the step touches."""
        return self.writes() + self.reads()


@dataclass(eq=False)
class KernelCall:
    """Launch ``kernel`` (a ``kernel_ir.FusedKernel``, its chosen candidate) on its buffers."""

    kernel: object

    def reads(self) -> list[Buffer]:
        """The kernel's inputs."""
        return list(self.kernel.inputs)

    def writes(self) -> list[Buffer]:
        """The kernel's outputs (fresh buffers)."""
        return list(self.kernel.outputs)

    def buffers(self) -> list[Buffer]:
        """Every buffer the step touches."""
        return self.reads() + self.writes()


@dataclass(eq=False)
class CopyBack:
    """Write ``source`` into ``target``: a mutated input/constant, or a branch result."""

    target: Buffer
    source: Buffer | StridedView

    def reads(self) -> list[Buffer]:
        """The source's base buffer."""
        return [self.source.base]

    def writes(self) -> list[Buffer]:
        """The target, overwritten in place."""
        return [self.target]

    def buffers(self) -> list[Buffer]:
        """Every buffer the step touches."""
        return [self.target, self.source.base]


@dataclass(eq=False)
class CondStep:
    """``torch.cond``: run ``true_steps`` or ``false_steps`` by the 0-d bool ``pred``.

    ``results`` are allocated before the branch runs; each branch ends by copying its
    outputs into them, so code after the cond sees one layout whichever branch ran.
    """

    pred: tuple  # (base, sizes, strides, offset)
    results: list[Buffer]
    true_steps: list
    false_steps: list

    def reads(self) -> list[Buffer]:
        """The predicate and whatever either branch reads."""
        return [self.pred[0], *(b for s in self.true_steps + self.false_steps for b in s.reads())]

    def writes(self) -> list[Buffer]:
        """The results and whatever either branch writes."""
        return [*self.results, *(b for s in self.true_steps + self.false_steps for b in s.writes())]

    def buffers(self) -> list[Buffer]:
        """Every buffer the step touches, branches included."""
        return [self.pred[0], *self.results, *(b for s in self.true_steps + self.false_steps for b in s.buffers())]


@dataclass(eq=False)
class Graph:
    """The lowered program: steps in execution order over named buffers."""

    inputs: list[Buffer]
    constants: list[Buffer]
    constant_tensors: dict  # name -> torch.Tensor (contiguous)
    steps: list
    outputs: list  # (base, sizes, strides, offset) per graph output
    kernels: list  # kernel_ir.FusedKernel, in creation order
    mutated_buffers: list[str] = field(default_factory=list)  # constants written in place
    mutated_inputs: list[str] = field(default_factory=list)  # caller's inputs written in place
    # name -> tensor as exported (storage shared between tied names), every lifted
    # parameter/buffer/constant including those forward never reads; see aotpack.archive.weights
    constant_sources: dict = field(default_factory=dict)
    packed: list = field(default_factory=list)  # gemm.PackedWeight: weights packed once at load

    def distinct_kernels(self) -> list:
        """One ``FusedKernel`` per ``kernel_id`` (repeated layers share one), in first-use order."""
        found = {}
        for kernel in self.kernels:
            found.setdefault(kernel.kernel_id, kernel)
        return list(found.values())

    def extern_calls(self) -> list:
        """Every ``ExternCall`` step, torch.cond branches included, in order."""
        return [step for step in walk_steps(self.steps) if isinstance(step, ExternCall)]

    def dump(self) -> str:
        """The program as text: its steps in order, then each distinct kernel's IR."""
        lines = [f"graph: {len(self.inputs)} inputs, {len(self.constants)} constants, "
                 f"{len(self.kernels)} kernel launches of {len(self.distinct_kernels())} distinct kernels"]
        lines += _dump_steps(self.steps, "  ")
        for kernel in self.distinct_kernels():
            lines += ["", f"# kernel_id {kernel.kernel_id}", str(kernel)]
        return "\n".join(lines) + "\n"


def walk_steps(steps: list):
    """Every step of ``steps`` in order, the steps of both ``torch.cond`` branches included."""
    for step in steps:
        yield step
        if isinstance(step, CondStep):
            yield from walk_steps(step.true_steps)
            yield from walk_steps(step.false_steps)


def _dump_steps(steps: list, indent: str) -> list[str]:
    lines = []
    for step in steps:
        if isinstance(step, KernelCall):
            lines.append(f"{indent}launch {step.kernel.name}")
        elif isinstance(step, ExternCall):
            lines.append(f"{indent}extern {step.op}")
        elif isinstance(step, CopyBack):
            lines.append(f"{indent}copy into {step.target.name}")
        elif isinstance(step, ChoiceStep):  # before tuning picks a candidate
            lines.append(f"{indent}{step.summary()}")
        elif isinstance(step, CondStep):
            lines.append(f"{indent}cond")
            lines += _dump_steps(step.true_steps, indent + "  then ")
            lines += _dump_steps(step.false_steps, indent + "  else ")
    return lines
