"""Where a sidecar's batch size starts: the analytical model's pick, when this device has been calibrated.

Calibration takes about a minute, too long for the first task of a job to wait for, so the sidecar only reads
a cached device profile (made by `spark-cnn profile` or `calibrate()` on that host). Without one it starts from
its device default; either way the online tuner then corrects the start from measured batches.
"""

from __future__ import annotations

import os

from torch import nn

from spark_cnn.perf.calibration import DEFAULT_CACHE_DIR, DeviceProfile, device_key
from spark_cnn.perf.tuner import CurvePoint, choose_batch_size

# Where device profiles are cached, if not calibrate()'s default: tests point it at an empty folder so that
# what a machine once calibrated never changes their outcome.
CACHE_DIR_ENV = "SPARK_CNN_CACHE_DIR"


def profile_cache_dir() -> str | None:
    """The cache folder set by $SPARK_CNN_CACHE_DIR, or None for calibrate()'s default."""
    return os.environ.get(CACHE_DIR_ENV) or None


def cached_profile(device: str, threads: int | None = None, cache_dir: str | None = None) -> DeviceProfile | None:
    """The cached DeviceProfile of this device and thread count, or None (nothing is measured here)."""
    cache_dir = cache_dir or profile_cache_dir() or DEFAULT_CACHE_DIR
    path = os.path.join(os.path.expanduser(cache_dir), f"{device_key(device, threads)}.json")
    try:
        with open(path) as f:
            return DeviceProfile.from_json(f.read())
    except (OSError, ValueError):
        return None
    except Exception:  # another profile version: as good as none
        return None


def predicted_start(module: nn.Module, input_shape: tuple[int, int, int], device: str, *, threads: int | None,
                    max_size: int) -> tuple[int, dict[int, float]] | None:
    """(batch size to start from, predicted images/s by batch size), or None without a cached profile."""
    profile = cached_profile(device, threads)
    if profile is None:
        return None
    from spark_cnn.perf.layers import analyse
    from spark_cnn.perf.timemodel import predict_batch_ms

    cost = analyse(module, input_shape)
    sizes = [1 << i for i in range(max_size.bit_length()) if 1 << i <= max_size]
    curve = [CurvePoint(b, predict_batch_ms(cost, profile, b)) for b in sizes]
    return choose_batch_size(curve).batch_size, {p.batch_size: round(p.images_per_s, 1) for p in curve}
