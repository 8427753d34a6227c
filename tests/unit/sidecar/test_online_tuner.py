"""The online tuner: its climb on a clean curve, and its stability on a simulated shared host (per-batch jitter,
stalls, a neighbour that takes the cores for seconds at a time), a job too short to explore, and no flip-flop."""

from __future__ import annotations

import random

import pytest

from spark_cnn.sidecar.online_tuner import BLOCK_BATCHES, MIN_ROUNDS, OnlineTuner

# images/s by batch size with one peak at 16, shaped like a small CNN's on a CPU: the neighbours of the best
# are 9% (32) and 12.5% (8) slower, so noise of 25% a batch hides the difference from any one batch.
RATES = {1: 90, 2: 150, 4: 220, 8: 280, 16: 320, 32: 290, 64: 240, 128: 200, 256: 160, 512: 120}
BEST = max(RATES.values())
SEEDS = range(40)
STARTS = (4, 8, 16, 64)
MAX_BATCHES = 2000


class SharedHost:
    """Batch times of the `RATES` device on a shared host, seeded: each batch jitters by up to +-25%, one in 20
    stalls 3x (a page fault storm, a GC pause), and a neighbour comes and goes (on for 2 s, off for 4 s on
    average, times drawn from exponentials) and slows every batch it overlaps by 1.3-2x."""

    JITTER = 0.25
    STALL_P, STALL = 0.05, 3.0
    NEIGHBOUR_ON_S, NEIGHBOUR_OFF_S = 2.0, 4.0

    def __init__(self, seed: int, *, neighbour: bool = True):
        self.rng = random.Random(seed)
        self.clock_s = 0.0
        self.neighbour = neighbour
        self.busy, self.slowdown = False, 1.0
        self.switch_at_s = self.rng.expovariate(1 / self.NEIGHBOUR_OFF_S)

    def ms(self, size: int) -> float:
        while self.neighbour and self.clock_s >= self.switch_at_s:
            self.busy = not self.busy
            self.slowdown = self.rng.uniform(1.3, 2.0)
            self.switch_at_s += self.rng.expovariate(1 / (self.NEIGHBOUR_ON_S if self.busy else self.NEIGHBOUR_OFF_S))
        ms = 1000.0 * size / RATES[size] * self.rng.uniform(1 - self.JITTER, 1 + self.JITTER)
        if self.rng.random() < self.STALL_P:
            ms *= self.STALL
        if self.busy:
            ms *= self.slowdown
        self.clock_s += ms / 1000
        return ms


def _drive(tuner: OnlineTuner, ms_of, max_batches: int = MAX_BATCHES) -> tuple[list[int], list[int]]:
    """Feed the tuner full batches at whatever size it asks for; the sizes it ran, and its best size after each."""
    ran, best = [], []
    for _ in range(max_batches):
        size = tuner.target
        tuner.observe(size, ms_of(size))
        ran.append(size)
        best.append(tuner.best)
        if tuner.settled:
            break
    return ran, best


def _share_of_best(tuner_args: dict, seeds=SEEDS, starts=STARTS) -> list[float]:
    """For each start and seed: the settled size's true throughput as a share of the best's."""
    shares = []
    for start in starts:
        for seed in seeds:
            tuner = OnlineTuner(start, max_size=512, **tuner_args)
            _drive(tuner, SharedHost(seed).ms)
            assert tuner.settled, (start, seed, tuner.summary())
            shares.append(RATES[tuner.best] / BEST)
    return shares


# --- a clean curve ------------------------------------------------------------------------------------------------

def _run(tuner: OnlineTuner, true_ms) -> int:
    _drive(tuner, true_ms)
    return tuner.target


@pytest.mark.parametrize("start", [1, 4, 8, 32, 64])
def test_online_tuner_finds_the_best_size_of_a_curve_with_one_peak(start):
    rates = {1: 60, 2: 100, 4: 150, 8: 190, 16: 220, 32: 200, 64: 150, 128: 90}  # images/s, best at 16
    tuner = OnlineTuner(start, block=2, rounds=(2, 4), max_size=128)
    assert _run(tuner, lambda b: 1000 * b / rates[b]) == 16
    assert tuner.settled
    assert tuner.summary()["observed_images_per_s"]["16"] == pytest.approx(220)


def test_a_trial_on_a_quiet_device_ends_after_its_fewest_rounds():
    tuner = OnlineTuner(8, block=4, rounds=(4, 16), max_size=16)
    ran, _ = _drive(tuner, lambda b: 1000 * b / {4: 100, 8: 200, 16: 300}[b])
    # 32 batches at the start, then trial 16 in 4 rounds of a trial block and a home block, won; 32 is out of
    # bounds and 8 was measured: settled at 16
    assert ran[:32] == [8] * 32
    assert ran[32:64] == ([16] * 4 + [8] * 4) * 4
    assert tuner.settled and tuner.target == 16 and len(ran) == 64


def test_online_tuner_ignores_gains_within_the_tolerance_and_other_sizes():
    rates = {4: 100, 8: 102, 16: 101}  # flat: doubling never wins by 3%
    tuner = OnlineTuner(8, block=2, max_size=16)
    tuner.observe(3, 1.0)  # a partial batch of 3 rows is not evidence
    assert tuner.observed == {}
    assert _run(tuner, lambda b: 1000 * b / rates[b]) == 8


def test_online_tuner_stays_within_bounds():
    tuner = OnlineTuner(64, block=2, max_size=64, min_size=32)
    assert _run(tuner, lambda b: 1000 * b / {32: 100, 64: 120}[b]) == 64
    with pytest.raises(ValueError):
        OnlineTuner(128, max_size=64)
    with pytest.raises(ValueError):
        OnlineTuner(8, rounds=(4, 2))


def test_online_tuner_uses_the_median_so_one_slow_batch_does_not_decide():
    tuner = OnlineTuner(8, block=5, max_size=16)
    for ms in (40, 40, 400, 40, 40):  # one stall (another process took the core)
        tuner.observe(8, ms)
    assert tuner.rate(8) == pytest.approx(200)


# --- a shared host ------------------------------------------------------------------------------------------------

def test_the_tuner_settles_near_the_best_size_under_a_neighbours_noise():
    shares = _share_of_best({})
    near = sum(share >= 0.95 for share in shares) / len(shares)
    # 95.6-97.5% for seeds 0-39, 40-79, 80-119 and 120-159; most misses stop one size short of 16 when the
    # neighbour weighs on a whole trial; one run in 160 moved from 64 to 128, the neighbour on for each home block
    assert near >= 0.9, f"{near:.0%} of runs settle within 5% of the best"
    assert sum(share < 0.85 for share in shares) <= len(shares) // 50


def test_without_repeated_rounds_the_same_noise_misleads_the_tuner():
    """The check above can fail: one round per trial, decided at once, settles wrong in many runs."""
    shares = _share_of_best({"rounds": (1, 1), "block": 16})
    assert sum(share >= 0.95 for share in shares) / len(shares) < 0.8


def test_the_tuner_never_returns_to_a_size_it_left_and_never_moves_once_settled():
    for start in STARTS:
        for seed in range(10):
            tuner = OnlineTuner(start, max_size=512)
            host = SharedHost(seed)
            _, best = _drive(tuner, host.ms)
            homes = [size for i, size in enumerate(best) if i == 0 or size != best[i - 1]]
            assert len(homes) == len(set(homes)), homes
            steps = [b / a for a, b in zip(homes, homes[1:], strict=False)]
            assert all(s == steps[0] for s in steps), homes  # one direction: 4 -> 8 -> 16, never 16 -> 32 -> 16
            settled_at = tuner.target
            for _ in range(200):
                tuner.observe(tuner.target, host.ms(tuner.target))
                assert tuner.target == settled_at


def test_a_neighbour_that_leaves_as_the_trial_starts_does_not_win_it_the_move():
    """The bench's incident: 16 was measured while another process held a core, 32 after it had gone."""
    tuner = OnlineTuner(16, max_size=64)
    busy_until = tuner.explore_after

    def ms(size: int) -> float:
        slowdown = 1.6 if tuner.batches < busy_until else 1.0
        return 1000.0 * size / RATES[size] * slowdown

    _drive(tuner, ms)
    assert tuner.settled and tuner.target == 16, tuner.summary()


def test_a_job_shorter_than_a_trial_does_not_explore():
    shortest_trial = 2 * MIN_ROUNDS * BLOCK_BATCHES  # a block of each size per round
    for seed in range(10):
        tuner = OnlineTuner(8, max_size=512)
        host = SharedHost(seed)
        for _ in range(shortest_trial - 1):
            assert tuner.target == 8
            tuner.observe(8, host.ms(8))
        assert tuner.target == 8 and not tuner.settled
        tuner.observe(8, host.ms(8))
        assert tuner.target == 16  # long enough now to measure a trial
