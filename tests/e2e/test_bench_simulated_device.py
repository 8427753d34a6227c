"""`spark-cnn bench --models sim:resnet50-h200`: the whole classify pipeline against a simulated device reports a
GPU node's CPU budget (one Spark application: the sidecar-decode path, the GPU host's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e
# One Spark application on 64 images and the decode-only limit: 90 s on the 2-core host at load 4-5.
TIMEOUT_S = 300


def test_the_sidecar_decode_path_against_a_simulated_h200_reports_cores_per_1k_img_s(tmp_path):
    out = tmp_path / "bench.json"
    result = subprocess.run([os.path.join(os.path.dirname(sys.executable), "spark-cnn"), "bench", "--quick",
                             "--models", "sim:resnet50-h200", "--images", "64",
                             "--variants", "spark_cnn_sidecar_decode", "limit", "--json", str(out)],
                            capture_output=True, text=True, timeout=TIMEOUT_S)
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["model"] == "sim:resnet50-h200" and data["results"]["spark_cnn_sidecar_decode"] > 0
    detail = data["details"]["spark_cnn_sidecar_decode"]
    assert detail["errors"] == 0 and detail["images"] == 64 and detail["decode"] == ["sidecar"]
    assert detail["batch_size"] == 64 and detail["leftover_processes"] == []
    budget = data["device_budget"]["spark_cnn_sidecar_decode"]
    assert budget["decode_ms_per_image"] > 0 and budget["cores_per_1k_img_s"] > budget["decode_ms_per_image"]
    assert budget["framework_cores_per_1k_img_s"] > 0
    assert budget["beyond_decoding_ms_per_image"]["jvm"] > 0
    assert budget["beyond_decoding_ms_per_image"]["python_worker"] > 0
    assert "cores/1k img/s" in result.stdout and "beyond decoding" in result.stdout
