"""The runtime directory that holds sidecar sockets, info files, start locks and logs, and its upkeep.

Nothing in it is trusted unless it is private: a real directory (not a symlink) of this user's with no group or
other bits (`check_private_dir`). A directory set with SPARK_CNN_RUNTIME_DIR is used or refused, never replaced.
The default one, `/tmp/spark_cnn-<uid>`, can be made first by anyone who can write to /tmp; then every task
of this user would fail. So when it is not private it is passed over, never used or changed, with a warning,
for the first private one of `$XDG_RUNTIME_DIR/spark_cnn` (when that directory is this user's and private)
and `/tmp/spark_cnn-<uid>-1`, `-2`, ... (created 0700). The choice depends only on what exists, so every task of
one executor finds the same directory, and with it the same sidecar.

Sidecars that die without cleaning up (SIGKILL, a crash) leave their files, and an idle sidecar leaves its lock
and log on purpose; `sweep_runtime_dir` removes those of sidecars that are gone once every file of theirs is
older than STALE_AFTER_S.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import stat
import tempfile
import time
from collections.abc import Callable, Iterator

from spark_cnn.errors import SidecarError

log = logging.getLogger("spark_cnn.launcher")

RUNTIME_DIR_ENV = "SPARK_CNN_RUNTIME_DIR"
XDG_RUNTIME_DIR_ENV = "XDG_RUNTIME_DIR"
# Numbered fallbacks tried after the default and XDG ones: one taken directory is a stray or hostile mkdir; eight
# in a row is someone squatting the names, which setting SPARK_CNN_RUNTIME_DIR answers better than more tries.
FALLBACK_DIRS = 8
# A week: long enough to read a failed job's sidecar log after a weekend, short enough that a host running jobs
# every day keeps a few hundred small files at most.
STALE_AFTER_S = 7 * 24 * 3600.0
# The files a sidecar named `sc-<16 hex>` (launcher.sidecar_name) leaves: socket, info, lock, log, and the info
# file's temporary copy (`<name>.json.<pid>.tmp`). Other names are not ours to judge and stay.
SIDECAR_FILE = re.compile(r"^(sc-[0-9a-f]{16})\.(?:sock|json|lock|log|json\.[0-9]+\.tmp)$")

_warned: set[tuple[str, str]] = set()


def runtime_dir() -> str:
    """The user's private directory for sidecar sockets and files, created 0700 if missing (the umask can only
    narrow that); raises SidecarError, saying what to do, when the configured one, or every default, is not
    private (`check_private_dir`)."""
    configured = os.environ.get(RUNTIME_DIR_ENV)
    if configured:
        return _private_dir(os.path.abspath(configured))  # the info file names its socket by this path
    refusals = []
    for candidate in _default_candidates():
        try:
            path = _private_dir(candidate)
        except SidecarError as e:
            refusals.append(str(e))
            continue
        if refusals and (refusals[0], path) not in _warned:  # once per process: every task asks
            _warned.add((refusals[0], path))
            log.warning("%s; using %s instead", refusals[0], path)
        return path
    raise SidecarError(f"no private sidecar directory: {refusals[0]}; and {len(refusals) - 1} fallbacks are not "
                       f"private either: set {RUNTIME_DIR_ENV} to a private directory")


def _default_candidates() -> Iterator[str]:
    tmp = os.path.abspath(tempfile.gettempdir())
    default = os.path.join(tmp, f"spark_cnn-{os.getuid()}")
    yield default
    xdg = os.environ.get(XDG_RUNTIME_DIR_ENV)
    if xdg and os.path.isabs(xdg):
        try:
            check_private_dir(xdg)  # the session's own directory: only when it is this user's and private
            yield os.path.join(xdg, "spark_cnn")
        except (OSError, SidecarError):
            pass
    for n in range(1, FALLBACK_DIRS + 1):
        yield f"{default}-{n}"


def _private_dir(path: str) -> str:
    with contextlib.suppress(FileExistsError):  # whatever is there is checked next
        os.makedirs(path, mode=0o700)
    check_private_dir(path)
    return path


def check_private_dir(path: str) -> None:
    """Raise SidecarError unless `path` is a directory (not a symlink) owned by this user, with no group or
    other permission bits."""
    st = os.lstat(path)
    fix = f"remove it or set {RUNTIME_DIR_ENV} to a private directory"
    if stat.S_ISLNK(st.st_mode):
        raise SidecarError(f"sidecar directory {path} is a symbolic link; {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise SidecarError(f"sidecar directory {path} is not a directory; {fix}")
    if st.st_uid != os.getuid():
        raise SidecarError(f"sidecar directory {path} belongs to uid {st.st_uid}, not to this user; {fix}")
    if st.st_mode & 0o077:
        raise SidecarError(f"sidecar directory {path} is open to other users (mode {stat.S_IMODE(st.st_mode):04o}); "
                           f"if only you used it, make it private: chmod 700 {path}; else {fix}")


def sweep_runtime_dir(directory: str, is_live: Callable[[str], bool], *, now: float | None = None,
                      max_age_s: float = STALE_AFTER_S) -> list[str]:
    """Remove the files of sidecars that are gone from the private `directory`; returns the names removed.

    A sidecar's files (SIDECAR_FILE, grouped by name) go only when every one of them is older than `max_age_s`
    (by modification time, against `now`, default the clock), its start lock is free (no task is starting
    it), and `is_live(directory/<name>)` says no sidecar serves under that name. The lock is held while they
    go and removed last, so a task that opened it meanwhile finds it gone and opens a new one
    (launcher._file_lock)."""
    now = time.time() if now is None else now
    groups: dict[str, list[str]] = {}
    for name in os.listdir(directory):
        match = SIDECAR_FILE.match(name)
        if match:
            groups.setdefault(match[1], []).append(name)
    removed = []
    for key, names in sorted(groups.items()):
        base = os.path.join(directory, key)
        if not _all_older(directory, names, now - max_age_s):
            continue
        try:
            with _held_if_free(base + ".lock") as free:
                if not free or is_live(base) or not _all_older(directory, names, now - max_age_s):
                    continue
                for name in [n for n in names if not n.endswith(".lock")] + [key + ".lock"]:  # the lock last
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, name))
                        if name in names:  # not a lock file this sweep created to hold
                            removed.append(name)
        except OSError as e:  # a lock that is a symlink or a folder: not a sidecar's, left alone
            log.warning("left %s's files in %s: %s", key, directory, e)
    return removed


def _all_older(directory: str, names: list[str], cutoff: float) -> bool:
    try:
        return all(os.lstat(os.path.join(directory, name)).st_mtime < cutoff for name in names)
    except FileNotFoundError:  # a sidecar removed its own files meanwhile: judge it next time
        return False


@contextlib.contextmanager
def _held_if_free(lock_path: str) -> Iterator[bool]:
    """Hold the start lock at `lock_path` (created if missing, so no task starts that sidecar meanwhile) and
    yield True; yield False when someone holds it."""
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)
