"""`spark-cnn bench --quick` runs every variant end to end (a smoke run: no thresholds) and leaves nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from spark_cnn.bench.variants import PEER_VARIANTS, SIDECAR_DECODE_VARIANT, VARIANTS

pytestmark = pytest.mark.e2e
# --quick with 64 images takes about a minute on an idle 2-core machine (three Spark sessions).
QUICK_TIMEOUT_S = 900
# Ray Data and Daft (optional packages) add about a minute here: their wiring is tested in tests/unit/bench.
# The row-at-a-time UDF runs through predict_batch_udf's process shell (_run_spark_udf); its UDF is checked in the
# shared Spark session (tests/integration/test_bench_udfs.py), which saves a Spark application (~20 s) here.
# spark_cnn_sidecar_decode is classify with --decode sidecar (tests/integration cover that job; its wiring into the
# bench has a unit test): one Spark application less here.
OWN_VARIANTS = tuple(v for v in VARIANTS if v not in PEER_VARIANTS and v not in ("row", SIDECAR_DECODE_VARIANT))


def test_bench_quick_runs_every_variant_with_cpu_per_image_by_process_memory_json_and_plot(tmp_path):
    # One run keeps the suite short: the near-free model goes through every variant's own loader (a user's
    # TorchScript file), so a broken variant fails here as it would with a real model; 64 images.
    out, png = tmp_path / "bench.json", tmp_path / "bench.png"
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "spark-cnn"), "bench", "--quick",
                             "--models", "identity", "--images", "64", "--variants", *OWN_VARIANTS,
                             "--json", str(out), "--plot", str(png)],
                            capture_output=True, text=True, timeout=QUICK_TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["model"] == "identity" and data["images"] == 64 and "CPU cores" in data["machine"]
    assert set(data["results"]) == set(OWN_VARIANTS)
    assert all(rate > 0 for rate in data["results"].values()), data["results"]
    for variant in OWN_VARIANTS:
        detail = data["details"][variant]
        assert detail["leftover_processes"] == [], (variant, detail["leftover_processes"])
        if variant != "limit":
            assert detail["images"] == data["images"]  # every variant classified every image once
            assert data["memory_mb"][variant] > 0
    spark_cnn = data["details"]["spark_cnn"]
    assert spark_cnn["errors"] == 0 and spark_cnn["decode"] == ["task"]  # --decode auto on a CPU
    assert data["details"]["predict_batch_udf"]["peak_rss_mb_by_process"]["jvm"] > 0

    limit = data["details"]["limit"]
    assert limit["model_per_s_by_threads"] == {}  # the decode-only limit: the cores' decode rate
    assert limit["images_per_s_alone"] == pytest.approx(limit["cores"] * limit["decode_per_s_one_core"], rel=0.01)
    decoding = limit["side_by_side"]["decode_per_s_per_core"] if limit["cores"] > 1 else limit["decode_per_s_one_core"]
    assert data["results"]["limit"] == pytest.approx(limit["cores"] * decoding, rel=0.01)  # every core decoding
    cpu = data["cpu_ms_per_image"]
    for variant in ("bare", "predict_batch_udf", "spark_cnn"):
        assert cpu[variant]["total"] > 0, (variant, cpu[variant])
    assert cpu["bare"]["driver"] > 0 and "jvm" not in cpu["bare"]  # one plain process
    assert cpu["predict_batch_udf"]["jvm"] > 0 and cpu["predict_batch_udf"]["python_worker"] > 0
    assert "sidecar" not in cpu["predict_batch_udf"]
    assert cpu["spark_cnn"]["jvm"] > 0 and cpu["spark_cnn"]["python_worker"] > 0 and "sidecar" in cpu["spark_cnn"]

    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for line in ("images/s", "x spark_cnn", "decode-only limit", "CPU ms per image", "python_worker",
                 "spark_cnn: ", "CPU ms per image beyond decoding"):
        assert line in result.stdout
