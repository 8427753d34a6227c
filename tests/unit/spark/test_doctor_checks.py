"""The doctor's checks over what it found (plain dicts; no Spark, no processes) and its table."""

from __future__ import annotations

from spark_cnn.cli.doctor import table
from spark_cnn.spark.doctor import failed_checks, worker_error


def _facts(**changes) -> dict:
    facts = {"host": "h1", "python": "3.11.7", "python_path": "/venv/bin/python", "pyspark": "3.5.9",
             "pyarrow": "18.1.0", "numpy": "1.26.4", "pandas": "2.2.3", "torch": "2.14.1", "torchvision": "0.29.1",
             "pillow": "11.0.0", "spark_cnn": "0.1.0", "gpus": [], "java": "17.0.15", "java_error": None,
             "runtime_dir": "/tmp/spark_cnn-0", "runtime_dir_error": None}
    return {**facts, **changes}


def _executor(**changes) -> dict:
    sidecar = {"ok": True, "pid": 42, "device": "cuda:0", "seconds": 2.5}
    return _facts(**{"executor": "1", "spark_gpus": ["0"], "sidecar": sidecar, **changes})


def test_all_well_is_no_failure():
    assert failed_checks(_facts(), _executor(), None) == []


def test_each_failed_check_is_one_line_naming_where_and_what_to_do():
    driver = _facts(java=None, java_error="no java: set JAVA_HOME or put java 17+ on PATH")
    executor = _executor(torch=None, torchvision=None, python="3.10.12", spark_cnn="0.0.9",
                         runtime_dir=None, runtime_dir_error="sidecar directory /x is a symbolic link; remove it",
                         sidecar={"ok": False, "error": "the sidecar exited with code 1 while starting"})
    failures = failed_checks(driver, executor, None)
    assert failures == [
        "driver java: no java: set JAVA_HOME or put java 17+ on PATH",
        "executor 1 on h1: torch, torchvision not installed for /venv/bin/python: pip install spark_cnn there, "
        "or point PYSPARK_PYTHON at a Python that has it",
        "executor 1 on h1: Python 3.10.12 where the driver has 3.11.7: use the same minor version on both",
        "executor 1 on h1: spark_cnn 0.0.9 where the driver has 0.1.0: install the same version on both",
        "executor 1 on h1: runtime dir: sidecar directory /x is a symbolic link; remove it",
        "executor 1 on h1: the sidecar did not start or answer: the sidecar exited with code 1 while starting"]
    assert all("\n" not in line for line in failures)


def test_a_connect_client_needs_no_java_and_a_failed_task_is_one_line():
    driver = _facts(java=None, java_error="no java", session="connect")
    assert failed_checks(driver, None, "ModuleNotFoundError: No module named 'pyarrow'") == [
        "executor: the probe task failed: ModuleNotFoundError: No module named 'pyarrow'"]


def test_worker_error_is_the_python_exception_inside_spark_text():
    text = ("An error occurred while calling o45.collectToPython.\n"
            ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 failed\n"
            "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
            '  File "worker.py", line 1, in <module>\n'
            "ModuleNotFoundError: No module named 'pyarrow'\n"
            "\tat org.apache.spark.api.python.BasePythonRunner.handlePythonException(PythonRunner.scala:572)\n")
    assert worker_error(text) == "ModuleNotFoundError: No module named 'pyarrow'"
    assert worker_error("Connection refused\nmore") == "Connection refused"


def test_table_has_a_driver_and_an_executor_column():
    lines = table(_facts(), _executor()).splitlines()
    assert lines[0].split() == ["driver", "executor", "1"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["pyspark"] == ["3.5.9", "3.5.9"] and rows["java"] == ["17.0.15", "17.0.15"]
    assert rows["sidecar"] == ["-", "ok:", "pid", "42", "on", "cuda:0,", "answered", "in", "2.5", "s,", "stopped"]
    assert rows["gpus"] == ["none", "none;", "Spark", "gave", "0"]
    assert table(_facts(), None).splitlines()[1].split() == ["host", "h1", "-"]
