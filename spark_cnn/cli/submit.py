"""`spark-cnn submit ARGS...`: Spark's `spark-submit`, run with this environment's Spark and Python.

pip's pyspark puts a `spark-submit` script in the venv's `bin/`, but that script finds SPARK_HOME by running
`python3` from PATH, which outside an activated venv is the system's (no pyspark: "/bin/spark-class: No such
file or directory"), and Spark's Python workers run `python3` too (no pyarrow, no spark_cnn). This command
runs the same script with SPARK_HOME set to the installed pyspark (unless SPARK_HOME names a Spark already) and
the driver's and workers' Python set to this interpreter (unless PYSPARK_PYTHON / PYSPARK_DRIVER_PYTHON are
set). Every argument is passed on unchanged.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections.abc import Mapping

from spark_cnn.errors import ConfigError

NAME = "submit"


def register(commands) -> None:
    parser = commands.add_parser(
        NAME, help="run spark-submit with this environment's Spark and Python (arguments passed on unchanged)",
        description="spark-cnn submit [spark-submit options] APP [app arguments]: Spark's spark-submit with "
                    "SPARK_HOME and PYSPARK_PYTHON set from this environment when unset.")
    parser.add_argument("spark_submit_args", nargs=argparse.REMAINDER,
                        help="spark-submit's own arguments, e.g. --master local[2] jobs/classify.py IN OUT")
    parser.set_defaults(run=run)


def split_argv(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """(what argparse parses, what goes to spark-submit untouched). argparse cannot hand on arguments that
    start with `--` (`submit --master ...`), so `submit`'s are taken off first; `submit -h` stays argparse's."""
    if argv[:1] == [NAME] and argv[1:2] not in (["-h"], ["--help"]):
        return argv[:1], argv[1:]
    return argv, None


def spark_submit_command(args: list[str], environ: Mapping[str, str], python: str = sys.executable
                         ) -> tuple[list[str], dict[str, str]]:
    """The spark-submit command line and its environment: SPARK_HOME defaults to the installed pyspark, the
    driver's and workers' Python to `python`; values the caller's environment has are kept."""
    home = environ.get("SPARK_HOME") or _installed_pyspark()
    script = os.path.join(home, "bin", "spark-submit")
    if not os.access(script, os.X_OK):
        raise ConfigError(f"{script} is missing or not executable: set SPARK_HOME to a Spark installation")
    env = {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python, **environ, "SPARK_HOME": home}
    return [script, *args], env


def _installed_pyspark() -> str:
    spec = importlib.util.find_spec("pyspark")  # found, not imported: spark-submit starts its own driver
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("no Spark to submit to: pyspark is not installed here and SPARK_HOME is not set; "
                          "pip install 'spark_cnn[spark]' or set SPARK_HOME")
    return os.path.abspath(list(spec.submodule_search_locations)[0])


def run(args: argparse.Namespace) -> int:
    command, env = spark_submit_command(args.spark_submit_args, os.environ)
    sys.stdout.flush()
    os.execve(command[0], command, env)  # spark-submit's exit status and signals are the command's own
    return 0  # not reached
