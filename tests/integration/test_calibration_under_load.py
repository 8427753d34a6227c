"""A real calibration with load injected while it runs: it is kept (never refused), records its spread, and the
tuner's pick from it still reaches 95% of the best throughput measured (on a quiet host) for small zoo networks.

The load is processes that copy 64 MiB over and over (neighbours streaming memory, as decoding tasks do), one
per core, switching on and off every LOAD_PHASE_S: load that changes during the run, the case the repeatability
check is there to catch (docs/perf-model.md, "Noisy hosts").
The best throughput is measured afterwards in the thread's CPU time (validate's clock "cpu", one thread), so
that other work on a shared test host moves the target less, in SWEEPS passes over the batch sizes; the pick is
judged within each pass (its sizes measured seconds apart) and the median pass must reach the target. About 2-3
minutes on 2 cores (the calibration takes its default budget, twice when noisy).

A performance target, so a benchmark: it runs under `make bench-noisy-calibration` (SPARK_CNN_BENCH=1), not in
`make test`, where a shared host's noise decides a 95% judgement as often as the calibration does (resnet18's
batch 8 sits at 93-95% of its batch 32 on a quiet host). The calibration kept with its spread under noise, and
the strict refusal, are tested without timing in tests/unit/perf/test_noisy_calibration.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import statistics
import subprocess
import sys

import pytest

from spark_cnn.perf_tools.calibration import calibrate
from spark_cnn.perf_tools.validate import PICK_TARGET, validate

pytestmark = pytest.mark.skipif(not os.environ.get("SPARK_CNN_BENCH"),
                                reason="a benchmark: make bench-noisy-calibration")

# The calibration's torch threads: one, so that validate's CPU clock can time the target.
THREADS = 1
# On, then off, for this long each: a repeat pass of the sample (about a second) and the sections it samples
# see different load.
LOAD_PHASE_S = 1.5
NETWORKS = ("mobilenet_v3_small", "resnet18")
BATCH_SIZES = [1, 8, 32]
# One pass's best moves by more than the 5% the target allows on a shared host (two passes put
# mobilenet_v3_small's batch 8 at 0.936 and 1.0 of their best): the median of three is judged.
SWEEPS = 3
BUSY_LOOP = ("import time\n"
             "source, target = bytes(64 << 20), bytearray(64 << 20)\n"
             "while True:\n"
             "    end = time.monotonic() + {phase}\n"
             "    while time.monotonic() < end:\n"
             "        target[:] = source\n"
             "    time.sleep({phase})\n")


@contextlib.contextmanager
def injected_load(processes: int, phase_s: float):
    """`processes` copying loops, each on for `phase_s` then off for `phase_s`, until the block ends (each one
    still running then)."""
    loops = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP.format(phase=phase_s)]) for _ in range(processes)]
    try:
        yield
        assert all(loop.poll() is None for loop in loops), "a load process ended before the calibration did"
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def test_a_calibration_under_changing_load_is_kept_and_the_pick_reaches_95_percent_of_the_best(tmp_path, caplog):
    with caplog.at_level(logging.WARNING), injected_load(os.cpu_count() or 1, LOAD_PHASE_S):
        # the default budget: a smaller one skips most convolution points, more so under load, and a sparse
        # table misprices whole stages (20 s here priced resnet18's layer3 at batch 8 17 times too slow)
        profile = calibrate("cpu", threads=THREADS, cache_dir=str(tmp_path), refresh=True)
    rep = profile.repeatability
    warned = [r.getMessage() for r in caplog.records if "kept on a noisy host" in r.getMessage()]
    print(f"calibration: others {profile.load['others_cpu_share']}, repeatability {dict(rep)}, "
          f"spread {profile.spread}, noisy {profile.noisy}")
    assert profile.load["others_cpu_share"] > 0.1  # the injected load was there
    assert rep["points"] >= 4 and profile.spread == pytest.approx(rep["median_pct"] / 100, abs=1e-4)
    assert len(warned) == (1 if profile.noisy and not rep["anomalies"] else 0)

    for name in NETWORKS:
        result = validate(name, BATCH_SIZES, profile, clock="cpu", sweeps=SWEEPS)
        pick = result["pick"]
        print(f"{name}: " + ", ".join(f"b{p['batch_size']} pred {p['predicted_ms']} meas {p['measured_ms']} ms"
                                      for p in result["points"])
              + f"; pick {pick['batch_size']}, best {pick['measured_best_batch_size']}, "
                f"{pick['fraction_of_best']} of the best (by sweep {pick['fraction_by_sweep']}), load {result['load']}")
        assert statistics.median(pick["fraction_by_sweep"]) >= PICK_TARGET, (name, pick)
