"""`spark-cnn submit`: arguments passed on unchanged, SPARK_HOME and the Pythons filled in only when unset."""

from __future__ import annotations

import os

import pyspark
import pytest

from spark_cnn.cli import build_parser
from spark_cnn.cli.submit import spark_submit_command, split_argv
from spark_cnn.errors import ConfigError

PYSPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))


def test_arguments_after_submit_go_to_spark_submit_untouched():
    argv = ["submit", "--master", "local[2]", "jobs/classify.py", "in", "out", "--help"]
    parsed, passed_on = split_argv(argv)
    assert parsed == ["submit"] and passed_on == argv[1:]
    assert build_parser().parse_args(parsed).command == "submit"
    assert split_argv(["submit", "--help"]) == (["submit", "--help"], None)  # our own help
    assert split_argv(["classify", "in", "out"]) == (["classify", "in", "out"], None)


def test_spark_home_and_pythons_default_to_this_environment():
    command, env = spark_submit_command(["--master", "local[2]", "job.py"], {"PATH": "/usr/bin"}, "/venv/bin/python")
    assert command == [os.path.join(PYSPARK_HOME, "bin", "spark-submit"), "--master", "local[2]", "job.py"]
    assert env == {"PATH": "/usr/bin", "SPARK_HOME": PYSPARK_HOME, "PYSPARK_PYTHON": "/venv/bin/python",
                   "PYSPARK_DRIVER_PYTHON": "/venv/bin/python"}


def test_what_the_user_set_is_kept(tmp_path):
    spark = tmp_path / "spark"
    (spark / "bin").mkdir(parents=True)
    (spark / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    (spark / "bin" / "spark-submit").chmod(0o755)
    environ = {"SPARK_HOME": str(spark), "PYSPARK_PYTHON": "/opt/python3"}
    command, env = spark_submit_command(["job.py"], environ, "/venv/bin/python")
    assert command[0] == str(spark / "bin" / "spark-submit")
    assert env["PYSPARK_PYTHON"] == "/opt/python3" and env["PYSPARK_DRIVER_PYTHON"] == "/venv/bin/python"


def test_a_spark_home_without_spark_submit_is_one_line(tmp_path):
    with pytest.raises(ConfigError, match="is missing or not executable: set SPARK_HOME"):
        spark_submit_command(["job.py"], {"SPARK_HOME": str(tmp_path)})


# Each spark-submit entry point in jobs/ and the subcommand it must run (the e2e tests submit run.py and detect.py).
JOB_ENTRY_POINTS = {"classify.py": "classify", "detect.py": "detect", "embed.py": "embed", "segment.py": "segment",
                    "etl_incremental.py": "etl", "run.py": "run", "to_petastorm.py": "to-petastorm"}


def test_every_jobs_entry_point_runs_its_own_subcommand(monkeypatch, capsys):
    import runpy

    jobs = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))), "jobs")
    assert sorted(f for f in os.listdir(jobs) if f.endswith(".py")) == sorted(JOB_ENTRY_POINTS)
    for name, command in JOB_ENTRY_POINTS.items():
        monkeypatch.setattr("sys.argv", [os.path.join(jobs, name), "--help"])
        with pytest.raises(SystemExit) as exited:
            runpy.run_path(os.path.join(jobs, name), run_name="__main__")
        assert exited.value.code == 0, name
        assert capsys.readouterr().out.startswith(f"usage: spark-cnn {command} "), name
