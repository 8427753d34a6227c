"""Device profiles as files a person moves between hosts, and the marks that say a cached one went stale.

`spark-cnn profile --device cuda --export device.json` writes the profile calibrated on a GPU host; `spark-cnn
plan --device-profile device.json` and a job's `--device-profile` read it on any host (`read_profile_file`),
so a team sizes a GPU cluster from a laptop. The file is the cache's own format (the profile's JSON: device
name, host, torch version, profile version, the host's load while calibrating, the tables).

A running sidecar that measures batches far from what a cached profile predicted marks that profile stale
(`mark_stale`: a small file beside it, never a rewrite of the profile in the job's hot path); the next
`calibrate()` measures the device again, and the sidecar's start point stops trusting it meanwhile.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone

from spark_cnn.errors import ConfigError

__all__ = ["STALE_SUFFIX", "clear_stale", "export_path", "export_profile", "mark_stale", "read_profile_file",
           "read_profile_text", "stale_reason"]

STALE_SUFFIX = ".stale"
EXPORT_HINT = "export one on the device's host with `spark-cnn profile --device DEVICE --export FILE`"


def export_path(path: str) -> str:
    """`path` made absolute, once its folder is known to exist (checked before a calibration is spent on it)."""
    path = os.path.abspath(os.path.expanduser(path))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise ConfigError(f"--export {path}: the folder {folder} does not exist; create it or export elsewhere")
    return path


def export_profile(profile, path: str) -> str:
    """Write `profile` (a DeviceProfile) to `path` (atomically); returns the absolute path."""
    path = export_path(path)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        f.write(profile.to_json())
    os.replace(partial, path)
    return path


def read_profile_text(text: str, *, source: str = "device profile"):
    """The DeviceProfile in `text`; ConfigError (one line) when it is malformed or of another profile version."""
    from spark_cnn.perf.calibration.device_profile import PROFILE_VERSION, DeviceProfile

    try:
        data = json.loads(text)
    except ValueError as e:
        raise ConfigError(f"{source} is not a device profile (not JSON: {e}); {EXPORT_HINT}") from None
    if not isinstance(data, dict) or "version" not in data or "key" not in data:
        raise ConfigError(f"{source} is not a device profile (no key and version); {EXPORT_HINT}")
    if data["version"] != PROFILE_VERSION:
        raise ConfigError(f"{source} is a device profile of version {data['version']!r}; this spark_cnn reads "
                          f"version {PROFILE_VERSION}: {EXPORT_HINT} with this version")
    try:
        return DeviceProfile(**data)
    except (ConfigError, TypeError, ValueError, AttributeError) as e:
        why = str(e) if isinstance(e, ConfigError) else f"{type(e).__name__}: {e}"
        raise ConfigError(f"{source} is not a valid device profile ({why}); {EXPORT_HINT}") from None


def read_profile_file(path: str):
    """The DeviceProfile exported to `path`; ConfigError (one line) when it is missing, malformed or of another
    profile version."""
    try:
        with open(os.path.expanduser(path)) as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"--device-profile {path}: cannot read it ({e.strerror or e}); {EXPORT_HINT}") from None
    return read_profile_text(text, source=f"--device-profile {path}")


def mark_stale(profile_path: str, reason: str) -> bool:
    """Mark the cached profile at `profile_path` stale, saying why; False when there is no such profile (or the
    mark cannot be written: a read-only cache is left as it is)."""
    if not os.path.exists(profile_path):
        return False
    mark = {"reason": reason, "marked": datetime.now(timezone.utc).isoformat(timespec="seconds"), "pid": os.getpid()}
    try:
        with open(profile_path + STALE_SUFFIX, "w") as f:
            json.dump(mark, f)
    except OSError:
        return False
    return True


def stale_reason(profile_path: str) -> str | None:
    """Why the cached profile at `profile_path` was marked stale ('<when>: <reason>'), or None."""
    try:
        with open(profile_path + STALE_SUFFIX) as f:
            mark = json.load(f)
        return f"{mark.get('marked', '?')}: {mark.get('reason', 'no reason given')}"
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError):
        return "unreadable stale mark"


def clear_stale(profile_path: str) -> None:
    try:
        os.remove(profile_path + STALE_SUFFIX)
    except FileNotFoundError:
        pass
