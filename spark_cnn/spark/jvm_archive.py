"""A class-data-sharing (CDS) archive of the driver JVM's classes: the driver JVMs that spark_cnn starts map
Spark's classes from it instead of loading and verifying them from the jars again.

A local Spark session (start, one small job, stop) cost 21-22 CPU-s and 17-18 s on the 2-core AMD guest, 13-14
CPU-s and 10.6-11 s with the archive (docs/benchmarks.md, "The driver JVM's start"). The archive is the JDK's own
dynamic archive (`-XX:ArchiveClassesAtExit`): a JVM that ran a small job of the kind the jobs run (Arrow to and
from a Python worker, Parquet written and read) writes the classes it loaded when it exits. It is only valid for
the same JDK, the same jars and a class path it is a prefix of, so its name is a hash of those, and the JVM is
told to use it quietly: one that does not fit (a user's extra driver class path in front, a jar changed in place)
is refused by the JVM, which then starts as it would without it.

Built by `python -m spark_cnn.spark.jvm_archive` (`make` runs it after installing), under
`$SPARK_CNN_JVM_ARCHIVE_DIR`, else `$XDG_CACHE_HOME/spark_cnn/jvm` (`~/.cache/...`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time

from spark_cnn.paths import user_cache_dir

ARCHIVE_DIR_ENV = "SPARK_CNN_JVM_ARCHIVE_DIR"
# The JVM's CDS messages off: an archive that does not fit is a slower start, not something to print.
QUIET = "-Xlog:cds=off,cds+dynamic=off"
BUILD_TIMEOUT_S = 300


def archive_dir() -> str:
    return os.environ.get(ARCHIVE_DIR_ENV) or user_cache_dir("jvm")


def _java() -> str | None:
    """The java that spark-class runs: $JAVA_HOME/bin/java, else the first on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = os.path.join(home, "bin", "java") if home else shutil.which("java")
    return os.path.realpath(found) if found and os.path.exists(found) else None


def _spark_jars() -> str:
    import pyspark

    home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
    return os.path.join(home, "jars")


def archive_path() -> str | None:
    """Where the archive for this JDK and these jars is (or would be); None without a java."""
    java = _java()
    if java is None:
        return None
    digest = hashlib.sha256()
    jvm_home = os.path.dirname(os.path.dirname(java))
    for path in (java, os.path.join(jvm_home, "lib", "server", "libjvm.so"), os.path.join(jvm_home, "lib", "modules")):
        with contextlib.suppress(OSError):
            info = os.stat(path)
            digest.update(f"{path}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    jars = _spark_jars()
    with contextlib.suppress(OSError):
        for name in sorted(os.listdir(jars)):
            info = os.stat(os.path.join(jars, name))
            digest.update(f"{jars}/{name}\0{info.st_size}\0{info.st_mtime_ns}\n".encode())
    return os.path.join(archive_dir(), f"spark-driver-{digest.hexdigest()[:16]}.jsa")


def java_options() -> str:
    """The driver JVM's options that use the archive, or "" when there is none for this JDK and these jars."""
    path = archive_path()
    return f"-XX:SharedArchiveFile={path} {QUIET}" if path and os.path.isfile(path) else ""


def build(timeout_s: float = BUILD_TIMEOUT_S) -> str:
    """Build the archive unless it exists or another process is building it; returns one line saying which."""
    path = archive_path()
    if path is None:
        return "JVM class archive: no java found (set JAVA_HOME)"
    if os.path.isfile(path):
        return f"JVM class archive: {path}"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(os.path.join(os.path.dirname(path), ".build.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return "JVM class archive: another process is building it"
        if os.path.isfile(path):
            return f"JVM class archive: {path}"
        partial = f"{path}.{os.getpid()}.partial"
        started = time.monotonic()
        try:
            done = subprocess.run([sys.executable, "-m", "spark_cnn.spark.jvm_archive", "--write", partial],
                                  capture_output=True, text=True, timeout=timeout_s)
            if done.returncode != 0 or not os.path.isfile(partial):
                tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
                return f"JVM class archive: not built ({tail})"
            os.replace(partial, path)
        except subprocess.TimeoutExpired:
            return f"JVM class archive: not built (took over {timeout_s:.0f} s)"
        finally:
            with contextlib.suppress(OSError):
                os.remove(partial)
        return f"JVM class archive: built in {time.monotonic() - started:.0f} s, {path}"


def _write(partial: str) -> None:
    """In a child process: run a small job of the jobs' kind in a driver JVM that dumps its classes at exit, and
    wait for that JVM to exit (it dumps then), so the file is whole when this returns."""
    import pyarrow as pa
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[1]").appName("spark_cnn-jvm-archive")
             .config("spark.driver.extraJavaOptions", f"-XX:ArchiveClassesAtExit={partial}")
             .config("spark.ui.showConsoleProgress", "false").getOrCreate())

    jvm = SparkContext._gateway.proc

    def echo(batches):
        for batch in batches:
            yield pa.RecordBatch.from_pydict({"path": batch.column(0), "size": pa.array([1] * batch.num_rows)})

    with tempfile.TemporaryDirectory(prefix="spark_cnn_jvm_archive_") as folder:
        frame = spark.createDataFrame([(f"/images/{i}.jpg",) for i in range(64)], "path string")
        frame.mapInArrow(echo, "path string, size long").write.parquet(os.path.join(folder, "out"))
        assert spark.read.parquet(os.path.join(folder, "out")).count() == 64
    spark.stop()
    jvm.stdin.close()  # the gateway JVM exits when its stdin closes, and writes the archive as it exits
    jvm.wait(timeout=BUILD_TIMEOUT_S)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--write"]:
        _write(argv[1])
        return 0
    print(build())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
