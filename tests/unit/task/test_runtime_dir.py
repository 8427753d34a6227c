"""Which runtime directory tasks use when the default one was taken by someone else, and the sweep of the
files dead sidecars leave there (task/rundir.py)."""

from __future__ import annotations

import fcntl
import logging
import os
import stat
import tempfile
import time

import pytest

from spark_cnn.errors import SidecarError
from spark_cnn.task import launcher
from spark_cnn.task.launcher import LaunchOptions, ensure_sidecar, sidecar_name
from spark_cnn.task.procs import ExecutorProcess, process_id
from spark_cnn.task.rundir import (
    FALLBACK_DIRS,
    RUNTIME_DIR_ENV,
    STALE_AFTER_S,
    XDG_RUNTIME_DIR_ENV,
    runtime_dir,
    sweep_runtime_dir,
)

NOW = 1_700_000_000.0  # the sweep's injected clock
OLD = NOW - STALE_AFTER_S - 60
RECENT = NOW - STALE_AFTER_S + 3600


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    """The system's temporary folder is `tmp_path`; no runtime directory is configured, none from XDG."""
    monkeypatch.delenv(RUNTIME_DIR_ENV, raising=False)
    monkeypatch.delenv(XDG_RUNTIME_DIR_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _take(path, how: str) -> None:
    """Make `path` first, as another user could in a shared /tmp."""
    if how == "another user's":
        path.mkdir(mode=0o700)
        os.chown(path, 12345, 12345)
    elif how == "a symlink":
        elsewhere = path.parent / f"elsewhere-{path.name}"
        elsewhere.mkdir(mode=0o700)
        path.symlink_to(elsewhere)
    else:  # open to others, as `mkdir -m 1777` would leave it
        path.mkdir()
        os.chmod(path, 0o1777)


@pytest.mark.parametrize("how", ["another user's", "a symlink", "open to others"])
def test_a_default_runtime_dir_taken_by_someone_else_is_passed_over_for_a_private_one(temp_root, caplog, how):
    if how == "another user's" and os.getuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    taken = temp_root / f"spark_cnn-{os.getuid()}"
    _take(taken, how)
    before = os.lstat(taken)
    with caplog.at_level(logging.WARNING, logger="spark_cnn.launcher"):
        chosen = runtime_dir()
        assert runtime_dir() == chosen, "every task of an executor must find the same directory"

    assert chosen == f"{taken}-1"
    info = os.lstat(chosen)
    assert stat.S_ISDIR(info.st_mode) and stat.S_IMODE(info.st_mode) == 0o700 and info.st_uid == os.getuid()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and f"sidecar directory {taken} " in warnings[0], warnings
    assert warnings[0].endswith(f"using {chosen} instead")
    after = os.lstat(taken)
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid), "the taken directory was changed"
    assert os.listdir(taken) == [], "something was created in the taken directory"


def test_a_private_xdg_runtime_dir_is_the_first_fallback(temp_root, monkeypatch):
    _take(temp_root / f"spark_cnn-{os.getuid()}", "a symlink")
    xdg = temp_root / "xdg"
    xdg.mkdir(mode=0o700)
    monkeypatch.setenv(XDG_RUNTIME_DIR_ENV, str(xdg))
    assert runtime_dir() == str(xdg / "spark_cnn")
    assert stat.S_IMODE(os.lstat(xdg / "spark_cnn").st_mode) == 0o700
    os.chmod(xdg, 0o755)  # not a private session directory: not used
    assert runtime_dir() == str(temp_root / f"spark_cnn-{os.getuid()}-1")


def test_taken_fallbacks_are_skipped_and_all_taken_is_an_error_saying_what_to_set(temp_root):
    default = temp_root / f"spark_cnn-{os.getuid()}"
    _take(default, "a symlink")
    _take(temp_root / f"{default.name}-1", "open to others")
    assert runtime_dir() == f"{default}-2"
    os.rmdir(f"{default}-2")
    for n in range(2, FALLBACK_DIRS + 1):
        _take(temp_root / f"{default.name}-{n}", "a symlink")
    with pytest.raises(SidecarError, match=rf"no private sidecar directory: sidecar directory {default} is a "
                                           rf"symbolic link.*set {RUNTIME_DIR_ENV} to a private directory"):
        runtime_dir()


def test_a_configured_runtime_dir_that_is_not_private_is_refused_not_replaced(temp_root, monkeypatch):
    configured = temp_root / "configured"
    _take(configured, "open to others")
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(configured))
    with pytest.raises(SidecarError, match="is open to other users"):
        runtime_dir()
    assert sorted(os.listdir(temp_root)) == ["configured"], "a fallback was made for a configured directory"


def _leave(folder, key: str, suffixes: tuple[str, ...], mtime: float) -> None:
    for suffix in suffixes:
        path = folder / f"{key}{suffix}"
        path.write_text("x")
        os.utime(path, (mtime, mtime))


def test_the_sweep_removes_old_files_of_gone_sidecars_and_nothing_else(tmp_path):
    folder = tmp_path / "rt"
    folder.mkdir(mode=0o700)
    gone, idle, log_only, recent, live, starting = (f"sc-{n:016x}" for n in range(6))
    _leave(folder, gone, (".sock", ".json", ".lock", ".log", ".json.4321.tmp"), OLD)  # killed
    _leave(folder, idle, (".lock", ".log"), OLD)  # exited idle: keeps its lock and log
    _leave(folder, log_only, (".log",), OLD)
    _leave(folder, recent, (".log",), OLD)
    _leave(folder, recent, (".lock",), RECENT)
    _leave(folder, live, (".sock", ".json", ".lock", ".log"), OLD)  # serving, with nothing new to log
    _leave(folder, starting, (".lock", ".log"), OLD)
    for other in ("notes.txt", "sc-xyz.log", f"{gone}.log.1"):  # not a sidecar's file: not ours to judge
        _leave(folder, other, ("",), OLD)
    holder = os.open(folder / f"{starting}.lock", os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)  # a task is starting that sidecar
    try:
        removed = sweep_runtime_dir(str(folder), lambda base: base == str(folder / live), now=NOW)
    finally:
        os.close(holder)

    assert sorted(removed) == sorted([f"{gone}.sock", f"{gone}.json", f"{gone}.lock", f"{gone}.log",
                                      f"{gone}.json.4321.tmp", f"{idle}.lock", f"{idle}.log", f"{log_only}.log"])
    assert sorted(os.listdir(folder)) == sorted([f"{recent}.log", f"{recent}.lock", f"{live}.sock", f"{live}.json",
                                                 f"{live}.lock", f"{live}.log", f"{starting}.lock",
                                                 f"{starting}.log", "notes.txt", "sc-xyz.log", f"{gone}.log.1"])


def test_a_start_lock_removed_by_its_holder_is_not_held_beside_a_new_one(tmp_path, monkeypatch):
    path = tmp_path / "sc.lock"
    holder = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(holder, fcntl.LOCK_EX)
    real_flock = fcntl.flock
    swept = []

    def flock_after_a_sweep(fd, operation):
        if not swept:  # the holder (a sweep) removes the file this task has open, and lets it go
            swept.append(os.fstat(fd).st_ino)
            os.unlink(path)
            os.close(holder)
        return real_flock(fd, operation)

    monkeypatch.setattr(launcher.fcntl, "flock", flock_after_a_sweep)
    with launcher._file_lock(str(path), 5.0) as fd:
        held = os.fstat(fd)
        assert path.exists(), "the lock held is a removed file: a task opening the path now locks another"
        assert (held.st_dev, held.st_ino) == (os.stat(path).st_dev, os.stat(path).st_ino)


def test_starting_a_sidecar_sweeps_the_leftovers_of_gone_ones(tmp_path, monkeypatch):
    folder = tmp_path / "rt"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(folder))
    _leave(folder, f"sc-{0:016x}", (".lock", ".log"), time.time() - STALE_AFTER_S - 60)
    started = []
    monkeypatch.setattr(launcher, "_start", lambda base, *args: started.append(base))
    executor = ExecutorProcess(process_id(os.getpid()), "driver")
    options = LaunchOptions(app_id="sweep", device="cpu")

    ensure_sidecar(options, executor)

    assert started == [str(folder / sidecar_name(options.app_id, executor, options.device))]
    assert sorted(os.listdir(folder)) == [f"{sidecar_name(options.app_id, executor, options.device)}.lock"]
