"""The driver's folder of shipped model files: copies named by the hash of their bytes, kept while the process
lives (Spark serves executors from it), removed at exit, and swept by the next driver when a killed one left it.

A copy named `<sha256 prefix>-<file name>` always matches its own bytes, so a file changed in place ships as a new
name rather than as a path Spark has already added (Spark ignores a second `addFile` of one path).

A driver killed by a signal (SIGKILL, or SIGTERM with Python's default handler) runs no `atexit`, and its folder,
megabytes of model weights, would stay in the temporary directory for good. So each folder holds an owner lock
(`flock` on `.owner`) for as long as its process lives; the kernel drops it when the process dies, however it
dies, and the next driver to make a folder removes those it can lock. A folder is renamed into place with its
lock already held, so no sweep can see a live folder unlocked.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import os
import shutil
import stat
import tempfile
import threading
import uuid

from spark_cnn.models.spec import file_sha256

FOLDER_PREFIX = "spark_cnn_ship_"
OWNER_FILE = ".owner"
HASH_CHARS = 16  # of the SHA-256 in a shipped name: 64 bits, no collision among one session's files

_folder: str | None = None
_owner_fd: int | None = None  # held open (and locked) for the life of the process
_lock = threading.Lock()


def ship_folder() -> str:
    """This process's folder of shipped copies, made on first use (sweeping abandoned ones first)."""
    global _folder, _owner_fd
    with _lock:
        if _folder is None:
            parent = tempfile.gettempdir()
            remove_abandoned_folders(parent)
            _folder, _owner_fd = _locked_folder(parent)
            atexit.register(shutil.rmtree, _folder, True)
        return _folder


def _locked_folder(parent: str) -> tuple[str, int]:
    """A new folder under `parent` whose owner lock this process holds, renamed to its public name only then."""
    staging = tempfile.mkdtemp(prefix=f".{FOLDER_PREFIX}", dir=parent)
    fd = os.open(os.path.join(staging, OWNER_FILE), os.O_CREAT | os.O_WRONLY, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a file no one else has seen: never contended
    folder = os.path.join(parent, os.path.basename(staging)[1:])
    os.rename(staging, folder)
    return folder, fd


def remove_abandoned_folders(parent: str) -> list[str]:
    """Remove this user's ship folders under `parent` whose owner lock is free (their process is gone); returns
    them. A folder without an owner file (an older version's) is left alone: nothing says its process died."""
    removed = []
    for name in os.listdir(parent):
        folder = os.path.join(parent, name)
        if not name.startswith(FOLDER_PREFIX) or not _owned_directory(folder):
            continue
        try:
            fd = os.open(os.path.join(folder, OWNER_FILE), os.O_WRONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # its driver is alive
        finally:
            os.close(fd)  # a lock taken is dropped with the descriptor; the folder goes either way below
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _owned_directory(path: str) -> bool:
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid()  # lstat: a link is never followed


def content_addressed_copy(path: str) -> str:
    """A private copy of `path` named `<sha256 prefix>-<file name>`; its name always matches its own bytes."""
    folder, name = ship_folder(), os.path.basename(path)
    known = os.path.join(folder, f"{file_sha256(path)[:HASH_CHARS]}-{name}")
    if os.path.exists(known):  # copied for an earlier job: the same bytes
        return known
    partial = os.path.join(folder, f".{uuid.uuid4().hex}.part")
    digest = hashlib.sha256()
    # Hashed again while copying: the file may change between the two reads, and the name must be the copy's.
    with open(path, "rb") as source, open(partial, "wb") as target:
        while block := source.read(1 << 20):
            digest.update(block)
            target.write(block)
    copy = os.path.join(folder, f"{digest.hexdigest()[:HASH_CHARS]}-{name}")
    os.replace(partial, copy)
    return copy
