"""What `pip install spark_cnn` brings: what executors run, never pyspark (a cluster's runtime has its own),
demo, benchmark or plotting packages; each of those is an extra, named in one line when it is missing."""

from __future__ import annotations

import os
import re

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


