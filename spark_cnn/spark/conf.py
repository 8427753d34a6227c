"""The Spark configuration a job was submitted with, read before any Spark work starts (for `spark.cnn.*` options).

Under spark-submit the driver JVM is already up and holds every `--conf` and the properties file: SparkConf reads
them from it without starting anything. Run as `spark-cnn` there is no JVM yet; the session it will start loads
`spark-defaults.conf` from SPARK_CONF_DIR (else SPARK_HOME/conf), so that file is what Spark conf means then.
"""

from __future__ import annotations

import os


def submitted_conf() -> dict[str, str]:
    """Every Spark setting visible to this driver before its session starts (key -> text)."""
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        from spark_cnn.spark.session import is_connect

        return dict(active.conf.getAll) if is_connect(active) else dict(active.sparkContext.getConf().getAll())
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # spark-submit started this process and its JVM
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # connects to that JVM; without it SparkConf() is an empty Python dict
        return dict(SparkConf(_jvm=SparkContext._jvm).getAll())
    path = defaults_file()
    if path is None:
        return {}
    with open(path, encoding="utf-8") as f:
        return parse_properties(f.read())


def defaults_file() -> str | None:
    """The spark-defaults.conf a session started from this process would load, if there is one."""
    folder = os.environ.get("SPARK_CONF_DIR")
    if folder is None:
        import pyspark

        folder = os.path.join(os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__), "conf")
    path = os.path.join(folder, "spark-defaults.conf")
    return path if os.path.isfile(path) else None


def parse_properties(text: str) -> dict[str, str]:
    """Java properties as Spark writes them: `key value`, `key=value` or `key:value`; `#` and `!` comments."""
    settings = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        cut = min((i for i in (line.find(c) for c in " \t=:") if i > 0), default=len(line))
        key, rest = line[:cut], line[cut:].lstrip()
        if rest[:1] in ("=", ":"):
            rest = rest[1:].lstrip()
        settings[key] = rest
    return settings
