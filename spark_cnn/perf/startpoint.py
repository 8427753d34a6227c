"""Where a sidecar's batch size starts: the analytical model's pick, when this device has been calibrated.

Calibration takes about a minute, too long for the first task of a job to wait for, so the sidecar only reads
a cached device profile (made by `spark-cnn profile` or `calibrate()` on that host). Without one it starts from
its device default; either way the online tuner then corrects the start from measured batches. A job may hand
it a profile exported on another host instead (`--device-profile`, profile.py); a cached profile a job
marked stale (its batches ran far from the prediction) is not used until calibration refreshes it. A profile
calibrated on a noisy host is used as any other (the online tuner corrects its start from measured batches): a
sidecar never calibrates, so noise never stops it from serving.
"""

from __future__ import annotations

import os

from torch import nn

from spark_cnn.perf.device_key import cache_path
from spark_cnn.perf.placement import DecodeChoice, choose_decode_place
from spark_cnn.perf.profile import DEFAULT_CACHE_DIR, DeviceProfile, mark_stale, read_profile_text, stale_reason
from spark_cnn.perf.tuner import CurvePoint, choose_batch_size

# The sidecar's whole view of perf/: where its batch size and its decoding start, and the profile behind them.
__all__ = ["CACHE_DIR_ENV", "DecodeChoice", "cached_profile", "choose_decode_place", "mark_profile_stale",
           "predicted_start", "profile_cache_dir", "start_profile"]

# Where device profiles are cached, if not calibrate()'s default: tests point it at an empty folder so that
# what a machine once calibrated never changes their outcome.
CACHE_DIR_ENV = "SPARK_CNN_CACHE_DIR"


def profile_cache_dir() -> str | None:
    """The cache folder set by $SPARK_CNN_CACHE_DIR, or None for calibrate()'s default."""
    return os.environ.get(CACHE_DIR_ENV) or None


def _cached_path(device: str, threads: int | None, cache_dir: str | None) -> str:
    return cache_path(device, threads, cache_dir or profile_cache_dir() or DEFAULT_CACHE_DIR)


def cached_profile(device: str, threads: int | None = None, cache_dir: str | None = None, *,
                   include_stale: bool = False) -> DeviceProfile | None:
    """The cached DeviceProfile of this device and thread count, or None (nothing is measured here); None too
    when a job marked it stale, unless `include_stale`."""
    path = _cached_path(device, threads, cache_dir)
    if not include_stale and stale_reason(path) is not None:
        return None
    try:
        with open(path) as f:
            return DeviceProfile.from_json(f.read())
    except (OSError, ValueError):
        return None
    except Exception:  # another profile version: as good as none
        return None


def mark_profile_stale(device: str, threads: int | None, reason: str, cache_dir: str | None = None) -> bool:
    """Mark this device's cached profile stale (the next calibration measures again); False without one."""
    return mark_stale(_cached_path(device, threads, cache_dir), reason)


def start_profile(device: str, threads: int | None, profile_json: str | None = None) -> DeviceProfile | None:
    """The profile a sidecar on `device` starts from: the one a job handed it (`profile_json`, an exported
    profile's text) when it is for this kind of device, else the cached one (None when missing or stale)."""
    return _start_profile(device, threads, profile_json)[0]


def _start_profile(device: str, threads: int | None, profile_json: str | None) -> tuple[DeviceProfile | None, str]:
    if profile_json:
        profile = read_profile_text(profile_json, source="the job's --device-profile")
        if profile.is_cuda == device.startswith("cuda"):
            return profile, "job"
    return cached_profile(device, threads), "cached"


def predicted_start(module: nn.Module, input_shape: tuple[int, int, int], device: str, *, threads: int | None,
                    max_size: int, profile_json: str | None = None) -> tuple[int, dict[int, float], str] | None:
    """(batch size to start from, predicted images/s by batch size, "job" or "cached": whose profile), or None
    without a usable profile (the one the job handed over in `profile_json`, else a cached one not stale)."""
    profile, source = _start_profile(device, threads, profile_json)
    if profile is None:
        return None
    from spark_cnn.perf.layers import analyse
    from spark_cnn.perf.timemodel import predict_batch_ms

    cost = analyse(module, input_shape)
    sizes = [1 << i for i in range(max_size.bit_length()) if 1 << i <= max_size]
    curve = [CurvePoint(b, predict_batch_ms(cost, profile, b)) for b in sizes]
    return choose_batch_size(curve).batch_size, {p.batch_size: round(p.images_per_s, 1) for p in curve}, source
