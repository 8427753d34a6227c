"""Bench pieces that start and stop real processes."""

from __future__ import annotations

import json
import subprocess
import sys
import time

from spark_cnn.bench import memory

# Run in a child process: the sampler watches, adopts and kills its own process tree, which in pytest's process
# would include every other test's Spark JVM and sidecars.
SAMPLER_SCENARIO = """
import json, os, subprocess, sys, time
from spark_cnn.bench import memory

memory.become_subreaper()
# A child that allocates ~200 MB, and an orphaned grandchild that outlives it (as a sidecar outlives the
# Spark worker that started it); the subreaper adopts the grandchild.
script = ("import subprocess, sys, time; "
          "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
          "x = bytearray(200 << 20); time.sleep(1.5)")
with memory.TreeMemorySampler(interval_s=0.1) as sampler:
    subprocess.run([sys.executable, "-c", script], check=True, timeout=60)
started = time.monotonic()
killed = memory.reap_leftovers(grace_s=0.5)
print(json.dumps({"peak_rss": sampler.peak_rss, "peak_processes": sampler.peak_processes, "killed": killed,
                  "left": memory.descendants(os.getpid()), "reap_s": time.monotonic() - started}))
"""


def test_sampler_counts_the_whole_tree_and_leftovers_are_killed_and_named():
    done = subprocess.run([sys.executable, "-c", SAMPLER_SCENARIO], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["peak_rss"] >= 200 << 20
    assert seen["peak_processes"] >= 2
    assert len(seen["killed"]) == 1 and "time.sleep(60)" in seen["killed"][0]
    assert seen["left"] == [] and seen["reap_s"] < 10


def test_sampler_reads_pss_at_most_once_a_second():
    # PSS costs ~25 ms of CPU per read of a Spark tree: read on every sample, it slowed the variant measured.
    child = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(50 << 20); time.sleep(30)"])
    try:
        time.sleep(0.5)
        sampler = memory.TreeMemorySampler()
        started = time.monotonic()
        for _ in range(10):
            sampler.sample()
        assert time.monotonic() - started < memory.PSS_MIN_INTERVAL_S
        assert sampler.samples == 10 and sampler.pss_reads == 1
        assert sampler.peak_pss is not None and sampler.peak_rss >= 50 << 20
    finally:
        child.kill()
        child.wait()
