"""One job at a time per OUTPUT or checkpoint (spark/job_lock.py): the second stops at once with one line, and the
lock is free again once the first ends, also when its process is killed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from spark_cnn.errors import InputError
from spark_cnn.spark.job_lock import job_lock, job_locks


@pytest.mark.parametrize("first, second", [
    ("out", "out"), ("out", "./sub/../out"), ("s3://bkt/out", "s3a://BKT/out/"), ("hdfs://nn/o", "hdfs://nn:8020/o")])
def test_a_second_job_writing_the_same_output_stops_with_one_line(tmp_path, first, second):
    first, second = (u if "://" in u else str(tmp_path / u) for u in (first, second))
    with job_lock(first):
        with pytest.raises(InputError, match=r"output .* is being written by another job \(pid \d+ on .*\): wait "
                                             "for it to finish") as raised:
            with job_lock(second):
                pass
        assert second in str(raised.value) and "\n" not in str(raised.value)
    with job_lock(second):  # released at the end of the first
        pass


def test_an_etl_checkpoint_is_locked_as_an_output_is(tmp_path):
    with job_locks((str(tmp_path / "out"),), (str(tmp_path / "cp"),)):
        with pytest.raises(InputError, match=r"checkpoint .*/cp is being written by another job"):
            with job_locks((str(tmp_path / "out2"),), (str(tmp_path / "cp"),)):
                pass
        with job_lock(str(tmp_path / "other")):  # other places stay free
            pass


def test_the_lock_of_a_killed_job_is_free(tmp_path):
    output = str(tmp_path / "out")
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from spark_cnn.spark.job_lock import job_lock\n"
         f"with job_lock({output!r}):\n    print('held', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env={**os.environ})
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(InputError, match=f"pid {holder.pid} "):
            with job_lock(output):
                pass
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    with job_lock(output):  # the kernel dropped the dead process's lock
        pass
