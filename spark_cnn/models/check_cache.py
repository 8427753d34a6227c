"""The driver's model check remembered on disk, so the next process that checks the same model skips the child.

Every job start checks its model in a child process that imports torch (resolve_isolated.py): about 3 s here,
paid again by every CLI run and every scheduled ETL run. The check's answer depends on the model's files, the
code that builds it and the libraries that run it, so an entry is keyed by all of these (`entry_key`), records
the files the check read (named weights in torch's or timm's cache, the user's factory module: `dependencies`)
and is used only while each of them still has the size and modification time it had (`lookup`).

Entries live in `$SPARK_CNN_CACHE_DIR/model-checks` when that is set (the device profiles' override), else
`$XDG_CACHE_HOME/spark_cnn/model-checks` (`~/.cache/...`); `SPARK_CNN_MODEL_CHECK_CACHE=0` turns the cache off.
They are read with the same restricted unpickler as the child's reply: only this package's classes and plain
values, never another global.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import os
import pickle
import site
import sys
import sysconfig
import tempfile
import time

from spark_cnn.models.spec import ModelSpec
from spark_cnn.paths import user_cache_dir

__all__ = ["CACHE_DIR_ENV", "CACHE_ENV", "MAX_ENTRIES", "cache_dir", "dependencies", "enabled", "entry_key",
           "loaded_code_files", "lookup", "store"]

_log = logging.getLogger(__name__)

# Set to 0 (or off, false, no) to check every model in a child process, as before the cache.
CACHE_ENV = "SPARK_CNN_MODEL_CHECK_CACHE"
# The device profiles' cache folder (perf/startpoint.py CACHE_DIR_ENV): one override moves spark_cnn's
# per-machine caches, and tests point it at a private folder.
CACHE_DIR_ENV = "SPARK_CNN_CACHE_DIR"
SUBDIR = "model-checks"
_OFF = ("0", "off", "false", "no")
# An entry is a few KB (a torchvision model's 1,000 category names are most of it); 64 covers every model a
# user or a schedule rotates through while keeping the folder under a megabyte or two.
MAX_ENTRIES = 64
# Bumped when an entry's layout or meaning changes: older entries then miss.
ENTRY_VERSION = 1
# An entry larger than this is not one of ours: refused unread.
MAX_ENTRY_BYTES = 16 << 20
# A temporary file older than this was left by a writer that died: removed when pruning.
STALE_TEMP_S = 600.0
# Distributions whose version is part of the key (read from their metadata: none of them is imported).
VERSIONED = ("spark_cnn", "torch", "torchvision", "timm", "mlflow", "safetensors", "huggingface_hub")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def enabled() -> bool:
    return os.environ.get(CACHE_ENV, "").strip().lower() not in _OFF


def cache_dir() -> str:
    """Where entries live (it may not exist yet)."""
    override = os.environ.get(CACHE_DIR_ENV)
    if override:
        return os.path.join(override, SUBDIR)
    return user_cache_dir(SUBDIR)


def entry_key(spec: ModelSpec, memory_key: tuple) -> tuple:
    """The in-memory key (spec, options, model files, cache variables) and what a later process may have
    changed: the versions of Python and of the libraries the check runs, spark_cnn's own code, the installed
    packages, the import path and, where the spec depends on it, the working directory."""
    relative = any(path and not os.path.isabs(path) and os.path.exists(path) for path in (spec.source, spec.weights))
    where = os.getcwd() if relative or spec.kind == "factory" else None
    return (ENTRY_VERSION, memory_key, sys.version, sys.executable, _versions(), _package_code(), _site_dirs(),
            os.environ.get("PYTHONPATH"), where)


def _versions() -> tuple:
    found = []
    for name in VERSIONED:
        try:
            found.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            found.append((name, None))
    return tuple(found)


def _package_code() -> str:
    """A digest of every module file of spark_cnn by name, size and modification time (~1 ms for ~150 files):
    a checkout edited in place changes it without changing the package's version."""
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(_PACKAGE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if name.endswith(".py"):
                path = os.path.join(root, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                digest.update(f"{os.path.relpath(path, _PACKAGE_DIR)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _library_roots() -> list[str]:
    """The standard library's and the installed packages' folders: their code is covered by the versions and by
    `_site_dirs`, not recorded file by file."""
    paths = sysconfig.get_paths()
    roots = [paths.get(name) for name in ("stdlib", "platstdlib", "purelib", "platlib")]
    try:
        roots += site.getsitepackages() + [site.getusersitepackages()]
    except AttributeError:  # an embedded or virtualenv-patched `site`
        pass
    return sorted({os.path.realpath(root) for root in roots if root})


def _site_dirs() -> tuple:
    """Each installed-packages folder with its modification time: installing, upgrading or removing any package
    adds or removes an entry there, which changes it."""
    found = []
    for root in _library_roots():
        try:
            found.append((root, os.stat(root).st_mtime_ns))
        except OSError:
            continue
    return tuple(found)


def _within(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root + os.sep) for root in roots)


def loaded_code_files(modules: dict | None = None) -> tuple[str, ...]:
    """The files of the modules loaded (`sys.modules`) that neither the versions nor spark_cnn's digest cover:
    a user's factory module and what it imported from outside installed packages. Called in the child after
    the check, when these are the modules the check ran."""
    skip = [*_library_roots(), os.path.realpath(_PACKAGE_DIR)]
    found = set()
    for module in list((sys.modules if modules is None else modules).values()):
        path = getattr(module, "__file__", None)
        # A relative name is no file (torch's `_classes` and `_ops` are given one).
        if isinstance(path, str) and os.path.isabs(path) and os.path.isfile(path):
            path = os.path.realpath(path)
            if not _within(path, skip):
                found.add(path)
    return tuple(sorted(found))


def _stat(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _local_files(path: str | None) -> list[str]:
    """`path` if it is a file; every file under it if it is a folder (a local MLflow model); else nothing."""
    if not path or "://" in path or path.startswith(("models:/", "runs:/")):
        return []
    if os.path.isfile(path):
        return [os.path.abspath(path)]
    if os.path.isdir(path):
        return [os.path.abspath(os.path.join(root, name)) for root, _, names in os.walk(path) for name in names]
    return []


def dependencies(spec: ModelSpec, resolved, code_files: tuple[str, ...] = ()) -> tuple:
    """(path, size, mtime_ns) of each file the check read: the model and weights files, the file named weights
    resolved to (torch's or timm's cache, an MLflow download) and `code_files` (loaded_code_files)."""
    endpoint = resolved.endpoint
    paths = {p for source in (spec.source, spec.weights, endpoint.source, endpoint.weights, resolved.weights.file,
                              *endpoint.files) for p in _local_files(source)}
    paths.update(code_files)
    return tuple((path, *(_stat(path) or (None, None))) for path in sorted(paths))


def _unchanged(depends: tuple) -> bool:
    return all(size is not None and _stat(path) == (size, mtime_ns) for path, size, mtime_ns in depends)


def _entry_path(key: tuple) -> str:
    return os.path.join(cache_dir(), hashlib.sha256(repr(key).encode()).hexdigest() + ".pkl")


def lookup(key: tuple, loads):
    """The ResolvedModel stored under `key` if every file it depended on is unchanged, else None. `loads` is the
    restricted unpickler; an entry that is unreadable, corrupt, someone else's or of another key is a miss."""
    if not enabled():
        return None
    from spark_cnn.models.resolve import ResolvedModel

    path = _entry_path(key)
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if (hasattr(os, "getuid") and st.st_uid != os.getuid()) or st.st_size > MAX_ENTRY_BYTES:
                return None
            entry = loads(f.read())
    except FileNotFoundError:
        return None
    except Exception as e:  # any corrupt entry is a miss, rewritten after the check
        _log.debug("spark-cnn: ignoring the model-check cache entry %s: %s", path, e)
        return None
    if not (isinstance(entry, dict) and entry.get("version") == ENTRY_VERSION and entry.get("key") == key
            and isinstance(entry.get("resolved"), ResolvedModel) and isinstance(entry.get("depends"), tuple)):
        return None
    try:
        if not _unchanged(entry["depends"]):
            return None
    except (TypeError, ValueError):  # a malformed file list
        return None
    try:
        os.utime(path)  # recently used: pruned last
    except OSError:
        pass
    return entry["resolved"]


def store(key: tuple, resolved, depends: tuple) -> None:
    """Write the entry atomically (a temporary file renamed over it), then keep the newest MAX_ENTRIES. A folder
    that cannot be written only costs the next process its check."""
    if not enabled() or any(size is None for _, size, _ in depends):
        return
    folder = cache_dir()
    data = pickle.dumps({"version": ENTRY_VERSION, "key": key, "resolved": resolved, "depends": depends})
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd, temp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".pkl")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(temp, _entry_path(key))
        except BaseException:
            os.unlink(temp)
            raise
        _prune(folder, MAX_ENTRIES)
    except OSError as e:
        _log.debug("spark-cnn: not caching the model check in %s: %s", folder, e)


def _prune(folder: str, keep: int) -> None:
    entries, now = [], time.time()
    for item in os.scandir(folder):
        try:
            mtime = item.stat().st_mtime
        except OSError:
            continue
        if item.name.startswith(".tmp-") and now - mtime > STALE_TEMP_S:
            _remove(item.path)
        elif item.name.endswith(".pkl") and not item.name.startswith("."):
            entries.append((mtime, item.path))
    for _, path in sorted(entries, reverse=True)[keep:]:
        _remove(path)


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
