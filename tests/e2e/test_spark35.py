"""The core end-to-end tests under pyspark 3.5, in their own cached environment (spark35_env.py).

The tests marked `spark35` (classify, cnn_udf and classify(df), etl, in one Spark session) run again here: pytest is
started with the Spark 3.5 environment's interpreter, spark_cnn imported from this checkout (PYTHONPATH), so the
driver, the Spark workers and the sidecars all run pyspark 3.5 with the oldest pyarrow, pandas and numpy the
package supports. The first run builds the environment (~20 s with a warm pip cache); later runs reuse it.
"""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from tests.conftest import SHARED_DEMO_DIR_ENV
from tests.e2e.cached_env import python_or_fail
from tests.e2e.spark35_env import spark35_python

pytestmark = pytest.mark.e2e
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The files holding tests marked `spark35` (named, not discovered: collecting every test module under another
# pyspark would fail on modules that need pyspark 4 at import).
# `spark-cnn submit` is not among them: it runs pyspark's own spark-submit script (the same under 3.5 and 4) and
# is tested under pyspark 4 (tests/e2e/test_jobs.py); a second Spark application here cost ~25 s.
CORE_TEST_FILES = ("tests/integration/test_classify_job.py", "tests/integration/test_notebook_api.py",
                   "tests/integration/test_etl_job.py")
# The inner run starts one Spark session: ~1 minute here; generous for a busy machine.
INNER_TIMEOUT_S = 900


@pytest.fixture(scope="module")
def spark35() -> str:
    return python_or_fail(spark35_python)


def _environment(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": ROOT, **extra}
    for name in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):  # nothing of the pyspark 4 set-up
        env.pop(name, None)
    return env


def test_the_environment_runs_pyspark_35_and_this_checkout(spark35):
    done = subprocess.run([spark35, "-c", "import pyspark, spark_cnn; print(pyspark.__version__, spark_cnn.__file__)"],
                          capture_output=True, text=True, env=_environment(), cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    version, module = done.stdout.split()
    assert version.startswith("3.5.") and module == os.path.join(ROOT, "spark_cnn", "__init__.py")


def test_core_tests_pass_under_pyspark_35(spark35, demo_assets):
    shared = {SHARED_DEMO_DIR_ENV: os.path.dirname(demo_assets.images)}  # trained once, by this run
    done = subprocess.run([spark35, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "spark35",
                           "-W", "ignore::DeprecationWarning", *CORE_TEST_FILES],
                          capture_output=True, text=True, env=_environment(**shared), cwd=ROOT,
                          timeout=INNER_TIMEOUT_S)
    tail = (done.stdout + done.stderr)[-6000:]
    assert done.returncode == 0, tail  # pytest exits 5 when no test is selected, 1 when one fails
    assert not re.search(r"\d+ (skipped|xfailed|failed|errors?)\b", done.stdout), tail
