"""aotpack.tune.timing: robust PGO statistics, driven by a fake launcher whose samples are scripted
(no compiler, no real timing: every number below is exact)."""
import math

import pytest

from aotpack.backends.cpu.device import CpuDevice
from aotpack.tune import timing
from aotpack.tune.timing import Timing, decide, measure


ROUNDS = timing.ROUNDS


class FakeLauncher:
    """Candidates whose launches take scripted times on a fake clock.

    ``script[key]``: one ``(us, waited_us)`` per timed launch (launches beyond the script
    repeat its last entry); warm-up launches take ``warmup_us[key]``, else the first
    entry's ``us``. Launches of >= 50 us make a sample one launch. ``waited_us``: run-queue
    wait the fake probe reports for that launch (preemption).
    """

    def __init__(self, script: dict, warmup_us: dict | None = None):
        self.script = script
        self.warmup_us = warmup_us or {}
        self.now = 0
        self.waited = 0
        self.launches = {key: 0 for key in script}
        self.order: list[str] = []

    def clock(self) -> int:
        return self.now

    def launch(self, key, args) -> None:
        n = self.launches[key] - timing.WARMUP_LAUNCHES
        self.launches[key] += 1
        samples = self.script[key]
        if n < 0:
            us, waited = self.warmup_us.get(key, samples[0][0]), 0.0
        else:
            us, waited = samples[min(n, len(samples) - 1)]
        if n >= 0:
            self.order.append(key)
            self.waited += int(waited * 1000)
        self.now += int(us * 1000)

    def synchronize(self) -> None:
        pass


class FakeProbe:
    def __init__(self, launcher: FakeLauncher):
        self.launcher = launcher

    def open(self):
        pass

    def read(self) -> int:
        return self.launcher.waited

    def close(self):
        pass


def run(script: dict, pauses: list | None = None, block_dims=None, stolen=lambda: 0) -> tuple[Timing, FakeLauncher]:
    launcher = FakeLauncher(script)
    sleep = (pauses.append if pauses is not None else (lambda s: None))
    return measure(launcher, list(script), None, FakeProbe(launcher), launcher.clock, sleep, block_dims,
                   stolen), launcher


def clean(us: float, rounds: int = ROUNDS) -> list:
    return [(us, 0.0)] * rounds


def test_rounds_are_interleaved_with_the_order_rotated_each_round():
    # within PRUNE_FACTOR of each other: all three are timed in every round
    result, launcher = run({"a": clean(100), "b": clean(110), "c": clean(120)})
    assert result.attempts == 1 and result.rounds == ROUNDS
    firsts = [launcher.order[3 * r] for r in range(ROUNDS)]
    assert firsts == ["a", "b", "c"] * (ROUNDS // 3)
    assert launcher.order[:6] == ["a", "b", "c", "b", "c", "a"]
    assert result.estimates_us == [100.0, 110.0, 120.0]


def test_outliers_do_not_move_the_estimate_or_the_winner():
    slow = [(100.0, 0.0)] * ROUNDS
    for r in (1, 6, 11):  # preempted samples: 200x slower, and the threads waited for it
        slow[r] = (20000.0, 19900.0)
    result, _ = run({"a": slow, "b": clean(130)})
    assert result.estimates_us == [100.0, 130.0]
    assert result.clean_shares == [12 / 15, 1.0] and not result.contended
    assert result.attempts == 1  # 12 of 15 clean and the fast samples agree: no re-timing
    assert decide([result], [1, 1]).index == 0


def test_multi_thread_candidate_wins_when_clearly_faster_in_its_clean_rounds():
    two = [(60.0, 0.0)] * ROUNDS
    for r in range(0, ROUNDS, 3):  # every third round preempted: 20 ms, dirty
        two[r] = (20000.0, 19950.0)
    result, _ = run({"one": clean(100), "two": two})
    assert result.clean_shares == [1.0, 10 / 15] and not result.contended
    decision = decide([result], [1, 2])
    assert (decision.index, decision.fastest, decision.contended) == (1, 1, False)
    assert decision.estimates_us == (100.0, 60.0)


def test_preempted_multi_thread_candidate_is_re_timed_then_flagged_contended_and_loses():
    """Every sample of the 2-thread candidate was preempted and none is below the
    1-thread candidate's clean time: no round judges it, so the 1-thread one keeps the
    choice."""
    dirty = [(120.0, 90.0)] * ROUNDS  # waited 75% of its wall time
    pauses = []
    result, launcher = run({"one": clean(100), "two": dirty}, pauses)
    assert result.attempts == timing.MAX_ATTEMPTS and result.rounds == timing.MAX_ATTEMPTS * ROUNDS
    assert pauses == list(timing.RETRY_PAUSE_S)
    assert result.contended_candidates() == [1] and result.contended
    decision = decide([result], [1, 2])
    assert (decision.index, decision.contended) == (0, True)


def test_a_candidate_preempted_throughout_wins_where_even_its_inflated_time_is_faster():
    """A 12.6 ms template against 55 ms of ATen, both preempted in every round (load 6 on
    2 cores): preemption only adds time, so the template's samples prove it faster. Were
    the template's samples above ATen's proven time, nothing would judge it."""
    template, aten = [12600.0] * 10, [55000.0] * 10
    dirty = [[False] * 10, [False] * 10]
    proven = Timing([list(aten), list(template)], dirty, 1, [[30000.0] * 10, [6000.0] * 10])
    assert decide([proven], [1, 1]).index == 1  # 12600 < 55000 - 30000
    unproven = Timing([list(aten), list(template)], dirty, 1, [[50000.0] * 10, [6000.0] * 10])
    assert decide([unproven], [1, 1]).index == 0  # 12600 > 5000: ATen may be faster


def test_re_timing_stops_when_the_noise_clears():
    noisy = [(20000.0, 19000.0)] * ROUNDS + [(60.0, 0.0)] * ROUNDS  # first attempt preempted, then idle
    result, _ = run({"one": clean(100), "two": noisy})
    assert result.attempts == 2 and not result.contended
    assert result.clean_shares == [1.0, 0.5]
    assert decide([result], [1, 2]).index == 1


def test_disagreeing_fast_samples_are_re_timed():
    spread = [(100.0, 0.0)] * 2 + [(140.0, 0.0)] * (ROUNDS - 2)
    result, _ = run({"a": spread + clean(100), "b": clean(200)})
    assert result.attempts == 2  # the 0.2 quantile (140) exceeded 1.25x the fastest (100)
    assert result.estimates_us == [100.0, 200.0] and result.disagreeing_candidates() == []


def test_re_timing_is_bounded_by_the_time_budget():
    dirty = [(200_000.0, 190_000.0)] * ROUNDS  # 200 ms a launch: one attempt is 3 s
    result, _ = run({"one": clean(100), "two": dirty})
    assert result.attempts == 1 and result.contended


def timing_of(*rows, dirty=()):
    """A Timing from per-candidate sample lists; ``dirty``: (candidate, round) preempted."""
    us = [list(row) for row in rows]
    flags = [[(c, r) not in dirty for r in range(len(row))] for c, row in enumerate(rows)]
    return Timing(us, flags)


@pytest.mark.parametrize("two_us, winner", [(98.0, 0), (97.5, 0), (96.0, 1)])
def test_ties_within_the_margin_go_to_fewer_threads(two_us, winner):
    result = timing_of([100.0] * 5, [two_us] * 5)
    assert decide([result], [1, 2]).index == winner


def test_ties_between_equal_thread_counts_go_to_the_cost_order():
    result = timing_of([100.0] * 5, [99.0] * 5, [99.5] * 5)
    decision = decide([result], [2, 2, 2])
    assert (decision.index, decision.fastest) == (0, 1)
    assert decide([timing_of([100.0] * 5, [99.0] * 5)], [2, 1]).index == 1  # fewer threads first


def test_an_advantage_not_clear_across_rounds_keeps_the_single_thread_candidate():
    one = [100.0] * 10
    two = [80.0] * 6 + [120.0] * 4  # 20% faster by the estimate, but wins only 6 of 10 rounds
    assert decide([timing_of(one, two)], [1, 2]).index == 0
    two = [80.0] * 8 + [120.0] * 2  # 8 of 10: clear
    assert decide([timing_of(one, two)], [1, 2]).index == 1


def test_dirty_rounds_above_the_other_do_not_count_against_a_candidate():
    one, two = [100.0] * 10, [80.0] * 3 + [120.0] * 7  # preempted: 120, no evidence either way
    dirty = {(1, r) for r in range(3, 10)}
    assert decide([timing_of(one, two, dirty=dirty)], [1, 2]).index == 1  # three clean rounds, won
    dirty |= {(0, 0), (0, 1), (0, 2)}  # and "one" preempted where "two" was clean
    decision = decide([timing_of(one, two, dirty=dirty)], [1, 2])
    assert (decision.index, decision.contended) == (0, True)  # no round judges "two"


def test_decision_averages_input_sets_and_counts_their_rounds_together():
    first = timing_of([100.0] * 5, [90.0] * 5)
    second = timing_of([100.0] * 5, [150.0] * 5)
    decision = decide([first, second], [1, 1])
    assert decision.estimates_us == (100.0, 120.0) and decision.index == 0
    assert decide([first, first], [1, 1]).index == 1


def test_decide_rejects_mismatched_candidates():
    with pytest.raises(ValueError, match="decide: 1 timings for 3 candidates"):
        decide([timing_of([1.0], [2.0])], [1, 1, 1])


def test_low_quantile_is_the_third_fastest_of_fifteen():
    assert timing.low_quantile([float(v) for v in range(15, 0, -1)]) == 3.0
    assert timing.low_quantile([7.0]) == 7.0
    with pytest.raises(ValueError):
        timing.low_quantile([])


def test_run_delay_probe_reads_a_monotonic_wait():
    probe = CpuDevice().run_delay_probe()
    probe.open()
    try:
        first = probe.read()
        sum(range(100_000))
        assert probe.read() >= first >= 0
    finally:
        probe.close()


def test_a_preempted_sample_stops_early_and_counts_its_launches():
    """10 us launches: 5 per sample. The first timed launch loses a 20 ms slice: its
    sample stops after that launch (20x its expected 50 us) instead of running 4 more."""
    launcher = FakeLauncher({"a": [(20000.0, 19990.0)] + [(10.0, 0.0)] * 200, "b": clean(100)},
                            warmup_us={"a": 10.0})
    result = measure(launcher, ["a", "b"], None, FakeProbe(launcher), launcher.clock, lambda s: None)
    assert launcher.launches["a"] == timing.WARMUP_LAUNCHES + 1 + (ROUNDS - 1) * 5
    assert result.us[0][0] == 20000.0 and result.clean[0][0] is False
    assert result.us[0][1:] == [10.0] * (ROUNDS - 1) and result.attempts == 1
    assert decide([result], [2, 1]).index == 0


def test_a_clean_candidate_beats_one_preempted_in_every_round_when_the_wait_proves_it():
    """ATen preempted in every round (27265 us a launch, 26000 of them waiting: at least
    1265 us of work) against the template's clean 964 us: the template is clearly
    faster; had ATen waited 26800 us (465 us of work), nothing would be proven."""
    template = [964.0] * 10
    aten = [27265.0] * 10
    dirty = {(0, r) for r in range(10)}
    proven = Timing([list(aten), list(template)], [[False] * 10, [True] * 10], 1,
                    [[26000.0] * 10, [0.0] * 10])
    assert decide([proven], [1, 1]).index == 1
    unproven = Timing([list(aten), list(template)], [[False] * 10, [True] * 10], 1,
                      [[26800.0] * 10, [0.0] * 10])
    assert decide([unproven], [1, 1]).index == 0
    assert decide([timing_of(aten, template, dirty=dirty)], [1, 1]).index == 0  # wait unknown


def test_waited_time_is_recorded_per_launch():
    """10 us launches, 5 to a 50 us sample, each waiting 4 us: 4 us per launch (40% of
    its time, not clean) whatever the sample's launch count."""
    result, _ = run({"a": [(10.0, 4.0)] * 500, "b": clean(10, 500)})
    assert result.waited_us[0][0] == pytest.approx(4.0) and result.clean[0][0] is False
    assert result.waited_us[1][0] == 0.0 and result.clean[1][0] is True


def test_a_two_thread_candidate_that_did_not_scale_gets_a_second_look_after_a_pause():
    """Stolen time (the host preempting the VM) leaves no run-queue wait: the 2-thread
    convolution read its 1-thread time in clean-looking samples. The second look, half a
    second later, is less disturbed and replaces the first."""
    stolen_then_idle = clean(1000.0) + clean(520.0)
    pauses = []
    result, _ = run({"one": clean(1000.0), "two": stolen_then_idle}, pauses, block_dims=[1, 2])
    assert pauses == [timing.UNSCALED_PAUSE_S] and result.attempts == 2 and result.rounds == ROUNDS
    assert result.estimates_us == [1000.0, 520.0]
    assert decide([result], [1, 2]).index == 1


def test_a_kernel_that_does_not_scale_keeps_its_first_look_and_one_thread():
    result, _ = run({"one": clean(1000.0), "two": clean(1000.0) + clean(1100.0)}, [], block_dims=[1, 2])
    assert result.attempts == 2 and result.estimates_us == [1000.0, 1000.0]
    assert decide([result], [1, 2]).index == 0


def test_short_or_scaling_kernels_get_no_second_look():
    pauses = []
    short, _ = run({"one": clean(150.0), "two": clean(150.0)}, pauses, block_dims=[1, 2])
    scaling, _ = run({"one": clean(1000.0), "two": clean(540.0)}, pauses, block_dims=[1, 2])
    untold, _ = run({"one": clean(1000.0), "two": clean(1000.0)}, pauses)  # no block_dims: GEMM variants
    assert pauses == [] and short.attempts == scaling.attempts == untold.attempts == 1


def test_stolen_time_while_timing_earns_a_second_look():
    ticks = iter([0, 3])  # 30 ms stolen in a ~5 ms timing; GEMM-step variants too: no block_dims
    pauses = []
    result, _ = run({"a": clean(100.0), "b": clean(125.0) + clean(115.0)}, pauses, stolen=lambda: next(ticks))
    assert pauses == [timing.UNSCALED_PAUSE_S] and result.attempts == 2
    assert result.estimates_us == [100.0, 115.0]  # the second look was less disturbed: kept
    little = iter([0, 1])  # 10 ms stolen over a 15 s timing: under STOLEN_SHARE
    slow, _ = run({"a": clean(1_000_000.0)}, [], stolen=lambda: next(little))
    assert slow.attempts == 1
    one_tick = iter([0, 1])  # one tick in a ~5 ms timing: 10 ms of steal accumulated since boot may end there
    quantised, _ = run({"a": clean(100.0), "b": clean(200.0)}, [], stolen=lambda: next(one_tick))
    assert quantised.attempts == 1


def test_one_poor_multi_thread_variant_does_not_earn_a_second_look():
    estimates = Timing([[520.0] * 3, [1000.0] * 3, [900.0] * 3], [[True] * 3] * 3)
    assert not timing.unscaled(estimates, [2, 1, 2])  # the best 2-thread one scaled
    assert timing.unscaled(estimates, [1, 1, 2])  # the only 2-thread one: 900 us against 520 on 1 thread



def test_steal_ticks_is_the_steal_column_and_zero_where_unreadable(monkeypatch, tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  780936 128740 166304 1243052 6181 0 1456 9664 0 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n")
    real_open = open
    monkeypatch.setattr("builtins.open", lambda path, *a, **k: real_open(stat if path == "/proc/stat" else path, *a, **k))
    assert CpuDevice().steal_ticks() == 9664
    stat.write_text("cpu 1 2\n")  # a kernel without the column
    assert CpuDevice().steal_ticks() == 0


def test_a_candidate_clearly_behind_after_the_first_rounds_is_not_timed_again():
    # b's fastest clean sample is 2x the leader's estimate (>= PRUNE_FACTOR); c is 1.2x
    result, launcher = run({"a": clean(100.0), "b": clean(200.0), "c": clean(120.0)})
    cut = timing.PRUNE_AFTER_ROUNDS
    assert launcher.launches == {"a": timing.WARMUP_LAUNCHES + ROUNDS, "b": timing.WARMUP_LAUNCHES + cut,
                                 "c": timing.WARMUP_LAUNCHES + ROUNDS}
    assert result.us[1][:cut] == [200.0] * cut and all(math.isnan(u) for u in result.us[1][cut:])
    assert result.clean[1] == [True] * cut + [False] * (ROUNDS - cut)
    assert result.timed(1) == [200.0] * cut
    assert result.estimates_us == [100.0, 200.0, 120.0] and result.clean_shares == [1.0, 1.0, 1.0]
    assert result.attempts == 1 and not result.contended and result.rounds == ROUNDS
    assert timing.clearly_faster(0, 1, [result], result.estimates_us)  # judged on the 5 shared rounds
    assert decide([result], [1, 1, 1]).index == 0


def test_preempted_samples_prune_nothing():
    # b's first rounds were preempted (run-queue wait > CLEAN_DELAY_SHARE): they prove
    # nothing about its time, so b stays in every round
    slow_start = [(200.0, 50.0)] * timing.PRUNE_AFTER_ROUNDS + clean(90.0)
    result, launcher = run({"a": clean(100.0), "b": slow_start})
    assert launcher.launches["b"] == timing.WARMUP_LAUNCHES + ROUNDS
    assert result.estimates_us == [100.0, 90.0] and decide([result], [1, 1]).index == 1


def test_close_candidates_are_all_timed_in_every_round():
    just_under = 100.0 * timing.PRUNE_FACTOR - 1.0
    result, launcher = run({"a": clean(100.0), "b": clean(just_under)})
    assert launcher.launches["b"] == timing.WARMUP_LAUNCHES + ROUNDS
    assert result.estimates_us == [100.0, just_under]
