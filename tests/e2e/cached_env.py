"""Separate, pinned Python environments for tests that need other versions than the project's venv, built once
and cached.

An environment lives in `~/.cache/spark_cnn/<folder>/<key>/` (or under the directory its `cache_root_env`
variable names), where the key is a hash of the pinned requirements, the Python version and any host paths it
borrows, so changing a pin builds a fresh one. Concurrent test runs serialise on a file lock beside it; a build
that died half-way (no `.complete` stamp) is removed and redone. A build that fails raises with pip's output.

`host_paths` lets an environment borrow packages from the venv running the tests without installing them again:
they are listed in a `.pth` file, which Python appends to `sys.path` after the environment's own site-packages,
so every package the environment pins wins and the rest (torch, Pillow, pytest) come from the host.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_CACHE_PARENT = os.path.join(os.path.expanduser("~"), ".cache", "spark_cnn")
# pip downloads a few hundred MB of wheels (pyspark alone is ~300 MB); measured ~45 s here, allow for slow mirrors.
BUILD_TIMEOUT_S = 1200
STAMP = ".complete"
# Named to sort after anything pip installs, so the host's paths come last even among .pth files.
HOST_PATHS_FILE = "zz-spark-cnn-host-packages.pth"


class EnvBuildError(RuntimeError):
    """A pinned test environment could not be built."""


@dataclass(frozen=True)
class PinnedEnv:
    """A test environment: what it is for, where it is cached, what it pins and what must import in it."""

    name: str  # in messages: "the <name> test environment"
    folder: str  # the cache folder under ~/.cache/spark_cnn/
    cache_root_env: str  # a variable that, when set, names the cache folder instead
    requirements: tuple[str, ...]
    check: str  # Python code the built environment must run (imports, version asserts)
    host_paths: tuple[str, ...] = ()  # site directories of the host venv appended after the env's own

    def cache_root(self) -> str:
        return os.environ.get(self.cache_root_env) or os.path.join(DEFAULT_CACHE_PARENT, self.folder)

    def key(self) -> str:
        lines = [f"python {sys.version_info.major}.{sys.version_info.minor}", *self.requirements,
                 *(f"host {path}" for path in self.host_paths)]
        return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]

    def directory(self) -> str:
        return os.path.join(self.cache_root(), self.key())


def cached_python(env: PinnedEnv) -> str:
    """The interpreter of `env`, building the environment first if needed."""
    root = env.cache_root()
    os.makedirs(root, exist_ok=True)
    env_dir = env.directory()
    with open(env_dir + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; the others wait, then find it built
        if not os.path.exists(os.path.join(env_dir, STAMP)):
            shutil.rmtree(env_dir, ignore_errors=True)  # a build that died half-way
            _build(env, env_dir)
    return os.path.join(env_dir, "bin", "python")


def _build(env: PinnedEnv, env_dir: str) -> None:
    python = os.path.join(env_dir, "bin", "python")
    _step(env, env_dir, [_base_python(), "-m", "venv", env_dir])
    _step(env, env_dir, [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                         *env.requirements])
    if env.host_paths:
        site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        with open(os.path.join(site, HOST_PATHS_FILE), "w") as f:
            f.write("".join(path + "\n" for path in env.host_paths))
    _step(env, env_dir, [python, "-c", env.check])
    with open(os.path.join(env_dir, STAMP), "w") as f:
        f.write("\n".join(env.requirements) + "\n")


def _step(env: PinnedEnv, env_dir: str, command: list[str]) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        shutil.rmtree(env_dir, ignore_errors=True)
        raise EnvBuildError(f"building the {env.name} test environment timed out after {e.timeout} s: "
                            f"{' '.join(command)}") from e
    if done.returncode != 0:
        shutil.rmtree(env_dir, ignore_errors=True)
        raise EnvBuildError(f"cannot build the {env.name} test environment in {env_dir}: `{' '.join(command)}` "
                            f"exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")


def _base_python() -> str:
    """The interpreter this venv was made from (a venv of a venv would inherit nothing, but is slower to find)."""
    return getattr(sys, "_base_executable", None) or sys.executable


def python_or_fail(build: Callable[[], str]) -> str:
    """`build()`'s interpreter, or the calling test fails with the build's message alone (no traceback)."""
    import pytest

    try:
        return build()
    except EnvBuildError as e:
        pytest.fail(str(e), pytrace=False)
