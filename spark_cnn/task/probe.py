"""What `spark-cnn doctor` finds out in one process (the driver, or a Spark task on an executor): the versions
that matter, Java, GPUs, the sidecar runtime directory and, in a task, whether a sidecar starts and computes.

Torch-free like the rest of `task/`: versions come from package metadata, never from importing the package.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.metadata
import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from spark_cnn.errors import SparkCnnError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.spec import Endpoint
from spark_cnn.task.client import SidecarClient
from spark_cnn.task.launcher import LaunchOptions, ensure_sidecar, runtime_dir, stop_sidecars
from spark_cnn.task.procs import find_executor_jvm

# The packages whose versions decide whether a job runs; pyspark's comes from the caller (it may be a Spark
# installation's python/ folder, which has no package metadata).
PACKAGES = ("pyarrow", "numpy", "pandas", "torch", "torchvision", "pillow", "spark_cnn")
# The demo's CNN (spark_cnn.models.digits.DIGITS_FACTORY; named here because that module imports torch): the
# smallest model a sidecar can load and run without any file, so a probe needs nothing shipped.
PROBE_MODEL = "spark_cnn.models.digits:digits_cnn"
PROBE_PREPROCESSING = Preprocessing(resize=32, crop=32, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
# A probe's sidecar is stopped as soon as it answered; should that fail, it leaves on its own this soon.
PROBE_IDLE_TIMEOUT_S = 30.0
# `java -version` starts a JVM: about a second on a busy host.
JAVA_TIMEOUT_S = 30.0
_JAVA_VERSION = re.compile(r'version "([^"]+)"')


def process_facts(pyspark_version: str | None) -> dict:
    """Versions, Java, GPUs and the runtime directory of this process's host, as JSON-ready values."""
    facts = {"host": socket.gethostname(), "python": platform.python_version(), "python_path": sys.executable,
             "pyspark": pyspark_version, **{name: package_version(name) for name in PACKAGES},
             "gpus": gpu_devices()}
    facts["java"], facts["java_error"] = java_version(_java_binary())
    try:
        facts["runtime_dir"], facts["runtime_dir_error"] = runtime_dir(), None
    except (SparkCnnError, OSError) as e:
        facts["runtime_dir"], facts["runtime_dir_error"] = None, str(e)
    return facts


def package_version(name: str) -> str | None:
    if name == "spark_cnn":  # the package this module belongs to, imported before it: right from a checkout too
        return sys.modules["spark_cnn"].__version__
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def gpu_devices() -> list[str]:
    """NVIDIA device files on this host (what CUDA can open), without loading a driver library."""
    return sorted((os.path.basename(p) for p in glob.glob("/dev/nvidia[0-9]*")), key=lambda n: int(n[6:]))


def java_version(binary: str | None) -> tuple[str | None, str | None]:
    """(version, None) of the `java` at `binary`, or (None, why not)."""
    if binary is None:
        return None, "no java: set JAVA_HOME or put java 17+ on PATH"
    try:
        done = subprocess.run([binary, "-version"], capture_output=True, text=True, timeout=JAVA_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, f"{binary} -version failed: {e}"
    found = _JAVA_VERSION.search(done.stderr + done.stdout)
    return (found.group(1), None) if found else (None, f"{binary} -version printed no version")


def _java_binary() -> str | None:
    """The JVM's own binary when this process runs under one (a Spark task; a driver under spark-submit), else
    the java Spark's launcher would start: JAVA_HOME's, else the first on PATH."""
    jvm = find_executor_jvm()
    if jvm.executor_id != "unknown":
        try:
            return os.readlink(f"/proc/{jvm.process.pid}/exe")
        except OSError:
            pass
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def probe_sidecar(app_id: str, device: str, gpu_addresses: Sequence[str] = ()) -> dict:
    """Start this executor's sidecar for `app_id`, run one blank image through the probe model, stop it.
    Returns {"ok", "pid", "device", "seconds"} or {"ok": False, "error"}; never raises."""
    launch = LaunchOptions(app_id=app_id, device=device, idle_timeout_s=PROBE_IDLE_TIMEOUT_S)
    if gpu_addresses and device != "cpu":  # the GPU Spark gave this task, as the jobs' tasks use it
        launch = replace(launch, device=f"cuda:{gpu_addresses[0]}")
    endpoint = Endpoint(PROBE_MODEL, None, PROBE_PREPROCESSING, top_k=1).with_fingerprint()
    start = time.monotonic()
    try:
        info = ensure_sidecar(launch)
        with SidecarClient(info.socket, info.token, endpoint, f"doctor-{app_id}", pid=info.pid) as client:
            client.submit(np.zeros((1, *PROBE_PREPROCESSING.pixel_shape), np.uint8))
            _, reply = client.receive()
            if isinstance(reply, Exception):
                raise reply
            if reply.num_rows != 1:
                return {"ok": False, "error": f"the sidecar answered {reply.num_rows} rows for one image"}
            return {"ok": True, "pid": info.pid, "device": client.ready.get("device", info.device),
                    "seconds": round(time.monotonic() - start, 2)}
    except (SparkCnnError, OSError) as e:
        return {"ok": False, "error": str(e)}
    finally:
        with contextlib.suppress(SparkCnnError, OSError):  # nothing to stop when the runtime dir was refused
            stop_sidecars(app_id)
