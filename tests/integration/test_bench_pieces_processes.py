"""Bench pieces that start and stop real processes."""

from __future__ import annotations

import json
import statistics
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


def test_the_limit_times_the_model_beside_decoding_and_keeps_the_lone_core_figure(tmp_path):
    """The limit variant measures decoding on every core but one while the model runs on the last (spawned
    decoders, joined before it returns), and reports the lone-core limit beside it."""
    import io
    import multiprocessing

    import numpy as np
    import pytest
    import torch
    import torchvision
    from PIL import Image

    from spark_cnn.bench import variants
    from spark_cnn.bench.variant_task import VariantTask

    rng = np.random.default_rng(3)
    for i in range(24):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (320, 320, 3), dtype=np.uint8)).save(buf, format="JPEG")
        (tmp_path / f"{i:02d}.jpg").write_bytes(buf.getvalue())
    torch.manual_seed(0)
    weights = tmp_path / "m.pth"
    torch.save(torchvision.models.get_model("mobilenet_v3_small", weights=None).state_dict(), weights)
    task = VariantTask(variant="limit", model="mobilenet_v3_small", weights=str(weights), input=str(tmp_path),
                       warmup_input=str(tmp_path), images=0, measure_s=0.3, limit_batch_sizes=(8,))
    threads = torch.get_num_threads()
    try:
        result = variants.run_limit(task)
    finally:
        torch.set_num_threads(threads)
    assert result["images_per_s_alone"] == pytest.approx(variants.pipeline_limit(
        result["decode_per_s_one_core"], result["model_per_s_by_threads"], result["cores"]))
    assert not multiprocessing.active_children()  # every decoder joined
    if result["cores"] == 1:
        assert "side_by_side" not in result and result["images_per_s"] == result["images_per_s_alone"]
        return
    side = result["side_by_side"]
    assert side["decoders"] == result["cores"] - 1
    assert side["decode_per_s_per_core"] > 0 and side["model_per_s_one_thread"] > 0
    assert result["images_per_s"] == pytest.approx(variants.pipeline_limit(
        side["decode_per_s_per_core"], {1: side["model_per_s_one_thread"]}, result["cores"]))
    # Measured in task.limit_windows windows, the limit being the median window's.
    windows = side["windows"]
    assert len(windows) == task.limit_windows >= 3
    assert all(w["decode_per_s_per_core"] > 0 and w["model_per_s_one_thread"] > 0 for w in windows)
    assert result["images_per_s"] == pytest.approx(statistics.median(w["images_per_s"] for w in windows))
