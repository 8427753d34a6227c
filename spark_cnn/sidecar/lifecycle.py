"""The sidecar process's life: the files it publishes (socket, info) and removes, the start lock it releases,
when it exits (its executor gone, idle) and how (signals, the retired exit status).

Plain functions over paths and numbers; the server's main thread calls them (server.py).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import NoReturn

from spark_cnn.task.launcher import check_private_dir
from spark_cnn.task.procs import ProcessId, is_alive

# How often the main thread checks the executor process and the idle timer, and whether PROGRESS is due.
WATCH_INTERVAL_S = 0.5
# After a sticky device error, how long the sidecar lets its writers send the ERRORs already queued before it
# exits (its clients then see the connection close and reconnect to a new sidecar).
RETIRE_GRACE_S = 2.0
# The exit status of a sidecar that retired after a sticky device error.
EXIT_RETIRED = 3


def check_directories(*paths: str) -> None:
    """Create nothing in a directory that is not private to this user (the launcher checks too; this process
    may be started by hand): SidecarError, saying what to do, before any file is made."""
    for path in set(paths):
        check_private_dir(os.path.dirname(os.path.abspath(path)))


def listen(socket_path: str) -> socket.socket:
    """A listening Unix socket at `socket_path`, 0600, polled every WATCH_INTERVAL_S."""
    if os.path.lexists(socket_path):
        os.unlink(socket_path)  # stale: the launcher holds the lock, no live sidecar owns it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket file is created 0600: only this user may connect
    try:
        listener.bind(socket_path)
    finally:
        os.umask(old_umask)
    listener.listen(128)
    listener.settimeout(WATCH_INTERVAL_S)
    return listener


def write_info(info_path: str, info: dict) -> None:
    """Publish `info` (pid, socket, token, ...) at `info_path`, 0600, whole or not at all."""
    tmp = f"{info_path}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a leftover of a crashed sidecar with this pid; never written through (a symlink)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(info, f)
    os.replace(tmp, info_path)  # readers never see a half-written file


def release_start_lock(lock_fd: int | None) -> None:
    """The info file is out: the starter's lock, held for us since the start (launcher.py), may go."""
    if lock_fd is not None:
        try:
            os.close(lock_fd)
        except OSError:
            pass


def remove_files(info_path: str, socket_path: str, final: bool) -> None:
    """Socket and info always; the start lock and the log too when no task can come back for this key
    (an idle sidecar's lock stays, so a task starting its successor never races a vanishing lock file).
    A sidecar that crashes never gets here, so its log stays for the post-mortem."""
    paths = [info_path, socket_path]
    base, ext = os.path.splitext(socket_path)
    if final and ext == ".sock":
        paths += [base + ".lock", base + ".log"]
    for path in paths:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def gone_pid(watch: ProcessId | None) -> int | None:
    """The pid of the watched process (the executor JVM) once it is gone; None while it runs or without one."""
    return watch.pid if watch is not None and not is_alive(watch) else None


def exit_reason(gone: int | None, connections: int, idle_for_s: float,
                idle_timeout_s: float) -> tuple[str | None, bool]:
    """(why to exit now or None, whether the exit is final for this sidecar's key): the executor's end is final
    (no task can ask for this sidecar again); idling out is not (its executor's tasks may start another)."""
    if gone is not None:
        return f"executor process {gone} is gone", True
    idle = not connections and idle_for_s > idle_timeout_s
    return (f"idle for {idle_timeout_s:.0f} s" if idle else None), False


def stop_on_signals(stop: Callable) -> None:
    """SIGTERM (the driver, the task after a sticky error) and SIGINT call `stop`: the main thread then exits."""
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)


def exit_process(retired: bool) -> NoReturn:
    """End the sidecar once it has served, its files removed: EXIT_RETIRED after a sticky device error, else 0.
    No interpreter teardown: collecting and freeing a torch process's objects took 0.5-0.8 s after the files were
    gone (py-spy: the final garbage collection), a process that the driver's stop_sidecars waits for at the end of
    every job; and with the device unusable, torch's own exit handlers could hang on it. Nothing is left to run:
    the connection and pipeline threads are daemons, the logs are flushed here."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_RETIRED if retired else 0)
