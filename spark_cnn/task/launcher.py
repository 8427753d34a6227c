"""Find or start this executor's sidecar. Runs inside Spark tasks: no torch here.

All sidecar files live in one runtime directory owned by the user, mode 0700 (task/rundir.py says which, and
sweeps out what dead sidecars left there): `<name>.sock` (the socket),
`<name>.json` (pid, device, token; 0600), `<name>.lock` (decides which task starts it) and `<name>.log`.
`<name>` is derived from (application, executor JVM, device), so the tasks of one executor share a sidecar and
different executors, applications and devices never do.

Nothing in that directory is trusted unless it is private: the directory must be a real directory (not a
symlink) of this user's with no group or other bits, and an info file a regular file of this user's naming the
socket beside it. An existing directory open to others is never used nor fixed: while it was open another user
could have placed files in it (a symlink named like a log or lock), which closing it would not remove. A
configured one is refused; the default one is passed over for a private fallback (rundir.py).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import time
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from spark_cnn.errors import SidecarError, SidecarLost
from spark_cnn.task import procs
from spark_cnn.task.procs import ExecutorProcess, ProcessId, cmdline, find_executor_jvm, is_alive
from spark_cnn.task.rundir import RUNTIME_DIR_ENV as RUNTIME_DIR_ENV  # re-exported: the launcher's contract
from spark_cnn.task.rundir import check_private_dir as check_private_dir
from spark_cnn.task.rundir import runtime_dir, sweep_runtime_dir
from spark_cnn.task.sidecar_env import sidecar_environment

log = logging.getLogger("spark_cnn.launcher")

# Importing torch and loading a large model on a busy host can take a minute; beyond three something is wrong.
START_TIMEOUT_S = 180.0
POLL_INTERVAL_S = 0.05
# A sidecar with no client for this long exits: long enough to stay warm between the jobs of a notebook
# session, short enough not to hold a device for long after an application ends without killing its executors.
DEFAULT_IDLE_TIMEOUT_S = 300.0


class SidecarKilledStarting(SidecarLost):
    """The sidecar was killed by a signal before it published its info file (the OOM killer, while it imports
    torch): not the sidecar's verdict on its options, so starting it again may work (task/failover.py)."""


@dataclass(frozen=True)
class SidecarInfo:
    """What a running sidecar published about itself in its info file."""

    pid: int
    socket: str
    token: str
    device: str
    host: str
    app_id: str
    executor: str

    @classmethod
    def read(cls, path: str) -> SidecarInfo | None:
        """The info file at `path` (`<name>.json`); None when there is none (yet) or it is incomplete. Raises
        SidecarError for a file no sidecar of this user's wrote: a symlink, not a regular file, another owner's,
        or one naming a socket other than `<name>.sock` beside it."""
        data = _read_private_file(path)
        if data is None:
            return None
        try:
            fields = json.loads(data)
            info = cls(**{k: fields[k] for k in cls.__dataclass_fields__})
        except (ValueError, KeyError, TypeError):
            return None
        expected = os.path.splitext(path)[0] + ".sock"
        if info.socket != expected:
            raise SidecarError(f"sidecar info file {path} names socket {info.socket!r}, not {expected}: no sidecar "
                               f"of this user's wrote it; remove it: rm {path}")
        return info


@dataclass(frozen=True)
class LaunchOptions:
    app_id: str
    device: str = "auto"
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    threads: int | None = None  # torch CPU threads in the sidecar; None: torch's default


def _read_private_file(path: str) -> bytes | None:
    """The bytes of `path` if it is a regular file owned by this user; None if there is none. Anything else
    raises SidecarError: it was not written by a sidecar of this user's."""
    fix = f"no sidecar of this user's wrote it; remove it: rm {path}"
    try:
        # O_NOFOLLOW: a symlink fails (ELOOP) instead of being read; O_NONBLOCK: a FIFO cannot block the open.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        what = "is a symbolic link" if e.errno == errno.ELOOP else f"cannot be opened ({e.strerror})"
        raise SidecarError(f"sidecar info file {path} {what}; {fix}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SidecarError(f"sidecar info file {path} is not a regular file; {fix}")
        if st.st_uid != os.getuid():
            raise SidecarError(f"sidecar info file {path} belongs to uid {st.st_uid}, not to this user; {fix}")
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def sidecar_name(app_id: str, executor: ExecutorProcess, device: str) -> str:
    key = f"{app_id}|{executor.process.pid}|{executor.process.start_time}|{device}"
    return "sc-" + hashlib.sha1(key.encode()).hexdigest()[:16]  # short: Unix socket paths max ~107 bytes


def _live(info: SidecarInfo | None) -> bool:
    """A sidecar that published `info` still runs. A dead one's files may remain (SIGKILL, a crash): its pid
    may since belong to another process, so the pid must still run a sidecar serving that very socket."""
    return (info is not None and is_alive(ProcessId(info.pid, 0)) and os.path.exists(info.socket)
            and _serves(info.pid, info.socket))


def _serves(pid: int, socket_path: str) -> bool:
    if not os.path.exists("/proc"):  # not Linux: no command lines to check; the pid check is all there is
        return True
    args = procs.cmdline(pid)
    return "spark_cnn.sidecar" in args and "--socket" in args[:-1] and args[args.index("--socket") + 1] == socket_path


def retire_sidecar(process: ProcessId, socket_path: str, reason: str, timeout_s: float = 10.0) -> bool:
    """SIGKILL a sidecar that stopped answering (SIGKILL ends a stopped process too) and wait until it is gone,
    so the next `ensure_sidecar` starts a new one. A line naming the reason goes to its log. Returns whether
    this call stopped it (False when that process is gone already, or its pid now runs something else)."""
    if not is_alive(process) or not _serves(process.pid, socket_path):
        return False
    base, _ = os.path.splitext(socket_path)
    try:
        with open(base + ".log", "a") as log_file:
            log_file.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} retired by task process {os.getpid()}: "
                           f"{reason}\n")
    except OSError:
        pass  # the log is for the post-mortem; stopping the sidecar matters more
    try:
        os.kill(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while is_alive(process) and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
    return True


def ensure_sidecar(options: LaunchOptions, executor: ExecutorProcess | None = None) -> SidecarInfo:
    """The running sidecar of this task's executor, started first if needed (one starter, chosen by a lock).

    The lock covers the whole start: the sidecar inherits it and lets it go only once its info file is out,
    so a task killed while its sidecar starts leaves the lock held by that child, and the next task waits for
    it and uses it instead of starting a second one beside it."""
    executor = executor or find_executor_jvm()
    directory = runtime_dir()
    base = os.path.join(directory, sidecar_name(options.app_id, executor, options.device))
    info = SidecarInfo.read(base + ".json")
    if _live(info):
        return info
    with _file_lock(base + ".lock", START_TIMEOUT_S) as lock_fd:
        info = SidecarInfo.read(base + ".json")  # another task may have started it while we waited
        if _live(info):
            return info
        _sweep(directory)  # once per sidecar start, not per task: the leftovers of sidecars long gone
        return _start(base, options, executor, lock_fd)


def _sweep(directory: str) -> None:
    try:
        removed = sweep_runtime_dir(directory, _live_under)
    except OSError as e:  # upkeep: never the reason a task fails
        log.warning("could not sweep old sidecar files from %s: %s", directory, e)
        return
    if removed:
        log.info("removed %d files of sidecars gone for a week from %s", len(removed), directory)


def _live_under(base: str) -> bool:
    """A sidecar serves under `base` (its name in the runtime directory), by its info file."""
    try:
        return _live(SidecarInfo.read(base + ".json"))
    except SidecarError:  # a file no sidecar wrote: it serves nothing
        return False


@contextmanager
def _file_lock(path: str, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise SidecarError(f"waited {timeout_s:.0f} s for the sidecar start lock {path}") from None
                    time.sleep(POLL_INTERVAL_S)
            if _same_file(fd, path):
                yield fd
                return
        finally:
            os.close(fd)  # closing releases the lock (once a sidecar that inherited it has closed its copy too)
        # The holder removed the lock file (a sweep, a sidecar's final exit): a task that opens the path now gets
        # a new file and would hold "the" lock beside us. Lock what the path names now.


def _same_file(fd: int, path: str) -> bool:
    try:
        held, named = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _start(base: str, options: LaunchOptions, executor: ExecutorProcess, lock_fd: int) -> SidecarInfo:
    for stale in (base + ".json", base + ".sock"):
        if os.path.exists(stale):
            os.unlink(stale)
    cmd = [sys.executable, "-m", "spark_cnn.sidecar", "--socket", base + ".sock", "--info", base + ".json",
           "--device", options.device, "--idle-timeout", str(options.idle_timeout_s),
           "--watch-pid", str(executor.process.pid), "--watch-start-time", str(executor.process.start_time),
           "--app-id", options.app_id, "--executor-id", executor.executor_id, "--lock-fd", str(lock_fd)]
    if options.threads:
        cmd += ["--threads", str(options.threads)]
    with open(base + ".log", "ab") as log_file:
        # A new session: the sidecar outlives the Python worker that started it, and signals to the worker's
        # process group do not reach it. It ends with its executor (watched pid) or when idle.
        # malloc settings that keep freed memory: no fresh pages per batch (spark_cnn.task.sidecar_env).
        # It inherits the start lock (the same open file, so the same flock) and closes it once it has
        # published its info file: the lock stays held if this task dies first.
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                                start_new_session=True, close_fds=True, pass_fds=(lock_fd,),
                                env=sidecar_environment())
    threading.Thread(target=proc.wait, name="sidecar-reaper", daemon=True).start()  # no zombie if it exits first
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        info = SidecarInfo.read(base + ".json")
        if info is not None and info.pid == proc.pid:
            return info
        if proc.poll() is not None:
            if proc.returncode < 0:
                raise SidecarKilledStarting(f"the sidecar was killed by signal {-proc.returncode} while starting "
                                            f"(out of memory?); its log {base}.log ends with: {_tail(base + '.log')}")
            raise SidecarError(f"the sidecar exited with code {proc.returncode} while starting; "
                               f"its log {base}.log ends with: {_tail(base + '.log')}")
        time.sleep(POLL_INTERVAL_S)
    proc.kill()
    raise SidecarError(f"the sidecar did not start within {START_TIMEOUT_S:.0f} s; see {base}.log")


def _tail(path: str, lines: int = 5) -> str:
    try:
        with open(path, errors="replace") as f:
            return " | ".join(line.strip() for line in f.readlines()[-lines:])
    except OSError:
        return "(no log)"


def find_sidecars(app_id: str | None = None) -> list[SidecarInfo]:
    """Sidecars on this host (of one application, if given) whose process is still alive."""
    found = []
    directory = runtime_dir()
    for name in sorted(os.listdir(directory)):
        if name.endswith(".json"):
            info = _read_listed_info(os.path.join(directory, name))
            if _live(info) and (app_id is None or info.app_id == app_id):
                found.append(info)
    return found


def _read_listed_info(path: str) -> SidecarInfo | None:
    """SidecarInfo.read for a listing: an untrusted file is skipped with a warning, so that one planted file
    cannot keep the listing (and stopping an application's sidecars) from working."""
    try:
        return SidecarInfo.read(path)
    except SidecarError as e:
        log.warning("skipped: %s", e)
        return None


def stop_sidecars(app_id: str, timeout_s: float = 10.0) -> int:
    """SIGTERM this host's sidecars of `app_id` and wait until every sidecar process of it is gone, including one
    already on its way out (its executor ended: its files are gone, its interpreter still tears down) or still
    starting (no info file yet). Returns how many serving sidecars it stopped."""
    serving = {info.pid for info in find_sidecars(app_id)}  # each checked to run a sidecar (no reused pid)
    targets, stopped = serving | set(sidecar_processes(app_id)), 0
    for pid in targets:
        with suppress(ProcessLookupError):  # it exited since it was listed
            os.kill(pid, signal.SIGTERM)
            stopped += pid in serving
    deadline = time.monotonic() + timeout_s
    while targets and time.monotonic() < deadline:
        targets = {pid for pid in targets if is_alive(ProcessId(pid, 0))}
        time.sleep(POLL_INTERVAL_S)
    for pid in targets:
        with suppress(ProcessLookupError):  # it exited since it was listed
            os.kill(pid, signal.SIGKILL)
    return stopped


def sidecar_processes(app_id: str) -> list[int]:
    """Pids of this host's `python -m spark_cnn.sidecar` processes of `app_id` whose socket lies in this runtime
    directory, found by their command lines: a sidecar whose files are gone or not yet written counts too.
    Without /proc (not Linux), the sidecars that info files list."""
    if not os.path.isdir("/proc"):
        return [info.pid for info in find_sidecars(app_id)]
    directory, found = runtime_dir(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        args = cmdline(int(entry))
        if (args[1:3] == ["-m", "spark_cnn.sidecar"] and _argument(args, "--app-id") == app_id
                and os.path.dirname(_argument(args, "--socket") or "") == directory
                and is_alive(ProcessId(int(entry), 0))):
            found.append(int(entry))
    return found


def _argument(args: list[str], flag: str) -> str | None:
    return args[args.index(flag) + 1] if flag in args[:-1] else None

