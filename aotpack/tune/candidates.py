"""Stage: TopN candidates per distinct fused kernel (``prepare``).

For each kernel the backend's solver proposes up to ``topn`` tilings, the heuristic
default first (or, with ``--cost-model``, the best of its whole space by the backend's
cost model); each is rendered into its own static-kernel source, plus one wrapper
source holding all their ``TilingInfo``. Kernels with the same ``kernel_id`` (repeated
layers) share one ``CandidateSet``: compiled once, tuned once, shipped once.

Where the backend's estimates rank a kernel's tilings (``Backend.ranks_tilings``: the
GEMM, convolution, Winograd and bmm templates on the CPU), a candidate estimated at least
``--far-behind-factor`` (1.4) times the best one is dropped (``_without_far_behind``), so
candidate 0 may then be the solver's second or third tiling. Tiny kernels (``_is_tiny``)
compile only their candidate 0 (the default tiling, or the cost model's best). So do the
runners-up of a GEMM step (``_runners_up``): an aotpack kernel variant (a direct
convolution beside a Winograd one) whose best estimate is ``RUNNER_UP_FACTOR`` times
another variant's. PGO still times its candidate 0 against the leader, so a wrong estimate
costs the runner-up its other tilings (its other layouts among them: the direct template's
candidate 0 may be a lanes tiling), not the race.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from aotpack.ir import gemm
from aotpack.tune import replay
from aotpack.config import MAX_TOPN
from aotpack.ir.choice import ChoicePoint
from aotpack.ir.graph import KernelCall
from aotpack.ir.kernel import FusedKernel

log = logging.getLogger("aotpack")

#: A GEMM step's aotpack kernel variant estimated this many times slower than the step's best
#: compiles only its candidate 0: its other tilings cost compile time and did not win
#: (docs/measurements.md, "Runners-up compile only their default").
RUNNER_UP_FACTOR = 1.3


@dataclass(frozen=True)
class CandidateSet(ChoicePoint):
    """The candidates of one distinct kernel and their generated sources: the kernel's
    choice point (``ir.choice``), its candidates named by ``kernel_key``.

    ``kernel`` is the first kernel with this ``kernel_id`` (its name names the archive
    folder); ``sources[i]`` is the source of ``candidates[i]``.
    """

    kernel: FusedKernel
    candidates: tuple
    sources: tuple
    wrapper_source: str

    choice_kind = "kernel"

    @property
    def kernel_id(self) -> str:
        """The kernel's content hash."""
        return self.kernel.kernel_id

    @property
    def choice_id(self) -> str:
        """The kernel's ``kernel_id``."""
        return self.kernel.kernel_id

    @property
    def label(self) -> str:
        """The kernel's name."""
        return self.kernel.name

    def candidate_names(self) -> list[str]:
        """Each candidate's ``kernel_key`` (``tiling_repr|workspace|block_dim``)."""
        return [c.kernel_key for c in self.candidates]

    def candidate_labels(self) -> list[str]:
        """Each candidate's ``tiling_repr``."""
        return [c.tiling_repr for c in self.candidates]

    def ranks(self) -> list[int]:
        """Each candidate's threads: a close call goes to fewer."""
        return [c.block_dim for c in self.candidates]

    def signature(self, kernel_versions: dict | None = None) -> str:
        """The kernel's id, its version (``kernel_versions``: kernel_id -> a digest of its
        sources and the toolchain) and its candidates: equal text, equal timings."""
        version = (kernel_versions or {}).get(self.kernel_id, "")
        return "\n".join([f"kernel {self.kernel_id} {version}", *self.candidate_names()])


def shortlist(kernel: FusedKernel, backend, limits, settings) -> tuple:
    """The candidates of ``kernel`` to compile and time.

    Without the cost model: the solver's first ``topn`` (its default first, then the
    nearest variations). With it (``settings.cost_model``): the solver's whole space
    ranked by ``backend.estimate_us``, keeping the best ``ceil(ratio * len(space))``,
    at least 1 and at most ``topn``; the best estimate becomes candidate 0. Then the
    candidates estimated far behind the best are dropped (``_without_far_behind``), and a
    tiny kernel (``_is_tiny``) keeps only its first remaining candidate, which is also the
    one an unvisited kernel runs.
    """
    chosen = _without_far_behind(kernel, _ranked(kernel, backend, limits, settings), backend, settings)
    if len(chosen) > 1 and _is_tiny(kernel, chosen[0], backend, settings):
        log.debug("%s: tiny (estimated under %g us): compiling only %s", kernel.name,
                  settings.tiny_kernel_us, chosen[0].tiling_repr)
        return chosen[:1]
    return chosen


def _is_tiny(kernel: FusedKernel, default, backend, settings) -> bool:
    """Whether ``backend.estimate_us`` puts ``default`` under ``settings.tiny_kernel_us``:
    its variations can win only fractions of a us, less than a compile each is worth."""
    if settings.tiny_kernel_us <= 0:
        return False
    estimate = backend.estimate_us(kernel, default, settings)
    return estimate is not None and estimate < settings.tiny_kernel_us


def _without_far_behind(kernel, chosen: tuple, backend, settings) -> tuple:
    """``chosen`` less the candidates whose ``backend.estimate_us`` is at least
    ``settings.far_behind_factor`` times the best one's (us per launch), in the same order;
    all of ``chosen`` where the factor is 0 (off), the backend's estimates do not rank this
    kernel's tilings (``backend.ranks_tilings``) or it cannot estimate each one (None, NaN,
    infinite or not above 0).

    A candidate that differs from a kept one only in ``block_dim`` shares its binary
    (``Backend.share_binaries``): dropping it saves its timing, not a compile."""
    factor = settings.far_behind_factor
    if len(chosen) < 2 or not factor or not backend.ranks_tilings(kernel):
        return chosen
    estimates = [backend.estimate_us(kernel, c, settings) for c in chosen]
    if not all(e is not None and math.isfinite(e) and e > 0 for e in estimates):
        return chosen
    best = min(estimates)
    kept = tuple(c for c, e in zip(chosen, estimates) if e == best or e < factor * best)
    if len(kept) < len(chosen):
        log.debug("%s: not compiling %d candidates estimated at least %gx the best (%.1f us)", kernel.name,
                  len(chosen) - len(kept), factor, best)
    return kept


def _ranked(kernel: FusedKernel, backend, limits, settings) -> tuple:
    """The solver's first ``topn``, or with the cost model its best share (``shortlist``)."""
    if not settings.cost_model:
        return tuple(backend.solve(kernel, limits, settings.topn)[:settings.topn])
    space = backend.solve(kernel, limits, MAX_TOPN)
    estimates = [backend.estimate_us(kernel, c, settings) for c in space]
    if any(e is None for e in estimates):
        return tuple(space[:settings.topn])
    keep = min(settings.topn, max(1, math.ceil(settings.cost_model_ratio * len(space))))
    ranked = sorted(range(len(space)), key=lambda i: (estimates[i], i))[:keep]
    log.debug("%s: cost model keeps %s of %d", kernel.name,
              ", ".join(f"{space[i].tiling_repr} ({estimates[i]:.1f} us)" for i in ranked), len(space))
    return tuple(space[i] for i in ranked)


def prepare(graph, backend, settings, replayed: dict | None = None) -> dict[str, CandidateSet]:
    """``kernel_id -> CandidateSet`` for every distinct kernel of ``graph``, in first-use order.

    ``replayed`` (``replay.recorded_winners``): a kernel recorded there gets the recorded
    winner as its only candidate, when the solver still offers it.
    """
    limits = backend.limits(settings)
    shortlists = {}
    for kernel in graph.kernels:
        if kernel.kernel_id not in shortlists:
            shortlists[kernel.kernel_id] = (kernel, shortlist(kernel, backend, limits, settings))
    behind = _runners_up(graph, backend, settings, shortlists)
    sets: dict[str, CandidateSet] = {}
    replayed = replayed or {}
    for kernel, candidates in shortlists.values():
        if kernel.kernel_id in behind:
            candidates = candidates[:1]
        builds = backend.share_binaries(candidates)
        if kernel.kernel_id in replayed:
            candidates, builds = _replayed(kernel, backend, limits, replayed[kernel.kernel_id], candidates, builds)
        sources = tuple(backend.render_kernel(kernel, b) for b in builds)
        sets[kernel.kernel_id] = CandidateSet(kernel, candidates, sources, backend.render_wrapper(list(candidates)))
    return sets


def _runners_up(graph, backend, settings, shortlists: dict) -> set[str]:
    """kernel_ids of the GEMM steps' aotpack kernel variants (``gemm.OWN_KERNEL_RANKS``) whose
    best estimate (``backend.estimate_us``, us per launch over their shortlist) is above the
    best variant's and at least ``RUNNER_UP_FACTOR`` times it, in every step they are in.

    ``shortlists``: ``kernel_id -> (kernel, shortlist)``. Steps with fewer than two such
    variants, or one the backend cannot estimate, cut nothing; nor does ``--topn 1``.
    """
    if settings.topn <= 1:
        return set()
    behind: dict[str, bool] = {}
    for step in gemm.gemm_steps(graph):
        estimates = {}
        for variant in step.variants:
            kernels = [s.kernel for s in variant.steps if isinstance(s, KernelCall)]
            if variant.name in gemm.OWN_KERNEL_RANKS and len(kernels) == 1:
                kernel, candidates = shortlists[kernels[0].kernel_id]
                estimates[kernel.kernel_id] = _best_estimate(kernel, candidates, backend, settings)
        if len(estimates) < 2 or None in estimates.values():
            continue
        best = min(estimates.values())
        for kid, estimate in estimates.items():
            is_behind = estimate > best and estimate >= RUNNER_UP_FACTOR * best
            behind[kid] = behind.get(kid, True) and is_behind
    if any(behind.values()):
        log.info("compiling only candidate 0 of %d GEMM-step kernels estimated at least %gx slower than "
                 "another variant of their step", sum(behind.values()), RUNNER_UP_FACTOR)
    return {kid for kid, is_behind in behind.items() if is_behind}


def _best_estimate(kernel, candidates: tuple, backend, settings) -> float | None:
    """The lowest ``backend.estimate_us`` (us per launch) among ``candidates``; None when
    the backend cannot estimate one of them."""
    estimates = [backend.estimate_us(kernel, c, settings) for c in candidates]
    return None if None in estimates else min(estimates)


def _replayed(kernel: FusedKernel, backend, limits, recorded, candidates: tuple, builds: tuple) -> tuple:
    """``(candidates, builds)`` holding only the recorded winner: as this build's shortlist
    offers it (the binary it shares there), else as the solver's whole space does, else,
    with a warning, the shortlist unchanged (the kernel is tuned again)."""
    index = replay.pick([c.kernel_key for c in candidates], recorded)
    if index is not None:
        return (candidates[index],), (builds[index],)
    space = backend.solve(kernel, limits, MAX_TOPN)
    index = replay.pick([c.kernel_key for c in space], recorded)
    if index is not None:
        return (space[index],), (space[index],)
    log.warning("%s: the recorded winner %s is not a candidate any more; tuning it again",
                kernel.name, recorded.candidate)
    return candidates, builds
