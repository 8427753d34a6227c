"""The doctor's probe reading what a real `java -version` process prints (a stand-in script)."""

from __future__ import annotations

import os
import stat

from spark_cnn.task import probe


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
