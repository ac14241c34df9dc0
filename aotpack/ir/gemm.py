"""Tunable GEMM/convolution steps: several implementations of one linear, conv2d or
batched GEMM of two runtime operands (``bmm_lowering``), timed by PGO like a kernel's candidates, the winner baked into
the model.

A ``GemmStep`` computes one ``GemmMatch`` (``gemm_match``: the GEMM and its epilogue)
into one output buffer. Each ``GemmVariant`` is a list of ordinary steps writing that
buffer; the backend decides which it offers (``Backend.gemm_variants``; the CPU backend's
menu is ``backends/cpu/gemm_menu.py``):

* ``aten``: the ATen call (``addmm``/``mm``/``convolution``), then the epilogue as a
  fused aotpack kernel (what aotpack runs without this module);
* calls into the backend's extern libraries, named by the backend, on a weight they
  pack (``PackedWeight``), the epilogue fused where the library can;
* ``template``: aotpack's own kernel (GEMM, direct or depthwise convolution, bmm), whose
  tilings are candidates like a fused kernel's; a GEMM template's weight is transformed
  at build time by the backend (``Backend.weight_transform``) and shipped as a constant
  (a layout of aotpack's own, not the device's); where the dense weight is read anyway
  (a tied embedding), the model source transforms it at load instead, so no weight is
  shipped twice;
* ``winograd`` (3x3 stride-1 conv2d): aotpack's F(2x2, 3x3) kernel
  (``template_kernels.WinogradConvKernel``) on filters transformed at build time, bias and
  epilogue fused.

An attention block (``attention_lowering``) is a step of kind ``attention`` whose variants
are the unfused lowering, one per combination of its two bmm steps' variants
(``unfused:aten+aten`` ...; those bmm steps are flattened into it), and ``template``,
aotpack's fused attention kernel (``template_kernels.AttentionKernel``).

Packed weights (``PackedWeight``) are opaque tensors whose layout the extern library picks
for the device it runs on; the archive ships the dense weight (it is a constant anyway)
and the model packs it once at load (``create``) with the same op the build used: packed
bytes would tie the archive to the build machine.

After tuning, ``resolve`` replaces every ``GemmStep`` by its winner's steps, so codegen,
liveness and packaging see only extern calls and kernel launches.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from aotpack.ir.choice import ChoiceStep
from aotpack.ir.graph import Buffer, CondStep, ExternArg, ExternCall, KernelCall, walk_steps


#: Variants that are aotpack's own kernels, epilogue fused, planned with the graph (nothing
#: allocated per call); a close call in tuning goes to the lower rank, extern calls last. An
#: attention step's unfused variant of two bmm templates is all aotpack kernels too, so it
#: is ranked before the ATen ones (docs/measurements.md, "Own kernels win close calls").
OWN_KERNEL_RANKS = {"template": 0, "winograd": 1, "unfused:template+template": 1}


@dataclass(eq=False)
class PackedWeight:
    """``buffer`` (kind ``packed``) = ``op(*args)``, computed once at load from a constant."""

    buffer: Buffer
    op: object  # torch._ops.OpOverload, or a backend's weight transform (``Backend.weight_transform``)
    args: list  # ExternArg; tensor arguments are whole constants


@dataclass(eq=False)
class GemmVariant:
    """One implementation: ``steps`` (ExternCall/KernelCall) writing the step's output."""

    name: str
    steps: list
    packed: list  # PackedWeight it reads
    #: (panels constant, dense weight, the backend's transform) of a GEMM template: packed at
    #: build time, or at load (``resolve``) where the dense weight is read anyway (a tied embedding)
    panels: tuple = ()


@dataclass(eq=False)
class GemmStep(ChoiceStep):
    """A linear/conv2d with its epilogue, or a bmm, implemented by one of ``variants`` (0 = the
    backend's first, an extern call: ``Backend.gemm_variants``): a choice point (``ir.choice``) whose candidates are the variants, by name.

    ``choice_id`` is ``gemm:<name>``; ``shape`` describes it (``MxKxN`` for a linear,
    ``NCHW->KCRS`` for a conv, ``BxMxKxN`` for a bmm).
    """

    name: str
    kind: str
    shape: str
    epilogue: str
    variants: list
    output: Buffer
    #: constants every variant replaces (a convolution's weight, bias and batch-norm
    #: statistics, folded into new ones): not shipped unless another step reads them
    replaced: tuple = ()

    @property
    def choice_id(self) -> str:
        """The step's id among the build's choice points."""
        return f"gemm:{self.name}"

    @property
    def choice_kind(self) -> str:
        """The step's kind (``linear``, ``conv2d``, ``bmm``, ``attention``)."""
        return self.kind

    @property
    def label(self) -> str:
        """The step's name."""
        return self.name

    def alternatives(self) -> list[tuple[str, list]]:
        """``(variant name, steps)`` per variant."""
        return [(v.name, v.steps) for v in self.variants]

    def ranks(self) -> list[int]:
        """``OWN_KERNEL_RANKS`` per variant: a close call goes to aotpack's own kernels."""
        return [OWN_KERNEL_RANKS.get(v.name, len(OWN_KERNEL_RANKS)) for v in self.variants]

    def signature(self, kernel_versions: dict | None = None) -> str:
        """Text of what the variants run (no buffer names): equal text, equal timings.
        ``kernel_versions``: kernel_id -> a digest of what compiles it (``choice_cache.kernel_versions``)."""
        lines = [f"{self.kind} {self.shape} {self.epilogue}"]
        for variant in self.variants:
            lines.append(f"variant {variant.name}")
            for s in variant.steps:
                if isinstance(s, ExternCall):
                    lines.append(f"  {s.op} " + " ".join(_arg_text(a) for a in s.args))
                elif isinstance(s, KernelCall):
                    lines.append(f"  kernel {s.kernel.kernel_id} {(kernel_versions or {}).get(s.kernel.kernel_id, '')}")
        return "\n".join(lines)

    def details(self) -> dict:
        """``shape`` and ``epilogue`` for the manifest's choice entry."""
        return {"shape": self.shape, "epilogue": self.epilogue}

    def summary(self) -> str:
        """``gemm NAME KIND SHAPE +EPILOGUE [variants]`` (``Graph.dump``)."""
        return f"gemm {self.name} {self.kind} {self.shape} +{self.epilogue} [{', '.join(v.name for v in self.variants)}]"

    def reads(self) -> list[Buffer]:
        """What any variant reads."""
        return [b for v in self.variants for s in v.steps for b in s.reads()]

    def writes(self) -> list[Buffer]:
        """What any variant writes (the output and the variants' temporaries)."""
        return [b for v in self.variants for s in v.steps for b in s.writes()]

    def buffers(self) -> list[Buffer]:
        """Every buffer the step touches."""
        return self.writes() + self.reads()


def _arg_text(arg) -> str:
    if arg.kind == "tensor":
        base, sizes, strides, offset = arg.value
        return f"tensor:{base.kind}:{list(sizes)}:{list(strides)}:{offset}"
    return f"{arg.kind}:{arg.value!r}"


def _resolve_steps(steps: list, choices: dict) -> list:
    out = []
    for step in steps:
        if isinstance(step, ChoiceStep):
            out.extend(step.chosen_steps(_index(step, choices)))
        elif isinstance(step, CondStep):
            out.append(dataclasses.replace(step, true_steps=_resolve_steps(step.true_steps, choices),
                                           false_steps=_resolve_steps(step.false_steps, choices)))
        else:
            out.append(step)
    return out


def _index(point, choices: dict) -> int:
    """The chosen candidate of ``point`` in ``choices`` (``choice_id -> Choice``), else 0."""
    choice = choices.get(point.choice_id)
    return choice.index if choice else 0


def gemm_steps(graph) -> list[GemmStep]:
    """Every ``GemmStep`` of ``graph``, in order."""
    return [s for s in walk_steps(graph.steps) if isinstance(s, GemmStep)]


def resolve(graph, choices: dict):
    """``graph`` with each ``GemmStep`` replaced by its chosen variant's steps (variant 0
    where ``choices`` has no entry), and only the kernels, packed weights and GEMM
    constants those use.
    A graph without GEMM steps comes back unchanged."""
    if not gemm_steps(graph):
        return graph
    steps = _resolve_steps(graph.steps, choices)
    launched = {id(s.kernel) for s in walk_steps(steps) if isinstance(s, KernelCall)}
    read = {id(b) for s in walk_steps(steps) if isinstance(s, ExternCall) for b in s.reads()}
    packed = [p for p in graph.packed if id(p.buffer) in read]
    # constants only the losing variants read (a dense weight or its template panels) are not shipped
    offered = {id(b) for step in gemm_steps(graph) for b in [*step.reads(), *step.replaced, *_packed_from(step)]}
    needed = {id(b) for s in walk_steps(steps) for b in s.reads()}
    needed |= {id(a.value[0]) for p in packed for a in p.args if a.kind == "tensor"}
    needed |= {id(parts[0]) for parts in graph.outputs}
    constants = [b for b in graph.constants if id(b) not in offered or id(b) in needed]
    for panels, weight, transform in _chosen_panels(graph, choices):
        if id(weight) in needed:  # shipped once, dense; the model packs the panels at load
            constants = [b for b in constants if b is not panels]
            packed.append(PackedWeight(panels, transform, [ExternArg("tensor", (weight, weight.shape,
                                                                                 weight.strides, 0))]))
    return dataclasses.replace(graph, steps=steps, kernels=[k for k in graph.kernels if id(k) in launched],
                               packed=packed, constants=constants,
                               constant_tensors={b.name: graph.constant_tensors[b.name] for b in constants})


def _packed_from(step: GemmStep) -> list[Buffer]:
    """The dense weights the step's variants pack at load (the extern libraries' ``PackedWeight`` args)."""
    return [a.value[0] for v in step.variants for p in v.packed for a in p.args if a.kind == "tensor"]


def _chosen_panels(graph, choices: dict) -> list[tuple]:
    """(panels, dense weight, transform) of every GEMM template that won its step."""
    found = []
    for step in gemm_steps(graph):
        found.extend(step.variants[_index(step, choices)].panels)
    return found
