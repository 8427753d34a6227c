"""`spark-submit jobs/run.py PRESET`: options from the preset, from `--conf spark.cnn.*` and from flags, in that
order of precedence reversed; an unknown spark.cnn key stops the job in one line."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pyarrow.parquet as pq
import pytest

from spark_cnn.models.digits import DIGITS_FACTORY
from tests.e2e.conftest import run_command

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _spark_submit(*args: str):
    import pyspark

    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    return run_command([os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit"), "--master", "local[1]",
                        *args], env=env)


@pytest.fixture
def preset(demo_assets, tmp_path) -> str:
    images = tmp_path / "in"
    for label in ("3", "7"):
        (images / label).mkdir(parents=True)
        for name in sorted(os.listdir(os.path.join(demo_assets.images, label)))[:4]:
            shutil.copy(os.path.join(demo_assets.images, label, name), images / label)
    path = tmp_path / "digits.yaml"
    path.write_text(f"job: classify\ninput: {images}\noutput: {tmp_path / 'out'}\nmodel: {DIGITS_FACTORY}\n"
                    f"weights: {demo_assets.weights}\nlabels: {demo_assets.labels}\ntop-k: 2\ndevice: cuda\n")
    return str(path)


def test_flags_over_preset_over_spark_conf(preset, tmp_path):
    result = _spark_submit("--conf", "spark.cnn.topK=4", "--conf", "spark.cnn.batchSize=4",
                           "--conf", "spark.cnn.device=cuda:1", os.path.join(REPO, "jobs", "run.py"), preset,
                           "--device", "cpu", "--quiet")
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout == ""  # --quiet
    summary = json.loads((tmp_path / "out" / "_summary.json").read_text())
    assert summary["images"] == 8 and summary["batch_size"] == 4  # Spark conf over the default (auto)
    assert [s["device"] for s in summary["sidecars"]] == ["cpu"]  # the flag over preset and Spark conf
    topk = pq.read_table(str(tmp_path / "out"), columns=["topk"]).column("topk").to_pylist()
    assert {len(t) for t in topk} == {2}  # the preset over Spark conf


def test_an_unknown_spark_cnn_key_is_one_line(preset, tmp_path):
    result = _spark_submit("--conf", "spark.cnn.batchsize=8", os.path.join(REPO, "jobs", "run.py"), preset,
                           str(tmp_path / "in"), str(tmp_path / "out"))
    assert result.returncode == 2
    # spark-submit merges the Python driver's stderr into its own stdout.
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("spark-cnn")]
    assert len(lines) == 1 and "unknown Spark conf key spark.cnn.batchsize" in lines[0]
    assert "spark.cnn.batchSize" in lines[0]
    assert not (tmp_path / "out").exists()
