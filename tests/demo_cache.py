"""The demo's digits and trained weights for the tests, made once per machine and cached (training takes most
of a minute on a 2-core machine, at the start of every test run that needs them).

They live in `~/.cache/spark_cnn/test-demo/<key>/` (or under the directory SPARK_CNN_TEST_DEMO_CACHE names), where
the key hashes everything the images and weights are made from: the sources of the demo, of its preprocessing and
decoding, and the versions of the libraries involved. Any change to those trains afresh, so the tests still check
what the current code trains. `prepare_demo` skips each step whose output is already there and writes the weights
atomically; concurrent runs serialise on a file lock beside the folder.
"""

from __future__ import annotations

import fcntl
import glob
import hashlib
import importlib.metadata
import os
import sys

from tests.e2e.cached_env import DEFAULT_CACHE_PARENT

CACHE_ROOT_ENV = "SPARK_CNN_TEST_DEMO_CACHE"
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "spark_cnn")
# What the images and the trained weights depend on: the demo, the tensors it trains on, the decoder.
SOURCES = ("models/digits.py", "models/tensors.py", "imaging/*.py")
LIBRARIES = ("torch", "numpy", "pillow", "scikit-learn")


def demo_key() -> str:
    digest = hashlib.sha256(f"python {sys.version_info.major}.{sys.version_info.minor}\n".encode())
    for library in LIBRARIES:
        digest.update(f"{library} {importlib.metadata.version(library)}\n".encode())
    for pattern in SOURCES:
        for path in sorted(glob.glob(os.path.join(PACKAGE, pattern))):
            with open(path, "rb") as f:
                digest.update(os.path.relpath(path, PACKAGE).encode() + b"\n" + f.read())
    return digest.hexdigest()[:16]


def cached_demo():
    """The DemoAssets of the cached folder, made first if needed."""
    from spark_cnn.models.digits import prepare_demo

    root = os.environ.get(CACHE_ROOT_ENV) or os.path.join(DEFAULT_CACHE_PARENT, "test-demo")
    os.makedirs(root, exist_ok=True)
    folder = os.path.join(root, demo_key())
    with open(folder + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one trainer at a time; the others wait, then find it made
        return prepare_demo(folder)
