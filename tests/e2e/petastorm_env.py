"""A separate, pinned Python environment with the real petastorm 0.13.1, built once and cached.

petastorm imports `pyarrow.filesystem` (removed in pyarrow 15) and runs only with pyspark 3.x, so it cannot be
installed beside spark_cnn (pyspark 4). The compatibility tests run it in its own venv:
`~/.cache/spark_cnn/petastorm-env/<key>/`, where the key is a hash of the pinned requirements and the Python
version, so changing a pin builds a fresh one. Concurrent test runs serialise on a file lock; a build that
died half-way (no `.complete` stamp) is removed and redone. A build that fails raises with pip's output.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys

# What petastorm 0.13.1 was released against; setuptools < 70 still ships pkg_resources, which it imports.
# opencv is what its CompressedImageCodec decodes with.
PINNED_REQUIREMENTS = (
    "petastorm==0.13.1",
    "pyspark==3.5.*",
    "pyarrow==14.0.2",
    "numpy==1.26.*",
    "pandas==2.2.*",
    "setuptools<70",
    "opencv-python-headless==4.10.0.84",
)
CACHE_ROOT_ENV = "SPARK_CNN_PETASTORM_ENV_DIR"
DEFAULT_CACHE_ROOT = os.path.join(os.path.expanduser("~"), ".cache", "spark_cnn", "petastorm-env")
# pip downloads ~400 MB of wheels (pyspark alone is ~300 MB); measured ~45 s here, allow for slow mirrors.
BUILD_TIMEOUT_S = 1200
STAMP = ".complete"


class PetastormEnvError(RuntimeError):
    """The pinned petastorm environment could not be built."""


def env_key() -> str:
    text = "\n".join([f"python {sys.version_info.major}.{sys.version_info.minor}", *PINNED_REQUIREMENTS])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def petastorm_python() -> str:
    """The interpreter of the pinned petastorm environment, building it first if needed."""
    root = os.environ.get(CACHE_ROOT_ENV, DEFAULT_CACHE_ROOT)
    os.makedirs(root, exist_ok=True)
    env_dir = os.path.join(root, env_key())
    python = os.path.join(env_dir, "bin", "python")
    with open(env_dir + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one builder at a time; the others wait, then find it built
        if not os.path.exists(os.path.join(env_dir, STAMP)):
            shutil.rmtree(env_dir, ignore_errors=True)  # a build that died half-way
            _build(env_dir)
    return python


def _build(env_dir: str) -> None:
    base = _base_python()
    steps = [[base, "-m", "venv", env_dir],
             [os.path.join(env_dir, "bin", "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              *PINNED_REQUIREMENTS],
             [os.path.join(env_dir, "bin", "python"), "-c", "import petastorm.reader, cv2, pyspark"]]
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            shutil.rmtree(env_dir, ignore_errors=True)
            raise PetastormEnvError(f"building the petastorm test environment timed out after {e.timeout} s: "
                                    f"{' '.join(step)}") from e
        if done.returncode != 0:
            shutil.rmtree(env_dir, ignore_errors=True)
            raise PetastormEnvError(f"cannot build the petastorm test environment in {env_dir}: `{' '.join(step)}` "
                                    f"exited {done.returncode}:\n{(done.stdout + done.stderr)[-3000:]}")
    with open(os.path.join(env_dir, STAMP), "w") as f:
        f.write("\n".join(PINNED_REQUIREMENTS) + "\n")


def _base_python() -> str:
    """The interpreter this venv was made from (a venv of a venv would inherit nothing, but is slower to find)."""
    return getattr(sys, "_base_executable", None) or sys.executable
