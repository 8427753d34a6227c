"""Which device a profile is for: the key a device profile is cached under (CPU model, cores, threads, torch
version; or GPU name) and where that file lies. Needs torch (its version, the GPU's name): the sidecar's start
point and calibration use it; the torch-free profile data is profile.py.
"""

from __future__ import annotations

import os
import platform

import torch

from spark_cnn.errors import ConfigError
from spark_cnn.perf.profile import cache_file, file_slug
from spark_cnn.task.sidecar_env import cpu_threads

__all__ = ["cache_path", "cpu_name", "device_key", "resolve_device"]


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def resolve_device(device: str) -> torch.device:
    """`device` ('cpu', 'cuda', 'gpu', 'cuda:N') as a torch.device; ConfigError for one this host lacks."""
    if device in ("cuda", "gpu"):
        device = "cuda:0"
    try:
        resolved = torch.device(device)
    except RuntimeError as e:
        raise ConfigError(f"calibrate: unknown device {device!r}; use 'cpu' or 'cuda[:N]'") from e
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"calibrate: device {device!r} asked for but CUDA is not available; use device='cpu'")
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"calibrate: device {device!r} is not supported; use 'cpu' or 'cuda[:N]'")
    if resolved.type == "cuda" and resolved.index is None:
        resolved = torch.device("cuda:0")
    return resolved


def device_key(device: str = "cpu", threads: int | None = None) -> str:
    """The cache key of a device: what changes the timings (CPU model, cores, torch threads; GPU name) and
    the torch version (kernels change between releases).

    >>> device_key("cpu", 1).startswith("cpu-")
    True
    """
    resolved = resolve_device(device)
    version = torch.__version__.split("+")[0]
    if resolved.type == "cuda":
        name = torch.cuda.get_device_name(resolved)
        return file_slug(f"cuda-{name}-torch{version}")
    threads = cpu_threads(threads)
    return file_slug(f"cpu-{cpu_name()}-{os.cpu_count()}c-{threads}t-torch{version}")


def cache_path(device: str = "cpu", threads: int | None = None, cache_dir: str | None = None) -> str:
    """Where calibrate() caches the profile of `device` with `threads` (it may not exist yet)."""
    return cache_file(cache_dir, device_key(device, threads))
