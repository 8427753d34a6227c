"""The driver JVM's class archive (spark/jvm_archive.py) is named by the JDK and the jars it was made from: a jar
changed, added or a JDK changed gives another name, so a JVM is never pointed at an archive of other classes; with
no archive for this installation the driver's options do not mention one."""

from __future__ import annotations

import os

import pytest

from spark_cnn.spark import jvm_archive
from spark_cnn.spark.session import driver_java_options


@pytest.fixture
def installation(tmp_path, monkeypatch):
    """A JDK and a Spark home of files (nothing here runs them), and an empty archive folder."""
    java_home, spark_home = tmp_path / "jdk", tmp_path / "spark"
    (java_home / "bin").mkdir(parents=True)
    (java_home / "bin" / "java").write_text("#!/bin/sh\n")
    (java_home / "lib" / "server").mkdir(parents=True)
    (java_home / "lib" / "server" / "libjvm.so").write_bytes(b"jvm 17")
    (spark_home / "jars").mkdir(parents=True)
    (spark_home / "jars" / "spark-core.jar").write_bytes(b"core 4.0")
    monkeypatch.setenv("JAVA_HOME", str(java_home))
    monkeypatch.setenv("SPARK_HOME", str(spark_home))
    monkeypatch.setenv(jvm_archive.ARCHIVE_DIR_ENV, str(tmp_path / "archives"))
    return java_home, spark_home


def test_the_archive_is_named_by_the_jdk_and_every_jar(installation):
    java_home, spark_home = installation
    first = jvm_archive.archive_path()
    assert os.path.dirname(first) == os.environ[jvm_archive.ARCHIVE_DIR_ENV] and first.endswith(".jsa")
    assert jvm_archive.archive_path() == first  # the same installation, the same name
    names = {first}
    (spark_home / "jars" / "spark-core.jar").write_bytes(b"core 4.0.1")  # replaced in place, another size
    names.add(jvm_archive.archive_path())
    (spark_home / "jars" / "extra.jar").write_bytes(b"x")
    names.add(jvm_archive.archive_path())
    (java_home / "lib" / "server" / "libjvm.so").write_bytes(b"jvm 17.0.2")
    names.add(jvm_archive.archive_path())
    assert len(names) == 4


def test_the_driver_uses_the_archive_only_once_it_exists(installation):
    assert jvm_archive.java_options() == "" and "SharedArchiveFile" not in driver_java_options()
    path = jvm_archive.archive_path()
    os.makedirs(os.path.dirname(path))
    open(path, "wb").close()
    assert jvm_archive.java_options() == f"-XX:SharedArchiveFile={path} {jvm_archive.QUIET}"
    assert driver_java_options().endswith(jvm_archive.java_options())
    assert "-Dlog4j2.configurationFile=" in driver_java_options()


def test_without_java_there_is_no_archive_and_nothing_to_build(tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    assert jvm_archive.archive_path() is None and jvm_archive.java_options() == ""
    assert "no java found" in jvm_archive.build()
