"""Timing a kernel's candidates so that a busy machine cannot fool the choice (PGO statistics).

``measure`` times every candidate of one kernel on one input set:

* warm-up launches, each timed on its own; the fastest sets the launches per sample
  (enough for ``MIN_SAMPLE_NS``, so a warm-up that was preempted cannot shrink it); a
  sample that has already taken ``ABANDON_FACTOR`` times as long as expected stops early;
* interleaved rounds, the candidate order rotated each round, so slow drift (another
  process starting, the clock changing) hits every candidate alike;
* early stopping (successive halving with one cut): after ``PRUNE_AFTER_ROUNDS`` rounds, a
  candidate whose fastest clean sample is at least ``PRUNE_FACTOR`` times the leader's
  estimate (both from ``MIN_PRUNE_CLEAN`` clean samples or more) is not timed again in that
  attempt. A clean sample is the candidate's time plus little noise and the leader's low
  quantile is at least its time, so the pruned one is that much slower; its estimate comes
  from the rounds it ran. Most of what it saves is extern library calls beside a GEMM
  template and one-thread twins of long kernels;
* around every sample, the time this process's threads spent runnable but waiting on
  the run queue (the device's probe, ``Device.run_delay_probe``: the direct signal of
  preemption; without one, wall time minus this thread's CPU time). A sample whose
  threads waited more than ``CLEAN_DELAY_SHARE`` of its wall time is *contended*;
* re-timing (up to ``MAX_ATTEMPTS`` attempts of ``ROUNDS`` rounds, within
  ``ATTEMPT_BUDGET_S``) while a candidate has too few clean samples or its fast samples
  disagree (``DISAGREE``). A kernel still short of clean samples after that is
  ``Timing.contended``.
* one more attempt, after a pause of ``UNSCALED_PAUSE_S``, when the fastest multi-thread
  candidate of a long kernel (its fastest one-thread candidate ``UNSCALED_MIN_US`` or more) is not
  at least ``UNSCALED_SHARE`` faster than that one-thread candidate, or when the host
  stole more than ``STOLEN_SHARE`` of the timing's wall time, and ``STOLEN_MIN_TICKS`` ticks
  or more, from this virtual machine (``Device.steal_ticks``).
  Stolen time is invisible to the run-queue probe:
  the guest's threads look as if they ran, so a build could ship a multi-thread kernel at
  one thread with no sample marked contended (docs/measurements.md, "The second look after
  stolen time"). The less disturbed of the two looks is kept (``_second_look``).

``decide`` picks the winner over one or more ``Timing`` (input sets): the candidate
fewest threads first, then first in the cost order (the solver's order), that no other
candidate is *clearly faster* than — faster by ``TIE_MARGIN`` on the estimate and in at
least ``WIN_SHARE`` of the rounds where its own sample was clean, against the other's
clean sample or, when that one was preempted, its time minus its run-queue wait. Close
calls and contended comparisons go to the preferred candidate, so the choice is
reproducible.

Estimate: the ``LOW_QUANTILE`` quantile of a candidate's samples, not the mean or median.
A candidate is deterministic work on fixed tensors; every source of noise (preemption,
interrupts, another process's cache traffic, a worker thread woken late) only *adds*
time, so the fastest samples are the least disturbed ones and the right tail measures
the machine, not the kernel. The median moves with the load (a preempted worker thread
costs a whole time slice; docs/measurements.md, "A low quantile, not the median"); a low
quantile does not while some samples are clean.
Not the bare minimum: one sample cut short by timer granularity or a lucky cache state
would decide alone; the 0.2 quantile needs a few fast samples that agree.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from aotpack.backends.base import Device

WARMUP_LAUNCHES = 3
ROUNDS = 15
#: Early stopping (module docstring): rounds before the cut, the factor behind the leader,
#: and the clean samples both candidates need for it.
PRUNE_AFTER_ROUNDS = 5
PRUNE_FACTOR = 1.3
MIN_PRUNE_CLEAN = 3
#: The sample of a round a candidate was pruned from.
NOT_TIMED = float("nan")
#: Launches per timed sample: enough that launch overhead (~0.5 us through ctypes) and
#: timer resolution stay small next to the kernel.
MIN_SAMPLE_NS = 50_000
MAX_LAUNCHES_PER_SAMPLE = 1000
#: A sample stops early once it has taken this many times its expected duration (the
#: fastest warm-up x launches): a preempted launch costs a time slice, and timing the
#: rest of the sample would only add more of them (its samples are per launch anyway).
ABANDON_FACTOR = 20
#: A sample whose threads waited on the run queue longer than this share of its wall
#: time was preempted (contended); an idle machine shows ~0 (worker wake-ups: a few us).
CLEAN_DELAY_SHARE = 0.05
#: A candidate needs this share of clean samples for its estimate to be trusted.
MIN_CLEAN_SHARE = 1 / 3
LOW_QUANTILE = 0.2
#: Fast samples disagree (re-time) when the estimate exceeds the fastest sample this much.
DISAGREE = 1.25
MAX_ATTEMPTS = 3
#: No further attempt once one kernel's timing has taken this long (a preempted 2-thread
#: launch can cost a whole time slice, ~24 ms): bounds the build time on a busy machine.
ATTEMPT_BUDGET_S = 1.0
#: Pauses before re-timing attempts 2, 3 (s): a short burst of load may pass meanwhile.
RETRY_PAUSE_S = (0.02, 0.05)
#: Re-time once more (see the module docstring) when the fastest multi-thread candidate takes more
#: than this share of the fastest one-thread candidate's time, on kernels of at least
#: ``UNSCALED_MIN_US``: 2 threads should near halve a compute-bound kernel of that size.
UNSCALED_SHARE = 0.85
UNSCALED_MIN_US = 200.0
#: ...or when the host stole more CPU time (all CPUs) than this share of the timing's wall
#: time...
STOLEN_SHARE = 0.05
#: ...and at least this many clock ticks of it. The steal column counts whole ticks (10 ms)
#: since boot, so one tick moving in a short timing says little, while the bursts that fool a
#: choice steal tens of ticks (docs/measurements.md, "The second look after stolen time").
STOLEN_MIN_TICKS = 2
#: Pause before that attempt (s): a burst of stolen time lasts a second or so.
UNSCALED_PAUSE_S = 0.5
#: A candidate is clearly faster only by more than this share of the other's estimate...
TIE_MARGIN = 0.03
#: ...and in at least this share of the rounds in which both samples were clean.
WIN_SHARE = 0.75


@dataclass
class Timing:
    """Samples of one kernel's candidates on one input set.

    ``us[c][r]``: microseconds per launch of candidate ``c`` in round ``r`` (every
    candidate is timed once per round until it is pruned: NaN from there on in that
    attempt, with ``clean`` False; ``timed`` drops those). ``clean[c][r]``: that sample
    was not preempted.
    ``attempts``: how many times the rounds were run (1 = no re-timing).
    ``waited_us[c][r]``: run-queue wait per launch in that sample (us, all threads);
    empty when unknown.
    """

    us: list[list[float]]
    clean: list[list[bool]]
    attempts: int = 1
    waited_us: list[list[float]] = field(default_factory=list)

    @property
    def rounds(self) -> int:
        """Rounds timed (over all attempts)."""
        return len(self.us[0]) if self.us else 0

    def timed(self, c: int) -> list[float]:
        """Candidate ``c``'s samples, less the rounds it was pruned from (us per launch)."""
        return [u for u in self.us[c] if not math.isnan(u)]

    @property
    def estimates_us(self) -> list[float]:
        """``LOW_QUANTILE`` of each candidate's samples (us per launch)."""
        return [low_quantile(self.timed(c)) for c in range(len(self.us))]

    @property
    def clean_shares(self) -> list[float]:
        """Share of each candidate's samples that were not preempted (rounds it was pruned
        from do not count)."""
        shares = []
        for samples, flags in zip(self.us, self.clean):
            timed = [ok for u, ok in zip(samples, flags) if not math.isnan(u)]
            shares.append(sum(timed) / len(timed) if timed else 0.0)
        return shares

    @property
    def spreads(self) -> list[float]:
        """Slowest sample / estimate per candidate (how noisy the machine was)."""
        return [max(samples) / low_quantile(samples) for samples in map(self.timed, range(len(self.us)))]

    def contended_candidates(self) -> list[int]:
        """Candidates with fewer than ``MIN_CLEAN_SHARE`` clean samples."""
        return [c for c, share in enumerate(self.clean_shares) if share < MIN_CLEAN_SHARE]

    def disagreeing_candidates(self) -> list[int]:
        """Candidates whose estimate exceeds their fastest sample by more than ``DISAGREE``."""
        return [c for c, samples in enumerate(map(self.timed, range(len(self.us))))
                if low_quantile(samples) > DISAGREE * min(samples)]

    @property
    def contended(self) -> bool:
        """Some candidate's samples were mostly preempted: its estimate may be too slow."""
        return bool(self.contended_candidates())

    def extend(self, other: "Timing") -> None:
        """Append ``other``'s rounds (a re-timing attempt) to these."""
        for mine, theirs in ((self.us, other.us), (self.clean, other.clean), (self.waited_us, other.waited_us)):
            for c, values in enumerate(theirs):
                mine[c].extend(values)
        self.attempts += other.attempts


def unscaled(timing: Timing, block_dims: list[int]) -> bool:
    """No multi-thread candidate of a long kernel is ``UNSCALED_SHARE`` faster than the
    fastest one-thread candidate (see the module docstring); the fastest of them is
    compared, so one poor multi-thread variant does not trigger it."""
    estimates = timing.estimates_us
    single = min((estimates[c] for c, threads in enumerate(block_dims) if threads == 1), default=0.0)
    multi = min((estimates[c] for c, threads in enumerate(block_dims) if threads > 1), default=0.0)
    return single >= UNSCALED_MIN_US and multi > UNSCALED_SHARE * single


def low_quantile(samples: list[float]) -> float:
    """The ``LOW_QUANTILE`` order statistic of ``samples`` (index ``floor(q * (n - 1))``
    of the sorted values; n = 15 gives the 3rd fastest). Raises ValueError when empty."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    return ordered[int(LOW_QUANTILE * (len(ordered) - 1))]


def _fastest_warmup_ns(launcher, key: str, args, clock) -> int:
    fastest = None
    for _ in range(WARMUP_LAUNCHES):
        start = clock()
        launcher.launch(key, args)
        launcher.synchronize()
        elapsed = max(1, clock() - start)
        fastest = elapsed if fastest is None else min(fastest, elapsed)
    return fastest


def _clearly_behind(us: list[list[float]], clean: list[list[bool]]) -> set[int]:
    """Candidates whose fastest clean sample is ``PRUNE_FACTOR`` times the leader's
    ``LOW_QUANTILE`` of clean samples (the leader: the lowest such quantile), where both
    have ``MIN_PRUNE_CLEAN`` clean samples; none when no candidate has."""
    kept = [[u for u, ok in zip(samples, flags) if ok] for samples, flags in zip(us, clean)]
    judged = [c for c, samples in enumerate(kept) if len(samples) >= MIN_PRUNE_CLEAN]
    if not judged:
        return set()
    leader_us = min(low_quantile(kept[c]) for c in judged)
    return {c for c in judged if min(kept[c]) >= PRUNE_FACTOR * leader_us}


def _rounds(launcher, keys: list[str], args, fastest: dict, probe, clock, rounds: int) -> Timing:
    n = len(keys)
    us = [[0.0] * rounds for _ in keys]
    waited = [[0.0] * rounds for _ in keys]
    clean = [[True] * rounds for _ in keys]
    pruned: set[int] = set()
    for r in range(rounds):
        if r == PRUNE_AFTER_ROUNDS and n > 1:
            pruned = _clearly_behind([s[:r] for s in us], [f[:r] for f in clean])
        for i in range(n):
            c = (r + i) % n  # rotate the order: each candidate leads in turn
            if c in pruned:
                us[c][r] = waited[c][r] = NOT_TIMED
                clean[c][r] = False
                continue
            key = keys[c]
            count = max(1, min(MAX_LAUNCHES_PER_SAMPLE, MIN_SAMPLE_NS // fastest[key]))
            give_up = ABANDON_FACTOR * count * fastest[key]
            delay = probe.read()
            start = clock()
            done = 0
            while done < count:
                launcher.launch(key, args)
                done += 1
                if done < count and clock() - start > give_up:  # preempted: a slice or more lost
                    break
            launcher.synchronize()
            elapsed = clock() - start
            us[c][r] = elapsed / done / 1000.0
            waited[c][r] = (probe.read() - delay) / done / 1000.0
            clean[c][r] = waited[c][r] <= CLEAN_DELAY_SHARE * us[c][r]
    return Timing(us, clean, 1, waited)


def _second_look(first: Timing, second: Timing) -> Timing:
    """The less disturbed of two timings (the lower sum of estimates: noise only adds
    time, and stolen time slows a multi-thread candidate most), counting both attempts.
    Not their union: the rounds of a stolen attempt look clean and would keep a
    multi-thread candidate from winning ``WIN_SHARE`` of them."""
    best = second if sum(second.estimates_us) < sum(first.estimates_us) else first
    return Timing(best.us, best.clean, first.attempts + second.attempts, best.waited_us)


def measure(launcher, keys: list[str], args, probe=None, clock=time.perf_counter_ns, sleep=time.sleep,
            block_dims: list[int] | None = None, stolen=None, device=None) -> Timing:
    """Time every candidate of one kernel on one set of tensors (see the module docstring).

    Args:
        launcher: anything with ``launch(key, args)`` and ``synchronize()`` (a backend
            ``Launcher`` with every candidate loaded).
        keys: the candidates' kernel_keys, in the cost order (the solver's).
        args: what ``launch`` takes (``launcher.arguments(tensors)``).
        probe: run-queue wait source with ``open``/``read``/``close`` (default: the device's
            ``run_delay_probe()``); clock: ns timer; sleep: pause between attempts (s);
            stolen: the steal counter (default: the device's ``steal_ticks``). For tests.
        block_dims: the candidates' threads; given, a multi-thread candidate that did not
            scale earns one more attempt (``unscaled``), as stolen time always does.
        device: the backend's ``Device`` (its noise probes); default ``base.Device()``,
            which has none (wall time minus CPU time, no stolen time).

    Returns:
        A ``Timing`` of ``ROUNDS`` rounds per attempt.
    """
    device = device or Device()
    probe = probe or device.run_delay_probe()
    stolen = stolen or device.steal_ticks
    fastest = {key: _fastest_warmup_ns(launcher, key, args, clock) for key in keys}
    probe.open()
    try:
        started, steal_before = clock(), stolen()
        timing = _rounds(launcher, keys, args, fastest, probe, clock, ROUNDS)
        while (timing.attempts < MAX_ATTEMPTS and (clock() - started) < ATTEMPT_BUDGET_S * 1e9
               and (timing.contended_candidates() or timing.disagreeing_candidates())):
            sleep(RETRY_PAUSE_S[min(timing.attempts - 1, len(RETRY_PAUSE_S) - 1)])
            timing.extend(_rounds(launcher, keys, args, fastest, probe, clock, ROUNDS))
        stolen_ticks = stolen() - steal_before
        stolen_s = stolen_ticks / device.clock_ticks_per_s()
        robbed = stolen_ticks >= STOLEN_MIN_TICKS and stolen_s > STOLEN_SHARE * (clock() - started) / 1e9
        if robbed or (block_dims and unscaled(timing, block_dims)):
            sleep(UNSCALED_PAUSE_S)
            timing = _second_look(timing, _rounds(launcher, keys, args, fastest, probe, clock, ROUNDS))
    finally:
        probe.close()
    return timing


@dataclass(frozen=True)
class Decision:
    """The choice among one kernel's candidates.

    index: the winner. estimates_us: per candidate, the mean over input sets of its
    ``LOW_QUANTILE`` estimate. contended: some input set's timing stayed contended.
    fastest: the candidate with the lowest estimate (differs from ``index`` on a tie or
    an unclear multi-thread advantage).
    """

    index: int
    estimates_us: tuple
    contended: bool
    fastest: int


def _proven_us(t: Timing, c: int, r: int) -> float:
    """What sample ``r`` of candidate ``c`` proves its time per launch is at least: the
    sample when clean, else the time it was not waiting on the run queue (0 if unknown)."""
    if t.clean[c][r]:
        return t.us[c][r]
    return max(t.us[c][r] - t.waited_us[c][r], 0.0) if t.waited_us else 0.0


def clearly_faster(a: int, b: int, timings: list[Timing], estimates: list[float]) -> bool:
    """Candidate ``a`` beats ``b`` by more than ``TIE_MARGIN`` on the estimate and in at
    least ``WIN_SHARE`` of the rounds (all sets) that can judge it; never without one.

    A round judges ``a`` when ``a``'s sample was clean, or when it was preempted and still
    below what ``b``'s sample proves: noise only adds time, so a preempted sample is an
    upper bound on ``a``'s time and a lower one is no evidence against ``a``. What ``b``'s
    sample proves: its time when clean, else its time minus its run-queue wait (a
    preempted ``b`` counts as fast as it could have been). So a clearly faster candidate
    wins when the other is preempted throughout and when it is itself preempted throughout
    (both seen on busy machines: docs/measurements.md, "Preempted comparisons"), and a
    preempted ``a`` never wins on a sample that is not below ``b``'s.
    """
    if not estimates[a] < estimates[b] * (1.0 - TIE_MARGIN):
        return False
    wins = rounds = 0
    for t in timings:
        for r, (ua, ca) in enumerate(zip(t.us[a], t.clean[a])):
            if math.isnan(ua) or math.isnan(t.us[b][r]):  # a pruned candidate: no sample
                continue
            won = ua < _proven_us(t, b, r)
            if ca or won:
                rounds += 1
                wins += won
    return rounds > 0 and wins >= WIN_SHARE * rounds


def decide(timings: list[Timing], block_dims: list[int]) -> Decision:
    """The winner over ``timings`` (one per input set, same candidates in the same order).

    Args:
        block_dims: threads of each candidate (the preference: fewer first, then index);
            any ranks of that kind (lower preferred), e.g. a GEMM step's implementations.

    Raises:
        ValueError: no timings, or their candidate counts differ from ``block_dims``.
    """
    if not timings or any(len(t.us) != len(block_dims) for t in timings):
        raise ValueError(f"decide: {len(timings)} timings for {len(block_dims)} candidates")
    n = len(block_dims)
    estimates = [sum(t.estimates_us[c] for t in timings) / len(timings) for c in range(n)]
    preference = sorted(range(n), key=lambda c: (block_dims[c], c))
    winner = next(c for c in preference
                  if not any(clearly_faster(o, c, timings, estimates) for o in range(n) if o != c))
    fastest = min(range(n), key=lambda c: (estimates[c], block_dims[c], c))
    return Decision(winner, tuple(estimates), any(t.contended for t in timings), fastest)
