"""The doctor's probe pieces that need no Spark: the probe model is the demo CNN, versions come from package
metadata, `java -version` is parsed from a stand-in script."""

from __future__ import annotations

import importlib.metadata
import os
import stat

import pytest

from spark_cnn import __version__
from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING
from spark_cnn.task import probe


def test_the_probe_model_is_the_demo_cnn():
    assert probe.PROBE_MODEL == DIGITS_FACTORY and probe.PROBE_PREPROCESSING == DIGITS_PREPROCESSING


def test_versions_come_from_metadata_and_spark_cnn_from_the_package_itself():
    assert probe.package_version("pyarrow") == importlib.metadata.version("pyarrow")
    assert probe.package_version("spark_cnn") == __version__
    assert probe.package_version("no-such-package-here") is None


@pytest.mark.slow  # starts a process
def test_java_version_is_read_from_what_java_prints(tmp_path):
    java = tmp_path / "java"
    java.write_text('#!/bin/sh\necho \'openjdk version "17.0.15" 2025-04-15\' >&2\n')
    java.chmod(java.stat().st_mode | stat.S_IXUSR)
    assert probe.java_version(str(java)) == ("17.0.15", None)
    java.write_text("#!/bin/sh\necho nothing\n")
    assert probe.java_version(str(java))[0] is None
    assert probe.java_version(None) == (None, "no java: set JAVA_HOME or put java 17+ on PATH")
    version, error = probe.java_version(os.path.join(str(tmp_path), "missing"))
    assert version is None and "failed" in error
