"""`spark-cnn etl` as cron would run it: a run SIGKILLed midway while a copy is in progress, then new files and
files unpacked with their old modification times, and a rerun while the copy is still going. Every image must end
up in the output exactly once. One history in one test: each run starts its own Spark. How a completed copy is
taken once settled is tests/integration/test_etl_job.py's (the same listing and settle rule, in the shared session).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tarfile
import threading
import time
from datetime import datetime, timezone

import pyarrow.parquet as pq
import pytest

from spark_cnn.models.digits import DIGITS_FACTORY
from tests.e2e.conftest import BIN, JOB_TIMEOUT_S, run_command, sidecars_left_since, sidecars_now
from tests.sample_images import broken_files, real_image_files, write_files

pytestmark = pytest.mark.e2e

SETTLE_S = 2  # --settle-seconds of the runs: the copy in progress changes more often than this
CHUNK_EVERY_S = 0.1  # the slow copy appends a chunk this often: its file never stays unchanged for SETTLE_S


def _add_digits(demo_assets, root: str, start: int, per_class: int) -> list[str]:
    added = []
    for label in sorted(os.listdir(demo_assets.images)):
        os.makedirs(os.path.join(root, label), exist_ok=True)
        for name in sorted(os.listdir(os.path.join(demo_assets.images, label)))[start:start + per_class]:
            added.append(shutil.copy(os.path.join(demo_assets.images, label, name), os.path.join(root, label)))
    return added


def _rows_per_path(output: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    if os.path.isdir(output):
        for path in pq.read_table(output, columns=["path"]).column("path").to_pylist():
            key = path.removeprefix("file:")
            counts[key] = counts.get(key, 0) + 1
    return counts


def _processes_in_group(pgid: int) -> list[int]:
    found = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            if os.getpgid(pid) == pgid:
                found.append(pid)
        except ProcessLookupError:
            pass
    return found


def _settle(paths: list[str]) -> None:
    """Modification times a minute back: settled for the runs, as files copied long before would be."""
    for path in paths:
        os.utime(path, (time.time() - 60, time.time() - 60))


def test_copy_in_progress_unpacked_old_files_and_a_killed_run_land_every_image_exactly_once(demo_assets, tmp_path):
    """One cron history, each run a real `spark-cnn etl`: a run in small micro-batches is SIGKILLed midway while a
    copy is in progress, then new arrivals and an archive unpacked with 2001 modification times (far older than
    what the killed run committed) come in, and the rerun takes exactly what the killed run had not committed and
    leaves the copy, still being written, waiting."""
    source, output, checkpoint = str(tmp_path / "in"), str(tmp_path / "out"), str(tmp_path / "checkpoint")
    sidecars_before = sidecars_now()
    expected = _add_digits(demo_assets, source, 0, 2)
    write_files(source, broken_files())
    expected += [os.path.join(source, rel) for rel in broken_files()]
    _settle(expected)
    command = [os.path.join(BIN, "spark-cnn"), "etl", source, output, "--checkpoint", checkpoint,
               "--model", DIGITS_FACTORY, "--weights", demo_assets.weights, "--labels", demo_assets.labels,
               "--master", "local[2]", "--settle-seconds", str(SETTLE_S)]

    # A copy in progress during both runs: a chunk every CHUNK_EVERY_S, the rest once the rerun is over.
    photo = real_image_files()["photos/china.jpg"]
    copying = os.path.join(source, "photos", "china.jpg")
    os.makedirs(os.path.dirname(copying))
    runs_done = threading.Event()
    chunk = max(1, len(photo) // 6000)  # 6000 chunks: longer than both runs (2 x JOB_TIMEOUT_S)

    def slow_copy():
        with open(copying, "wb") as f:
            sent = 0
            while not runs_done.is_set() and sent < len(photo) - 1:
                f.write(photo[sent:min(sent + chunk, len(photo) - 1)])
                f.flush()
                sent = min(sent + chunk, len(photo) - 1)
                time.sleep(CHUNK_EVERY_S)
            runs_done.wait()
            f.write(photo[sent:])

    writer = threading.Thread(target=slow_copy)
    writer.start()
    try:
        # A run in small micro-batches killed (SIGKILL, driver and its JVM) after two of them. A killed JVM
        # cleans up nothing (Spark's local dirs, the shipped files' copies): its temporary folder is this test's.
        killed_tmp = tmp_path / "killed_run_tmp"
        killed_tmp.mkdir()
        killed = subprocess.Popen([*command, "--max-files-per-trigger", "3", "--quiet"], start_new_session=True,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                  env={**os.environ, "TMPDIR": str(killed_tmp),
                                       "JAVA_TOOL_OPTIONS": f"-Djava.io.tmpdir={killed_tmp}"})
        try:
            deadline = time.monotonic() + JOB_TIMEOUT_S
            while not os.path.exists(os.path.join(checkpoint, "done", "1")) and killed.poll() is None:
                assert time.monotonic() < deadline, "the killed run never committed two micro-batches"
                time.sleep(0.05)
        finally:
            os.killpg(killed.pid, signal.SIGKILL)
            killed.wait(timeout=30)
        assert killed.returncode == -signal.SIGKILL, "the run finished before it could be killed midway"
        deadline = time.monotonic() + 30
        while _processes_in_group(killed.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _processes_in_group(killed.pid) == [], "the killed driver left processes (its JVM) behind"
        committed = {int(n) for n in os.listdir(os.path.join(checkpoint, "done")) if n.isdigit()}
        batches = pq.read_table(output, columns=["batch"]).column("batch").to_pylist()
        done_before_rerun = sum(1 for b in batches if b in committed)  # a batch written but not committed is redone
        assert 0 < done_before_rerun < len(expected), "the kill was not midway through the files"

        # New arrivals, and an archive of images from 2001 unpacked with their modification times (`tar x`, as
        # `cp -p` or `rsync -a`): far older than everything the killed run committed.
        arrivals = _add_digits(demo_assets, source, 2, 3)
        write_files(source, {"late/empty.jpg": b""})
        arrivals.append(os.path.join(source, "late/empty.jpg"))
        _settle(arrivals)
        old = str(tmp_path / "old")
        old_files = _add_digits(demo_assets, old, 5, 1)
        for path in old_files:
            os.utime(path, (datetime(2001, 1, 1, tzinfo=timezone.utc).timestamp(),) * 2)
        with tarfile.open(tmp_path / "old.tar", "w") as archive:
            archive.add(old, arcname="unpacked")
        assert subprocess.run(["tar", "-xf", str(tmp_path / "old.tar"), "-C", source]).returncode == 0
        unpacked = [os.path.join(source, "unpacked", os.path.relpath(p, old)) for p in old_files]
        assert os.path.getmtime(unpacked[0]) < time.time() - 86400 * 365
        expected += [*arrivals, *unpacked]

        rerun = run_command([*command, "--summary", str(tmp_path / "rerun.json")])
    finally:
        runs_done.set()
        writer.join()
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert f"new images  {len(expected) - done_before_rerun}" in rerun.stdout, rerun.stdout
    assert "checkpoint  file://" in rerun.stdout
    summary = json.loads((tmp_path / "rerun.json").read_text())
    # only what the killed run had not committed; the copy, changing all along, waits
    assert (summary["images"], summary["waiting"]) == (len(expected) - done_before_rerun, 1)
    rows = _rows_per_path(output)
    assert sorted(rows) == sorted(expected)  # the copy in progress is not among them
    assert set(rows.values()) == {1}, {p: n for p, n in rows.items() if n != 1}
    errors = {row["path"].removeprefix("file:"): row["error"] for row in
              pq.read_table(output, columns=["path", "error"]).to_pylist()}
    assert all(errors[p] is None for p in unpacked)

    assert sidecars_left_since(sidecars_before) == set(), "a sidecar outlived its run"
