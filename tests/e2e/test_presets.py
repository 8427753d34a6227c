"""`spark-submit jobs/run.py PRESET`: an unknown spark.cnn key stops the job in one line. The order of precedence
(flags over the preset over `--conf spark.cnn.*`) is checked on a real run by
tests/e2e/test_jobs.py::test_spark_cnn_submit_runs_a_preset_with_flags_over_preset_over_spark_conf, which runs
the same spark-submit through `spark-cnn submit`."""

from __future__ import annotations

import os
import shutil
import sys

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


def test_an_unknown_spark_cnn_key_is_one_line(preset, tmp_path):
    result = _spark_submit("--conf", "spark.cnn.batchsize=8", os.path.join(REPO, "jobs", "run.py"), preset,
                           str(tmp_path / "in"), str(tmp_path / "out"))
    assert result.returncode == 2
    # spark-submit merges the Python driver's stderr into its own stdout.
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("spark-cnn")]
    assert len(lines) == 1 and "unknown Spark conf key spark.cnn.batchsize" in lines[0]
    assert "spark.cnn.batchSize" in lines[0]
    assert not (tmp_path / "out").exists()
