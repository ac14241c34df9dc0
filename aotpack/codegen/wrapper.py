"""Stage: CppWrapper codegen after autotuning (``generate``).

Each distinct kernel's winner is fixed by now; the backend renders the host source
(the backend's ``generate_model``) with every winner's ``lib_kernel`` and ``kernel_key`` baked in.
"""
from __future__ import annotations

from aotpack.errors import AotpackError
from aotpack.ir.choice import ChoiceStep
from aotpack.ir.graph import walk_steps


def winners(candidate_sets: dict, choices: dict) -> list:
    """``(FusedKernel, winning candidate)`` per distinct kernel, in first-use order."""
    return [(cs.kernel, cs.candidates[choices[kid].index]) for kid, cs in candidate_sets.items()]


def generate(graph, backend, candidate_sets: dict, choices: dict, meta: dict) -> str:
    """The model's host source for the resolved ``graph`` (``gemm.resolve``: no choice
    steps left) with the chosen candidates.

    Args:
        candidate_sets: ``kernel_id -> CandidateSet`` (``candidates.prepare``).
        choices: ``kernel_id -> Choice`` (``autotune.tune``).
        meta: name, version, aotpack_version, device_limit.
    """
    if any(isinstance(step, ChoiceStep) for step in walk_steps(graph.steps)):
        raise AotpackError("internal error: codegen got a graph with choice steps left (resolve it first)")
    used = {k.kernel_id for k in graph.kernels}
    sets = {kid: cs for kid, cs in candidate_sets.items() if kid in used}
    return backend.generate_model(graph, winners(sets, choices), meta)
