"""What `pip install spark_cnn` brings: what executors run, never pyspark (a cluster's runtime has its own),
demo, benchmark or plotting packages; each of those is an extra, named in one line when it is missing."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10: the same parser, as pip vendors it
    from pip._vendor import tomli as tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "pyproject.toml"), "rb") as _f:
    PROJECT = tomllib.load(_f)["project"]
EXTRAS = {"spark": "pyspark", "demo": "scikit-learn", "bench": "scikit-image", "plot": "matplotlib"}


def _name(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9_.-]+", requirement).group(0).lower()


def test_a_plain_install_leaves_pyspark_and_the_tools_to_extras():
    required = {_name(r) for r in PROJECT["dependencies"]}
    assert not required & {"pyspark", "scikit-learn", "scikit-image", "matplotlib"}, required
    extras = PROJECT["optional-dependencies"]
    for extra, package in EXTRAS.items():
        assert package in {_name(r) for r in extras[extra]}, (extra, package)
    assert extras["spark"] == ["pyspark>=3.5,<5"]  # the Spark versions tested (tests/e2e/test_spark35.py)


# Extras dev leaves out, each for a reason: peers (Ray Data, Daft: ~400 MB) serve only two bench variants, which
# are skipped with one line without them.
OUTSIDE_DEV = {"peers"}


def test_dev_installs_every_extra():
    dev = PROJECT["optional-dependencies"]["dev"]
    itself = next(r for r in dev if _name(r) == "spark_cnn")
    named = set(re.search(r"\[(.*)\]", itself).group(1).split(","))
    assert named == set(PROJECT["optional-dependencies"]) - {"dev"} - OUTSIDE_DEV


@pytest.mark.slow  # a fresh interpreter, as if the extras were not installed
def test_a_missing_extra_says_which_to_install():
    script = textwrap.dedent("""
        import sys
        for name in ("pyspark", "sklearn", "matplotlib"):
            sys.modules[name] = None  # as if not installed: importing it raises ImportError
        from spark_cnn.cli import main
        from spark_cnn.errors import MissingExtra
        from spark_cnn.models.digits import write_digit_images
        from spark_cnn.perf_tools.commands import plot_profile

        for call in (lambda: write_digit_images("/nonexistent"), lambda: plot_profile({}, "x.png")):
            try:
                call()
            except MissingExtra as e:
                print(e)
        print("exit", main(["classify", "in", "out"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout.splitlines() == ["the demo's digits needs scikit-learn: pip install 'spark_cnn[demo]'",
                                        "--plot needs matplotlib: pip install 'spark_cnn[plot]'", "exit 2"]
    assert done.stderr.strip() == ("spark-cnn classify: error: spark_cnn's Spark side (jobs, classify(df), cnn_udf) "
                                   "needs pyspark: pip install 'spark_cnn[spark]'")
