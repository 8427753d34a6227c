"""A device profile as data: what calibration measured on one device (`DeviceProfile`), its JSON, the files a
person moves between hosts, and the marks that say a cached one went stale. Torch-free: the driver reads a job's
`--device-profile` with it, and the sidecar's start point (startpoint.py) reads the cached one; measuring a
profile is calibration's (spark_cnn.perf_tools.calibration), which writes this format.

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
import math
import os
import re
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

from spark_cnn.errors import ConfigError

__all__ = ["CONV_GRID_REVISION", "DEFAULT_CACHE_DIR", "PROFILE_VERSION", "STALE_SUFFIX", "DeviceProfile",
           "cache_file", "clear_stale", "conv_backend", "export_path", "export_profile", "file_slug", "mark_stale",
           "read_profile_file", "read_profile_text", "stale_reason"]

# Bumped whenever a table changes meaning: cached profiles of another version are measured again (the
# versions' changes are listed in docs/perf-model.md, "Calibration").
PROFILE_VERSION = 6
DEFAULT_CACHE_DIR = os.path.join("~", ".cache", "spark_cnn", "devices")
# The revision of the convolution grid calibration times (perf_tools/calibration/conv_bench.py). Raised when the
# grid gains shapes the time model reads (a profile records the revision it timed, and a cached one of an
# earlier revision is measured again): 1 added STRIDED_GROUPED, LARGE_POINTWISE_GRID and
# POINTWISE_NCHW_GRID; 2 LARGE_DEPTHWISE_GRID.
CONV_GRID_REVISION = 2
STALE_SUFFIX = ".stale"
EXPORT_HINT = "export one on the device's host with `spark-cnn profile --device DEVICE --export FILE`"


def _frozen(value: Any) -> Any:
    """JSON lists -> tuples, recursively (dict values too), so a loaded profile cannot be changed in place."""
    if isinstance(value, list):
        return tuple(_frozen(v) for v in value)
    if isinstance(value, dict):
        return {k: _frozen(v) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class DeviceProfile:
    """What calibration measured on one device with one thread count. Times are microseconds unless named.

    - `curves`: operator kind -> ((tensor bytes at fp32, us per call), ...), ascending: per-call time without
      page faults, of relu (in place), batch_norm, add, max_pool2d_k3s2 (keyed by output bytes), ... .
    - `conv`: one dict per timed convolution: cin, cout, kernel, stride, groups, in_hw, out_hw, batch,
      backend ("mkldnn" or "slow2d", torch's choice), us (without faults), faults (per call).
    - `conv_call_us`, `conv_weight_us_per_mib`: a oneDNN convolution's fixed cost per call, and per MiB of
      weights (reordered to its blocked layout on every call from a plain NCHW module).
    - `gemm`: one dict per timed nn.Linear: rows, in_features, out_features, us.
    - `fault_us_per_page`: first touch of a fresh page and its release; `mmap_threshold_bytes`: allocations
      this large get fresh pages on every call (glibc's largest dynamic mmap threshold).
    - `call_us`: overhead of a call that moves no data: "module" (nn.Flatten), "function" (torch.flatten),
      "container" (what an nn.Sequential adds around its child: every non-leaf module of a network pays it).
    - `decode_ms`: decode + resize + crop of one JPEG on one core; `h2d`: ((bytes, us), ...) pinned copies.
    - `host`: where it was calibrated; `load`: how busy that host was meanwhile (host_load.load_between);
      `repeatability`: how far a sample of benchmarks moved when timed again (repeatability.py), and in how
      many attempts, and whether it was kept `noisy` (beyond its bound on every attempt). Profiles written
      before these were recorded read them as empty.
    - `spread`: the relative interval its predictions carry, +-: the median disagreement between the tables
      and their repeats (repeatability.py); 0.0 in profiles written before it was recorded.
    - `weight_warmth` (CPU): how a linear layer slows down when more data passed through the cache since its
      last call (gemm_bench.time_weight_warmth); empty on a GPU, with a small budget, and in profiles written
      before it was measured (calibrate() measures those again), which then price weights as the GEMM table.
    - `call_warmth` (CPU): how much faster small operators' calls run in a chain of layers than calibration
      times them, against the bytes written between calls (call_warmth_bench.time_call_warmth); empty where
      `weight_warmth` is, and then calls bound by their overhead cost what calibration measured.
    - `conv_grid`: the revision of the convolution grid timed (conv_bench.CONV_GRID_REVISION; 0 in profiles
      written before revisions were recorded). A profile of an earlier one reads its classes as it has them
      (a missing class from its kin) and calibrate() measures a cached one again.
    """

    key: str
    device: str                # "cpu" or "cuda:0"
    threads: int               # torch threads the benchmarks ran with
    created: str               # ISO 8601, UTC
    device_name: str
    torch_version: str
    calibration_s: float
    budget_s: float
    fault_us_per_page: float
    mmap_threshold_bytes: int
    call_us: dict[str, float]
    curves: dict[str, tuple[tuple[float, float], ...]]
    conv: tuple[dict[str, Any], ...]
    conv_call_us: float
    conv_weight_us_per_mib: float
    gemm: tuple[dict[str, Any], ...]
    decode_ms: float
    h2d: tuple[tuple[float, float], ...] = ()
    notes: tuple[str, ...] = ()
    version: int = PROFILE_VERSION
    host: str = ""
    load: dict[str, Any] = field(default_factory=dict)
    repeatability: dict[str, Any] = field(default_factory=dict)
    weight_warmth: dict[str, Any] = field(default_factory=dict)
    call_warmth: dict[str, Any] = field(default_factory=dict)
    conv_grid: int = CONV_GRID_REVISION
    spread: float = 0.0

    def __post_init__(self):
        if self.threads < 1:
            raise ConfigError(f"DeviceProfile {self.key!r}: threads must be >= 1, got {self.threads}")
        for name in ("call_us", "curves", "load", "repeatability", "weight_warmth", "call_warmth"):
            object.__setattr__(self, name, _frozen(dict(getattr(self, name))))
        for name in ("conv", "gemm", "h2d", "notes"):
            object.__setattr__(self, name, _frozen(list(getattr(self, name))))

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    @property
    def noisy(self) -> bool:
        """Kept although its repeats disagreed beyond their bound, or timed implausibly, on every attempt
        ("forced" in profiles written while that took --allow-noisy-calibration)."""
        return bool(self.repeatability.get("noisy", self.repeatability.get("forced", False)))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> DeviceProfile:
        """The profile in `text`; ConfigError when it is not one, or of another PROFILE_VERSION."""
        try:
            data = json.loads(text)
            version = data.get("version")
            if version != PROFILE_VERSION:
                raise ConfigError(f"device profile version {version!r}, expected {PROFILE_VERSION}: calibrate "
                                  "again (calibrate(..., refresh=True) or delete the cached file)")
            data.setdefault("conv_grid", 0)  # written before the grid's revisions were recorded
            return cls(**data)
        except ConfigError:
            raise
        except (ValueError, TypeError, AttributeError) as e:
            raise ConfigError(f"not a device profile ({type(e).__name__}: {e}); calibrate again with "
                              "refresh=True") from e


def conv_backend(cin: int, kernel: tuple[int, ...], stride: tuple[int, ...], dilation: tuple[int, ...],
                 groups: int, batch: int, in_hw: tuple[int, ...], threads: int) -> str:
    """"mkldnn" or "slow2d": the CPU kernel torch picks for an fp32 NCHW Conv2d (torch's use_mkldnn rule in
    aten/native/Convolution.cpp: a 1x1 convolution at batch < 16 on one thread runs as a GEMM per image): the
    `backend` of a profile's `conv` rows, which calibration times and the time model looks up."""
    strided = any(s != 1 for s in stride)
    dilated = any(d != 1 for d in dilation)
    numel = batch * cin * math.prod(in_hw)
    if not (strided or dilated or batch >= 16 or any(k != 1 for k in kernel) or threads > 1):
        return "slow2d"
    if groups > 1 or all(k > 3 for k in kernel) or batch > 1 or numel > 20480:
        return "mkldnn"
    return "slow2d"


def file_slug(text: str) -> str:
    """`text` as a file name every system takes: runs of other characters become one `_`."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "_", text).strip("_")


def cache_file(cache_dir: str | None, key: str) -> str:
    """Where the profile keyed `key` is cached under `cache_dir` (DEFAULT_CACHE_DIR when None)."""
    return os.path.join(os.path.expanduser(cache_dir or DEFAULT_CACHE_DIR), f"{key}.json")


def export_path(path: str) -> str:
    """`path` made absolute, once its folder is known to exist (checked before a calibration is spent on it)."""
    path = os.path.abspath(os.path.expanduser(path))
    folder = os.path.dirname(path)
    if not os.path.isdir(folder):
        raise ConfigError(f"--export {path}: the folder {folder} does not exist; create it or export elsewhere")
    return path


def export_profile(profile: DeviceProfile, path: str) -> str:
    """Write `profile` (a DeviceProfile) to `path` (atomically); returns the absolute path."""
    path = export_path(path)
    partial = f"{path}.{os.getpid()}.tmp"
    with open(partial, "w") as f:
        f.write(profile.to_json())
    os.replace(partial, path)
    return path


def read_profile_text(text: str, *, source: str = "device profile") -> DeviceProfile:
    """The DeviceProfile in `text`; ConfigError (one line) when it is malformed or of another profile version."""
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


def read_profile_file(path: str) -> DeviceProfile:
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
