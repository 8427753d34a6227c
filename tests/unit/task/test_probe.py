"""The doctor's probe pieces that need no Spark: the probe model is the demo CNN, versions come from package
metadata, `java -version` is parsed from a stand-in script."""

from __future__ import annotations

import importlib.metadata

from spark_cnn import __version__
from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING
from spark_cnn.task import probe


def test_the_probe_model_is_the_demo_cnn():
    assert probe.PROBE_MODEL == DIGITS_FACTORY and probe.PROBE_PREPROCESSING == DIGITS_PREPROCESSING


def test_versions_come_from_metadata_and_spark_cnn_from_the_package_itself():
    assert probe.package_version("pyarrow") == importlib.metadata.version("pyarrow")
    assert probe.package_version("spark_cnn") == __version__
    assert probe.package_version("no-such-package-here") is None


