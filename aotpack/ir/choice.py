"""Choice points: every tunable thing of a build, as PGO, the caches, ``--tuning-from``
and the manifest see it.

A choice point has an id (unique in the build), a kind, a label for logs and tables, and
named candidates of which PGO picks one. Two kinds exist today:

* a distinct fused kernel (``tune.candidates.CandidateSet``): id = its ``kernel_id``,
  candidates = its TopN tilings, named by ``kernel_key``; the tie-break order is the
  candidates' thread counts (a close call goes to fewer threads);
* a GEMM/conv/bmm/attention step (``ir.gemm.GemmStep``): id = ``gemm:<name>``, candidates =
  its implementations (``aten``, ``template`` ...), named as such; the tie-break order
  puts aotpack's own kernels first.

Everything downstream (the one choice table in ``tune.autotune``, the tuning records of
``tune.choice_cache``, ``tune.replay``, the manifest's ``choices``) speaks of a choice
point by ``choice_id`` and of its winner by candidate name.
"""
from __future__ import annotations


class ChoicePoint:
    """Something PGO chooses for: ``choice_id``, ``choice_kind``, ``label`` and the
    candidates' ``candidate_names`` (unique within the point), with ``ranks`` for
    ``tune.timing.decide`` (one int per candidate: a close call goes to the lower rank)
    and a ``signature`` keying its tuning record.

    Subclasses implement ``choice_id``, ``label``, ``candidate_names``, ``ranks`` and
    ``signature``; ``pick`` is shared.
    """

    #: what the point chooses: ``kernel`` (a fused kernel's tiling) or a step's kind
    #: (``linear``, ``conv2d``, ``bmm``, ``attention``)
    choice_kind: str = ""

    @property
    def choice_id(self) -> str:
        """The point's id: unique within one build, stable across builds of one model."""
        raise NotImplementedError

    @property
    def label(self) -> str:
        """A name for logs and tables (a kernel's or a step's name)."""
        raise NotImplementedError

    def candidate_names(self) -> list[str]:
        """The candidates' names, in candidate order."""
        raise NotImplementedError

    def ranks(self) -> list[int]:
        """One tie-break rank per candidate for ``timing.decide``."""
        raise NotImplementedError

    def signature(self, kernel_versions: dict | None = None) -> str:
        """Text of what the point's timings depend on besides the device (the key of its
        tuning record, ``tune.choice_cache``); ``kernel_versions``: kernel_id -> a digest
        of what compiles that kernel (``choice_cache.kernel_versions``)."""
        raise NotImplementedError

    def candidate_labels(self) -> list[str]:
        """The candidates as a person reads them (a kernel's tilings); the names by default."""
        return self.candidate_names()

    def details(self) -> dict:
        """Fields the manifest's choice entry adds (a step's ``shape`` and ``epilogue``)."""
        return {}

    def pick(self, name: str) -> int | None:
        """The index of the candidate called ``name``, or None when it is not offered."""
        names = self.candidate_names()
        return names.index(name) if name in names else None


class ChoiceStep(ChoicePoint):
    """A graph step that is a choice point: one of several lists of ordinary steps
    (``alternatives``) computes its output, and resolving the graph keeps the winner's.

    Subclasses provide ``alternatives()`` (``[(name, steps)]`` in candidate order) and
    ``summary()`` (the step's line in ``Graph.dump``, without indentation).
    """

    def alternatives(self) -> list[tuple[str, list]]:
        """``(candidate name, steps)`` per candidate."""
        raise NotImplementedError

    def summary(self) -> str:
        """One line describing the step and its candidates."""
        raise NotImplementedError

    def candidate_names(self) -> list[str]:
        return [name for name, _ in self.alternatives()]

    def chosen_steps(self, index: int) -> list:
        """The steps of candidate ``index``."""
        return self.alternatives()[index][1]
