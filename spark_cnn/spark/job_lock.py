"""One job at a time per OUTPUT and per ETL checkpoint: a scheduler's retry started while the first driver still
runs would otherwise recover (delete) the first one's publish midway, or take the same micro-batches.

The lock is an `flock` on a file in the user's runtime directory, named by a hash of the normalised location
(`locations.location`: every spelling of one place, s3a:// or s3://, a symlink, gives one lock), held from before
the path checks to after the publish. The kernel drops it when the process dies, so a killed driver never leaves
a stale lock. Its reach is one host and one user: two drivers on different hosts writing one object-store or HDFS
location are not stopped (pyarrow.fs offers no create-if-absent on S3 or GCS, so a lock object there would be
check-then-write, and a dead driver's object would need a staleness rule that can also take a live job's lock).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import socket
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from spark_cnn.errors import InputError
from spark_cnn.spark.locations import location
from spark_cnn.task.launcher import runtime_dir

LOCK_DIR = "job-locks"  # inside the runtime directory


def lock_path(uri: str) -> str:
    """The lock file of the place `uri` names, the same for every spelling of it."""
    filesystem, path = location(uri)
    digest = hashlib.sha256(f"{filesystem}{path}".encode()).hexdigest()[:32]
    return os.path.join(runtime_dir(), LOCK_DIR, digest + ".lock")


@contextmanager
def job_lock(uri: str, *, what: str = "output") -> Iterator[None]:
    """Hold the lock of `uri` for the block; raise InputError at once (one line) when another job holds it."""
    path = lock_path(uri)
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode("utf-8", "replace").strip() or "another process"
            raise InputError(f"{what} {uri} is being written by another job ({holder}, lock {path}): wait for it "
                             "to finish, or stop it if it is an earlier attempt of this job") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock


@contextmanager
def job_locks(outputs: tuple[str, ...] = (), checkpoints: tuple[str, ...] = ()) -> Iterator[None]:
    """Hold the locks of every output and checkpoint for the block."""
    with ExitStack() as held:
        for uri in outputs:
            held.enter_context(job_lock(uri))
        for uri in checkpoints:
            held.enter_context(job_lock(uri, what="checkpoint"))
        yield
