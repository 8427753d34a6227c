"""Per-batch latency of a CNN on a calibrated device, predicted layer by layer from a ModelCost and a profile.

What is predicted is the sidecar's compute stage (`spark_cnn.sidecar.runner.ModelRunner.forward`) for one
batch: normalise the uint8 pixels, run the model, softmax and top-k. Each layer costs

    t = fixed + work + faults

- **fixed**: the per-call cost (Python module call, dispatch; for a oneDNN convolution also its weights,
  reordered to the blocked layout on every call of an eager module: a cost per MiB of weights; a
  convolution run as a GEMM per image has its own, the intercept of calibration's points on that backend).
- **work**: for convolutions, batch x per-image time, where the per-image time is the padded FLOPs times a
  measured cost per FLOP interpolated (inverse-distance, in log space) among the calibrated convolutions of
  the same class (regular k x k, pointwise on oneDNN, pointwise as a GEMM, depthwise, grouped) over input
  channels per group, output channels, output size, kernel, stride and batch (depthwise ones, which move few
  FLOPs per byte, over kernel, stride and the bytes of activations the batch moves). oneDNN vectorises channels in
  blocks of 16 on AVX-512, so 24 channels cost as 32: FLOPs are counted on channels padded to 16 (a grouped
  convolution's input channels per group in whole blocks, however few: 4 per group cost as 16). The
  backend follows torch's own rule (`calibration.conv_backend`): on one thread a 1x1 convolution below batch
  16 is a GEMM per image, from 16 on a oneDNN kernel, which is why per-image time can jump between 8 and 16.
  Linear layers interpolate the calibrated GEMMs the same way, normalised by a roofline (FLOPs against
  weight bytes streamed). Everything else reads its operator's calibrated time-vs-bytes curve, which holds
  its overhead at small sizes and its cache and memory bandwidth at large ones (log-log interpolation).
  Non-leaf modules (Sequentials, blocks) cost one calibrated call each ("<modules>").
- **cold weights**: a linear layer (or attention) calibrated after 16 MiB of other data finds its weights in
  the cache; inside a network whose forward moves hundreds of MiB it reads them from DRAM. Calibration's
  weight-warmth probe (`gemm_bench.time_weight_warmth`) gives how much of that penalty a given amount of
  traffic causes and how large it is per byte of weights at a given row count; the layer pays the share its
  network's traffic causes beyond what its own calibration saw.
- **warm calls**: calibration times every call cold (16 MiB written over the cache first), so a call whose
  time is mostly its overhead (Python, dispatch, oneDNN's primitive) reloads the framework's code and state.
  Inside a network that state is still cached when the layer before moved little: calibration's call-warmth
  probe (`call_warmth_bench.time_call_warmth`) times a chain of small layers with a given number of bytes
  written between calls, against the same calls timed cold; a layer bound by its overhead takes the chain's
  share at what the layer before it read and wrote (0.44 of its calibrated time after a few hundred KiB on
  the development host, all of it after 8 MiB).
- **faults**: fresh pages, the term that grows fastest with the batch on a CPU: glibc gives large tensors
  pages that fault when first written, and which tensors do depends on sizes and lifetimes, so the forward's
  allocations are replayed through a reduced glibc (`spark_cnn.perf.heap`). The sidecar starts with malloc
  settings that keep freed memory (`spark_cnn.task.sidecar_env`), so by default (`allocator=RETAINED`) the
  replay finds no fresh pages once the heap has grown to the batch's peak; `allocator=GLIBC` predicts a
  process with glibc's defaults.

The layout is channels-last throughout, as in the sidecar (see spark_cnn.perf_tools.calibration). Elementwise
activations and residual adds are taken to run in place, as torchvision's do (ReLU(inplace=True),
`out += identity`).

>>> from torch import nn                                                   # doctest: +SKIP
>>> cost = analyse(nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU()), (3, 64, 64))   # doctest: +SKIP
>>> predict_batch_ms(cost, calibrate("cpu"), 8)                             # doctest: +SKIP
1.9
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from spark_cnn.errors import ConfigError
from spark_cnn.perf.heap import PAGE_BYTES, faulted_bytes
from spark_cnn.perf.layers import LayerCost, ModelCost
from spark_cnn.perf.profile import DeviceProfile, conv_backend
from spark_cnn.task.sidecar_env import GLIBC, RETAINED

__all__ = ["BOUNDS", "PRECISIONS", "layer_kind", "predict_batch_ms", "predict_decode_ms", "predict_layers_ms",
           "predict_peak_memory_bytes", "predict_throughput", "predict_transfer_ms"]

BOUNDS = ("compute", "memory", "overhead")
# Precisions the profiles hold measurements for. bf16/fp16 need their own calibration tables (not yet).
PRECISIONS = ("fp32",)
FP32 = 4
# oneDNN's channel block on AVX-512 fp32: channels are processed 16 at a time.
CHANNEL_BLOCK = 16
# Inverse-distance interpolation: the nearest points and the softening of the distance (in log2 units
# squared); 4 neighbours with 0.05 reproduced held-out grid points best on the development host.
NEIGHBOURS = 4
SOFTENING = 0.05
# Feature weights of the convolution interpolation, per log2 unit: channels and size matter most; the batch
# changes per-image time little once the fixed cost is taken out (0.5 checked by leave-one-out over the
# calibrated grid, never a network: docs/perf-model.md, "Calibration").
CONV_FEATURE_WEIGHTS = np.array([1.0, 1.0, 1.0, 1.5, 1.5, 0.5])
# Depthwise convolutions move a few FLOPs per byte, so their cost per FLOP follows how many bytes of activations
# a batch moves (in and out) far more than its channels or size alone: 13-22 ps per FLOP under 1 MB, 44-55 from
# 17 MB on the development guest (k3, stride 1). They interpolate over kernel, stride and those bytes instead
# (`_ConvShape.features`); over the six features above, 273 channels of 44 px at batch 8 (34 MB) read k5
# points within the cache and were priced at 0.4-0.5 of their time (docs/perf-model.md, "Depthwise
# convolutions by the bytes they move").
DEPTHWISE_FEATURE_WEIGHTS = np.array([1.5, 1.5, 1.0])
GEMM_FEATURE_WEIGHTS = np.array([1.0, 1.0, 1.0])
# Nominal rates that normalise linear layers before interpolation (a roofline's two roofs; calibrated points
# correct them): 100 GFLOP/s and 20 GB/s, in FLOPs and bytes per microsecond.
NOMINAL_FLOPS_PER_US = 1e5
NOMINAL_BYTES_PER_US = 2e4
# The sidecar's pseudo-layers around the model.
NORMALISE_LAYER = "<normalise>"
HEADS_LAYER = "<heads>"
MODULES_LAYER = "<modules>"

# Layer op -> calibrated curve; ops whose curve is keyed on input size.
_CURVES = {"relu": "relu", "relu6": "relu6", "hardtanh": "relu6", "clamp": "relu6", "clamp_min": "relu",
           "hardswish": "hardswish", "hardsigmoid": "hardsigmoid", "silu": "silu", "sigmoid": "sigmoid",
           "gelu": "gelu", "tanh": "sigmoid", "elu": "sigmoid", "leaky_relu": "relu6", "mish": "gelu",
           "add": "add", "sub": "add", "mul": "mul", "div": "mul", "batch_norm": "batch_norm",
           "cat": "cat", "stack": "cat", "contiguous": "copy", "copy": "copy", "clone": "copy", "pad": "copy",
           "adaptive_avg_pool2d": "adaptive_avg_pool2d", "mean": "mean", "sum": "mean", "softmax": "sigmoid",
           "log_softmax": "sigmoid", "layer_norm": "batch_norm", "group_norm": "batch_norm",
           "normalise": "normalise", "heads": "heads"}
_KEYED_ON_INPUT = {"adaptive_avg_pool2d", "mean", "sum", "adaptive_max_pool2d"}
_MODULE_CALLS = {"dropout", "identity", "stochastic_depth", "flatten"}
# Shape fields of a layer whose costliest operator is a matrix product (linear, matmul, attention, and a bare
# scaled_dot_product_attention, whose shape names only heads and lengths).
_GEMM_SHAPED = {"in_features", "embed_dim", "k", "head_dim"}


def _check(profile: DeviceProfile, batch: int, precision: str) -> None:
    if not isinstance(profile, DeviceProfile):
        raise ConfigError(f"expected a DeviceProfile (from calibrate()), got {type(profile).__name__}")
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ConfigError(f"batch must be a positive integer, got {batch!r}")
    if precision not in PRECISIONS:
        raise ConfigError(f"precision {precision!r}: the device profile {profile.key} has measurements for "
                          f"{PRECISIONS} only; predict with precision='fp32'")


def predict_layers_ms(cost: ModelCost, profile: DeviceProfile, batch: int, *, precision: str = "fp32",
                      allocator: str = RETAINED) -> list[tuple[LayerCost, float, str]]:
    """(layer, milliseconds, bound) for every layer at `batch`, in execution order, after the sidecar's
    pseudo-layer "<normalise>" and before "<heads>" and "<modules>" (the calls of non-leaf modules). `bound`
    is "compute", "memory" or "overhead": the largest of the layer's terms (page faults count as memory).

    The sum is predict_batch_ms. Names are the ModelCost's, so a per-layer measurement can be set beside
    them (spark_cnn.perf_tools.validate.layer_report). `allocator` is how the process running the model allocates
    (spark_cnn.task.sidecar_env): RETAINED, the sidecar's settings, keeps freed memory, so the steady state
    faults no pages; GLIBC, glibc's defaults, faults large tensors' pages on every batch."""
    _check(profile, batch, precision)
    if allocator not in (RETAINED, GLIBC):
        raise ConfigError(f"allocator must be {RETAINED!r} or {GLIBC!r}, got {allocator!r}")
    model = _Model.of(profile)
    scale = FP32 / cost.dtype_bytes
    layers = (_normalise_layer(cost), *cost.layers, _heads_layer(cost), _modules_layer(cost))
    faulted = (_faulted_bytes(layers, batch, scale, profile, retained=allocator == RETAINED)
               if profile.fault_us_per_page > 0 else None)
    traffic = _forward_traffic_bytes(layers, batch, scale)
    between = _between_calls_bytes(layers, batch, scale)
    rows = []
    for i, layer in enumerate(layers):
        fault_us = faulted[i] / PAGE_BYTES * profile.fault_us_per_page if faulted else 0.0
        us, bound = model.layer_us(layer, batch, scale, fault_us)
        if bound == "overhead" and model.call_warmth is not None:
            us *= model.call_warmth.share(between[i])
        rows.append((layer, (us + model.cold_weights_us(layer, batch, scale, traffic)) / 1e3, bound))
    return rows


def _forward_traffic_bytes(layers: Sequence[LayerCost], batch: int, scale: float) -> float:
    """Bytes through the cache between two calls of one layer in repeated forwards: every layer's weights
    and outputs once."""
    return scale * sum(layer.weight_bytes + batch * layer.output_bytes for layer in layers)


def _between_calls_bytes(layers: Sequence[LayerCost], batch: int, scale: float) -> list[float]:
    """Bytes through the cache since the previous call, per layer: what the layer before it read and wrote
    (its weights, input and output)."""
    touched = [scale * (layer.weight_bytes + batch * (layer.input_bytes + layer.output_bytes)) for layer in layers]
    return [touched[i - 1] if i else 0.0 for i in range(len(layers))]


def layer_kind(layer: LayerCost, batch: int, profile: DeviceProfile) -> str:
    """What prices `layer` at `batch`: a convolution's class ("conv:conv", "conv:pointwise",
    "conv:pointwise_gemm", "conv:depthwise", "conv:grouped", "conv:pointwise_nchw" and "conv:depthwise_nchw" on
    an NCHW input; "conv:squeeze" for a 1x1 convolution on one pixel, squeeze-excitation's), else its op
    ("relu", "hardswish", "layer_norm", "contiguous", ...)."""
    if layer.op == "conv2d" and len(layer.shape.get("kernel", ())) == 2:
        shape = _conv_shape(layer, batch, profile)
        if shape.kernel == (1, 1) and shape.out_hw == (1, 1):
            return "conv:squeeze"
        return f"conv:{shape.klass}"
    return layer.op


def predict_batch_ms(cost: ModelCost, profile: DeviceProfile, batch: int, *, precision: str = "fp32",
                     allocator: str = RETAINED) -> float:
    """Milliseconds for one batch of `batch` images through the sidecar's compute stage (the sum of
    predict_layers_ms)."""
    return sum(ms for _, ms, _ in predict_layers_ms(cost, profile, batch, precision=precision, allocator=allocator))


def predict_throughput(cost: ModelCost, profile: DeviceProfile, batch: int, *, precision: str = "fp32",
                       allocator: str = RETAINED) -> float:
    """Images per second of the compute stage at `batch`."""
    return batch * 1e3 / predict_batch_ms(cost, profile, batch, precision=precision, allocator=allocator)


def predict_transfer_ms(profile: DeviceProfile, nbytes: int) -> float:
    """Milliseconds to copy `nbytes` from pinned host memory to the device (0 on the CPU, where there is no
    copy), interpolated from the calibrated copies; beyond them, at the largest copy's bandwidth."""
    if not profile.h2d or nbytes <= 0:
        return 0.0
    sizes = [b for b, _ in profile.h2d]
    times = [us for _, us in profile.h2d]
    if nbytes >= sizes[-1]:
        return times[-1] * nbytes / sizes[-1] / 1e3
    return float(np.interp(nbytes, [0.0, *sizes], [times[0] * 0.5, *times])) / 1e3


def predict_decode_ms(profile: DeviceProfile, images: int = 1) -> float:
    """Milliseconds one core takes to decode, resize and crop `images` JPEGs (the benchmark's 320 px photos)."""
    return profile.decode_ms * images


def predict_peak_memory_bytes(cost: ModelCost, batch: int) -> int:
    """Parameters, the peak of live activations (cost.peak_memory_bytes) and the batch's uint8 pixels."""
    return cost.peak_memory_bytes(batch) + batch * math.prod(cost.input_shape)


# --- the sidecar's stages as layers --------------------------------------------------------------------------


def _normalise_layer(cost: ModelCost) -> LayerCost:
    pixels = math.prod(cost.input_shape)
    return LayerCost(NORMALISE_LAYER, "normalise", flops=3 * pixels, input_bytes=pixels,
                     output_bytes=pixels * cost.dtype_bytes, weight_bytes=0,
                     shape={"numel": pixels, "out_shape": (1, *cost.input_shape)})


def _modules_layer(cost: ModelCost) -> LayerCost:
    """The calls of the model's non-leaf modules (the model, its Sequentials and blocks), which run no
    operator of their own: one per distinct proper prefix of the layers' module paths, and the model."""
    containers = {""}
    if cost.method in ("fx", "hooks"):
        for layer in cost.layers:
            parts = layer.name.split(".")
            containers.update(".".join(parts[:i]) for i in range(1, len(parts)))
    return LayerCost(MODULES_LAYER, "modules", flops=0, input_bytes=0, output_bytes=0, weight_bytes=0,
                     shape={"calls": len(containers)})


def _heads_layer(cost: ModelCost) -> LayerCost:
    classes = 1000
    for layer in reversed(cost.layers):
        out = layer.shape.get("out_shape")
        if out:
            classes = math.prod(out[1:])
            break
    return LayerCost(HEADS_LAYER, "heads", flops=6 * classes, input_bytes=classes * cost.dtype_bytes,
                     output_bytes=0, weight_bytes=0, shape={"numel": classes})


# --- the model -----------------------------------------------------------------------------------------------


def _log2(x: float) -> float:
    return math.log2(max(x, 1e-9))


def _padded(channels: int, blocked: bool, *, whole_blocks: bool = False) -> int:
    """`channels` rounded up to oneDNN's block; below one block left as they are unless `whole_blocks`."""
    if not blocked or (channels < CHANNEL_BLOCK and not whole_blocks):
        return channels
    return -(-channels // CHANNEL_BLOCK) * CHANNEL_BLOCK


def _pair(value: Any) -> tuple[int, int]:
    if isinstance(value, int):
        return value, value
    value = tuple(value)
    return (value[0], value[0]) if len(value) == 1 else (value[0], value[1])


def _conv_class(cin: int, cout: int, kernel: tuple[int, int], groups: int, backend: str, nchw: bool = False) -> str:
    if groups > 1 and groups == cin:
        return "depthwise_nchw" if nchw else "depthwise"
    if groups > 1:
        return "grouped"
    if kernel == (1, 1):
        if backend == "slow2d":
            return "pointwise_gemm"
        return "pointwise_nchw" if nchw and backend == "mkldnn" else "pointwise"
    return "conv"


class _ConvShape:
    """A convolution's features for interpolation and its padded FLOPs per image."""

    def __init__(self, cin: int, cout: int, kernel: tuple[int, int], stride: tuple[int, int], groups: int,
                 in_hw: tuple[int, int], out_hw: tuple[int, int], batch: int, backend: str, nchw: bool = False):
        self.cin, self.cout, self.kernel, self.stride, self.groups = cin, cout, kernel, stride, groups
        self.in_hw, self.out_hw, self.batch, self.backend = in_hw, out_hw, batch, backend
        self.klass = _conv_class(cin, cout, kernel, groups, backend, nchw)
        blocked = backend == "mkldnn"
        cin_g = cin // groups
        if self.klass.startswith("depthwise"):
            channels = _padded(cout, blocked)
            self.flops = 2 * channels * out_hw[0] * out_hw[1] * kernel[0] * kernel[1]
        else:
            # oneDNN computes output channels in whole blocks; a grouped convolution reads each group's input
            # channels in whole blocks too, however few (4, 8 and 16 channels per group took the same time, 24
            # as 32: docs/perf-model.md, "Grouped convolutions"), but an ungrouped one reads its input channels
            # as they are: on channels-last inputs 69 -> 64 took 69/64 of 64 -> 64's time, 64 -> 69 that of
            # 64 -> 80 (docs/perf-model.md, "Input channels off the block")
            cin_block = _padded(cin_g, blocked, whole_blocks=True) if self.klass == "grouped" else cin_g
            self.flops = 2 * _padded(cout, blocked) * cin_block * out_hw[0] * out_hw[1] * kernel[0] * kernel[1]
        # `generic_features` place every convolution in one space (a class without points of its own reads
        # them all); `features`, with `feature_weights`, are what its own class interpolates over
        self.generic_features = np.array([_log2(cin_g), _log2(cout), _log2(math.sqrt(out_hw[0] * out_hw[1])),
                                          _log2(math.sqrt(kernel[0] * kernel[1])),
                                          _log2(math.sqrt(stride[0] * stride[1])), _log2(batch)])
        self.features, self.feature_weights = self.generic_features, CONV_FEATURE_WEIGHTS
        if self.klass.startswith("depthwise"):
            activation_bytes = batch * cout * (in_hw[0] * in_hw[1] + out_hw[0] * out_hw[1]) * FP32
            self.features = np.array([_log2(math.sqrt(kernel[0] * kernel[1])),
                                      _log2(math.sqrt(stride[0] * stride[1])), _log2(activation_bytes)])
            self.feature_weights = DEPTHWISE_FEATURE_WEIGHTS
        self.weight_mib = cout * cin_g * kernel[0] * kernel[1] * FP32 / 2**20


class _Model:
    """A profile's tables, arranged for lookups (built once per profile)."""

    _cache: dict[int, tuple[DeviceProfile, _Model]] = {}

    @classmethod
    def of(cls, profile: DeviceProfile) -> _Model:
        hit = cls._cache.get(id(profile))
        if hit is not None and hit[0] is profile:
            return hit[1]
        model = cls(profile)
        if len(cls._cache) > 16:
            cls._cache.clear()
        cls._cache[id(profile)] = (profile, model)
        return model

    def __init__(self, profile: DeviceProfile):
        self.profile = profile
        self.fault_us = profile.fault_us_per_page
        self.threshold = profile.mmap_threshold_bytes or float("inf")
        self.curves = {kind: (np.log([p[0] for p in pts]), np.log([p[1] for p in pts]))
                       for kind, pts in profile.curves.items() if pts}
        self.gemm_conv_call_us = _gemm_conv_call_us(profile)
        self.conv_classes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        by_class: dict[str, list[tuple[np.ndarray, float]]] = {}
        everything: list[tuple[np.ndarray, float]] = []
        for p in profile.conv:
            shape = _ConvShape(p["cin"], p["cout"], (p["kernel"],) * 2, (p["stride"],) * 2, p["groups"],
                               (p["in_hw"],) * 2, (p["out_hw"],) * 2, p["batch"], p["backend"], p.get("nchw", False))
            fixed = self._conv_fixed_us(shape)
            per_image = max(p["us"] - fixed, 0.1 * p["us"]) / p["batch"]
            cost = math.log(per_image / shape.flops)
            by_class.setdefault(shape.klass, []).append((shape.features, cost))
            everything.append((shape.generic_features, cost))
        for klass, pts in by_class.items():
            self.conv_classes[klass] = (np.stack([f for f, _ in pts]), np.array([y for _, y in pts]))
        if everything:
            self.conv_classes["*"] = (np.stack([f for f, _ in everything]), np.array([y for _, y in everything]))
        gemm = [(self._gemm_features(g["rows"], g["in_features"], g["out_features"]),
                 math.log(g["us"] / self._gemm_base_us(g["rows"], g["in_features"], g["out_features"])))
                for g in profile.gemm]
        self.gemm = (np.stack([f for f, _ in gemm]), np.array([y for _, y in gemm])) if gemm else None
        self.gemm_max_rows = max((g["rows"] for g in profile.gemm), default=1)
        self.warmth = _Warmth.of(profile.weight_warmth)
        self.call_warmth = _CallWarmth.of(profile.call_warmth)

    # interpolation

    @staticmethod
    def _idw(points: tuple[np.ndarray, np.ndarray], query: np.ndarray, weights: np.ndarray) -> float:
        features, values = points
        d2 = (((features - query) * weights) ** 2).sum(axis=1)
        nearest = np.argsort(d2)[:NEIGHBOURS]
        w = 1.0 / (d2[nearest] + SOFTENING)
        return float((w * values[nearest]).sum() / w.sum())

    def curve_us(self, kind: str, nbytes: float) -> float:
        """Microseconds of `kind` on a tensor of `nbytes` (fp32): log-log interpolation; beyond the largest
        point it grows in proportion, below the smallest it stays at the per-call overhead."""
        curve = self.curves.get(kind) or self.curves.get("relu_out") or self.curves.get("relu")
        if curve is None:
            return self.profile.call_us.get("module", 5.0)
        xs, ys = curve
        x = math.log(max(nbytes, 1.0))
        if x >= xs[-1]:
            return float(math.exp(ys[-1] + (x - xs[-1])))
        return float(math.exp(np.interp(x, xs, ys)))

    def layer_us(self, layer: LayerCost, batch: int, scale: float, fault_us: float) -> tuple[float, str]:
        """Microseconds of `layer` at `batch` (plus `fault_us`, its share of page faults), and its bound."""
        if layer.op == "conv2d" and len(layer.shape.get("kernel", ())) == 2:
            return self._conv_us(layer, batch, scale, fault_us)
        if layer.op in ("linear", "matmul"):
            us, bound = self._linear_us(layer, batch)
            return us + fault_us, bound
        if layer.op.startswith("max_pool") or layer.op.startswith("avg_pool"):
            return self._pool_us(layer, batch, scale) + fault_us, "memory"
        if layer.op == "modules":
            return layer.shape["calls"] * self.profile.call_us.get("container", 0.0), "overhead"
        if layer.macs and self.gemm is not None and _GEMM_SHAPED & set(layer.shape):
            # attention, and other layers made of matmuls and more
            return self._composite_us(layer, batch, scale) + fault_us, "compute"
        if layer.flops == 0 and layer.input_bytes == 0 and layer.output_bytes == 0:
            kind = "module" if layer.op in _MODULE_CALLS else "function"
            return self.profile.call_us.get(kind, 1.0), "overhead"
        nbytes = (layer.input_bytes if layer.op in _KEYED_ON_INPUT else layer.output_bytes) * batch * scale
        curve = _CURVES.get(layer.op, "relu_out")
        us = self.curve_us(curve, nbytes)
        bound = "overhead" if us < 2 * self.curve_us(curve, 0.0) and fault_us < us else "memory"
        return us + fault_us, bound

    def cold_weights_us(self, layer: LayerCost, batch: int, scale: float, traffic_bytes: float) -> float:
        """What `layer` pays beyond its calibrated time for weights the forward's `traffic_bytes` pushed out of
        the cache: linear layers and layers made of matrix products at their row count; convolutions at one
        row, whatever the batch, as they read their weights once per call (oneDNN reorders them; a GEMM per
        image reads them cold for the first image only). Priced at their row count instead, a convolution's
        thousands of rows priced nothing; at one row, resnet50 at batch 1 went from -13% to -9% and
        efficientnet_b6 from -10% to -3% (docs/perf-model.md, "Convolution weights that come from memory")."""
        if self.warmth is None or not layer.weight_bytes:
            return 0.0
        if layer.op == "conv2d" and len(layer.shape.get("kernel", ())) == 2:
            return self.warmth.extra_us(layer.weight_bytes * scale, 1, traffic_bytes)
        if layer.op not in ("linear", "matmul") and not (layer.macs and _GEMM_SHAPED & set(layer.shape)):
            return 0.0
        return self.warmth.extra_us(layer.weight_bytes * scale, _gemm_shape(layer)[0] * batch, traffic_bytes)

    def _conv_fixed_us(self, shape: _ConvShape) -> float:
        if shape.backend == "slow2d" and self.gemm_conv_call_us is not None:
            return self.gemm_conv_call_us
        fixed = self.profile.conv_call_us
        if shape.backend == "mkldnn":
            fixed += shape.weight_mib * self.profile.conv_weight_us_per_mib
        return fixed

    def _conv_us(self, layer: LayerCost, batch: int, scale: float, fault_us: float) -> tuple[float, str]:
        shape = _conv_shape(layer, batch, self.profile)
        # its own class, else its kin (the same features), else every point in the generic space
        kin = next((k for k in (shape.klass, _CLASS_FALLBACK.get(shape.klass)) if k in self.conv_classes), None)
        points = self.conv_classes.get(kin or "*")
        fixed = self._conv_fixed_us(shape)
        if points is None:
            work = batch * shape.flops / NOMINAL_FLOPS_PER_US
        elif kin is None:
            work = batch * shape.flops * math.exp(self._idw(points, shape.generic_features, CONV_FEATURE_WEIGHTS))
        else:
            work = batch * shape.flops * math.exp(self._idw(points, shape.features, shape.feature_weights))
        bias = self._gemm_bias_us(layer, shape, scale)
        terms = {"compute": work, "overhead": fixed, "memory": fault_us + bias}
        return fixed + work + fault_us + bias, max(terms, key=terms.get)

    def _gemm_bias_us(self, layer: LayerCost, shape: _ConvShape, scale: float) -> float:
        """What a bias adds to a convolution torch runs as a GEMM per image: it fills each image's output with
        the bias and has the GEMM add into it (beta 1), a pass that reads and writes the output, priced as an
        in-place add of one image's output (the "add" curve less its per-call floor: the fill is not a call
        of its own) per image. Calibration times convolutions without a bias, and oneDNN fuses it (a bias
        cost 0-3% there); every convolution the loader folded a BatchNorm into has one. Unpriced, pointwise
        convolutions from few channels into many were -23% over the generated networks, 33 to 198 channels
        at 60 px priced at 0.39 of its time (docs/perf-model.md, "A folded BatchNorm's bias")."""
        if shape.backend != "slow2d" or not layer.shape.get("bias"):
            return 0.0
        image_bytes = layer.output_bytes * scale
        return shape.batch * max(self.curve_us("add", image_bytes) - self.curve_us("add", 0.0), 0.0)

    @staticmethod
    def _gemm_features(rows: int, in_features: int, out_features: int) -> np.ndarray:
        return np.array([_log2(rows), _log2(in_features), _log2(out_features)])

    @staticmethod
    def _gemm_base_us(rows: int, in_features: int, out_features: int) -> float:
        flops = 2 * rows * in_features * out_features
        return max(flops / NOMINAL_FLOPS_PER_US, in_features * out_features * FP32 / NOMINAL_BYTES_PER_US)

    def _gemm_us(self, rows: int, k: int, n: int) -> float:
        base = self._gemm_base_us(rows, k, n)
        if self.gemm is None:
            return base
        # beyond the largest calibrated row count a GEMM's rate no longer grows with its rows (gemm_bench):
        # read it there rather than at a distance that makes every row count look alike
        query = self._gemm_features(min(rows, self.gemm_max_rows), k, n)
        return base * math.exp(self._idw(self.gemm, query, GEMM_FEATURE_WEIGHTS))

    def _linear_us(self, layer: LayerCost, batch: int) -> tuple[float, str]:
        rows, k, n = _gemm_shape(layer)
        rows *= batch
        compute = 2 * rows * k * n / NOMINAL_FLOPS_PER_US
        return self._gemm_us(rows, k, n), "compute" if compute >= k * n * FP32 / NOMINAL_BYTES_PER_US else "memory"

    def _composite_us(self, layer: LayerCost, batch: int, scale: float) -> float:
        """A layer of several operators with matrix work (torchvision's shifted-window attention, a
        MultiheadAttention): all its multiply-adds at the calibrated GEMM rate of its costliest operator's
        shape (the attention's projection), plus a streaming pass over what all its operators write (a
        LayerCost's output bytes are its operators' sum).
        Read from the output curve alone, swin_t's attention was predicted at a quarter of its measured time
        and vit_b_32's at nothing (docs/perf-model.md, "The zoo"), and timm's deit_tiny's fused
        scaled_dot_product_attention at 4% of it (docs/perf-model.md, "Networks the model was not built on")."""
        rows, k, n = _gemm_shape(layer)
        rows *= batch
        per_mac = self._gemm_us(rows, k, n) / (rows * k * n)
        return per_mac * layer.macs * batch + self.curve_us("relu_out", layer.output_bytes * batch * scale)

    def _pool_us(self, layer: LayerCost, batch: int, scale: float) -> float:
        s = layer.shape
        kernel, stride = _pair(s.get("kernel", 2)), _pair(s.get("stride", 2))
        window = kernel[0] * kernel[1]
        out_bytes = layer.output_bytes * batch * scale
        available = {name: spec for name, spec in _POOL_CURVES.items() if name in self.curves}
        if not available:
            return self.curve_us("relu_out", out_bytes)
        # the nearest calibrated window and stride; the cost per output grows with the window
        name, (calibrated, _) = min(available.items(), key=lambda kv: (abs(math.log(kv[1][0] / window)),
                                                                      abs(kv[1][1] - stride[0])))
        return self.curve_us(name, out_bytes) * window / calibrated


def _gemm_shape(layer: LayerCost) -> tuple[int, int, int]:
    """(rows per image, k, n) of the matrix product that prices a layer: a linear layer's (also the projection
    of torchvision's shifted-window attention), a MultiheadAttention's projection, one head's product of a
    fused scaled_dot_product_attention (queries x keys, then x values), or a matmul's."""
    s = layer.shape
    if "in_features" in s:
        return s.get("rows", 1), s["in_features"], s.get("out_features", 1)
    if "embed_dim" in s:
        return s.get("length", 1), s["embed_dim"], s["embed_dim"]
    if "head_dim" in s:
        return s.get("heads", 1) * s.get("length", 1), s["head_dim"], s.get("source_length", 1)
    return s.get("m", 1) * s.get("batch", 1), s.get("k", 1), s.get("n", 1)


class _Warmth:
    """A profile's weight-warmth probe (gemm_bench.time_weight_warmth), for lookups.

    The share of the cold penalty a layer pays is f(traffic) - f(own), where f rises from 0 to 1 along the
    probe's curve (time against the bytes through the cache between two calls, normalised between its first
    and last point) and `own` is what calibration put through the cache before timing the layer: its
    pollution and the layer's own weights. The full penalty is the probe's, per byte of weights, at the
    layer's row count (log-interpolated); beyond the largest probed rows it fades to nothing over one
    doubling, where the arithmetic hides it."""

    def __init__(self, curve: Sequence[Sequence[float]], extra: Sequence[Sequence[float]], probe_bytes: float):
        times = np.array([us for _, us in curve])
        span = times[-1] - times[0]
        self.xs = np.log([b for b, _ in curve])
        self.fs = np.maximum.accumulate(np.clip((times - times[0]) / span, 0.0, 1.0))
        self.pollution = curve[0][0] - probe_bytes
        self.rows = np.log([r for r, _ in extra])
        self.per_byte = np.array([max(us, 0.0) / probe_bytes for _, us in extra])

    @classmethod
    def of(cls, warmth: dict[str, Any]) -> _Warmth | None:
        curve, extra = warmth.get("curve") or (), warmth.get("cold_extra") or ()
        if len(curve) < 2 or not extra or curve[-1][1] <= curve[0][1]:
            return None  # not measured, or no slower when cold: nothing to price
        return cls(curve, extra, float(warmth["weight_bytes"]))

    def share(self, bytes_through: float) -> float:
        """f: 0 at the probe's first point and below, 1 at its last and beyond."""
        return float(np.interp(math.log(max(bytes_through, 1.0)), self.xs, self.fs))

    def extra_us(self, weight_bytes: float, rows: int, traffic_bytes: float) -> float:
        share = self.share(traffic_bytes) - self.share(self.pollution + weight_bytes)
        if share <= 0:
            return 0.0
        x = math.log(max(rows, 1))
        per_byte = float(np.interp(x, self.rows, self.per_byte))
        if x > self.rows[-1]:
            per_byte *= max(0.0, 1.0 - (x - self.rows[-1]) / math.log(2))
        return weight_bytes * per_byte * share


class _CallWarmth:
    """A profile's call-warmth probe (call_warmth_bench.time_call_warmth), for lookups: the share of its
    calibrated time a call bound by its overhead takes inside a network, against the bytes the network moves
    per layer (log-interpolated along the probe's curve, never rising above 1, where calibration timed it, nor
    falling as the traffic grows: a noisy point is read as its predecessor)."""

    def __init__(self, curve: Sequence[Sequence[float]], cold_us: float):
        self.xs = np.log([max(b, 1.0) for b, _ in curve])
        self.shares = np.minimum(np.maximum.accumulate([us / cold_us for _, us in curve]), 1.0)

    @classmethod
    def of(cls, warmth: dict[str, Any]) -> _CallWarmth | None:
        curve, cold_us = warmth.get("curve") or (), float(warmth.get("cold_us") or 0.0)
        if not curve or cold_us <= 0:
            return None  # not measured (a GPU, a small budget, an older profile): calls cost as calibrated
        return cls(curve, cold_us)

    def share(self, bytes_per_layer: float) -> float:
        return float(np.interp(math.log(max(bytes_per_layer, 1.0)), self.xs, self.shares))


_POOL_CURVES = {"max_pool2d_k3s2": (9, 2), "max_pool2d_k3s1": (9, 1), "max_pool2d_k2s2": (4, 2)}


def _gemm_conv_call_us(profile: DeviceProfile) -> float | None:
    """The fixed cost per call of a convolution torch runs as a GEMM per image (backend "slow2d"), from
    calibration's own points: each shape timed on that backend at two batch sizes gives an intercept, and the
    median over shapes is kept (None without such shapes). `conv_call_us` is a oneDNN call's (its primitive
    and its weights' reorder: 125-327 us in the zoo's 43 calibrations on the development host); a GEMM per
    image paid 48-96 us (median 68). Priced at oneDNN's, 1x1 convolutions on one pixel (squeeze-excitation)
    came out +61% over the zoo (docs/perf-model.md, "A GEMM convolution's own fixed cost")."""
    by_shape: dict[tuple, dict[int, float]] = {}
    for p in profile.conv:
        if p["backend"] == "slow2d":
            key = (p["cin"], p["cout"], p["kernel"], p["stride"], p["groups"], p["in_hw"], p.get("nchw", False))
            by_shape.setdefault(key, {})[p["batch"]] = p["us"]
    intercepts = []
    for times in by_shape.values():
        if len(times) >= 2:
            (b1, t1), (b2, t2) = sorted(times.items())[:2]
            slope = (t2 - t1) / (b2 - b1)
            if slope > 0:  # a pair the noise reversed says nothing about either term
                intercepts.append(max(t1 - b1 * slope, 0.0))
    return float(np.median(intercepts)) if intercepts else None


def _conv_shape(layer: LayerCost, batch: int, profile: DeviceProfile) -> _ConvShape:
    s = layer.shape
    kernel, stride = _pair(s["kernel"]), _pair(s.get("stride", 1))
    dilation, in_hw, out_hw = _pair(s.get("dilation", 1)), _pair(s["in_hw"]), _pair(s["out_hw"])
    cin, cout, groups = int(s["in_channels"]), int(s["out_channels"]), int(s.get("groups", 1))
    backend = "cuda" if profile.is_cuda else conv_backend(cin, kernel, stride, dilation, groups, batch, in_hw,
                                                           profile.threads)
    return _ConvShape(cin, cout, kernel, stride, groups, in_hw, out_hw, batch, backend, bool(s.get("nchw")))


# A class without calibrated points (a profile whose budget ended before them) is read from its nearest kin.
_CLASS_FALLBACK = {"depthwise_nchw": "depthwise", "pointwise_nchw": "pointwise"}


# --- page faults (spark_cnn.perf.heap replays the allocations) -----------------------------------------------


def _faulted_bytes(layers: Sequence[LayerCost], batch: int, scale: float, profile: DeviceProfile, *,
                   retained: bool = False) -> list[int]:
    """Bytes of fresh pages each layer writes in the steady state of repeated forwards at `batch` (`retained`:
    an allocator that never maps nor trims, SIDECAR_MALLOC_ENV)."""
    return faulted_bytes(layers, batch, scale, mmap_threshold_bytes=profile.mmap_threshold_bytes or (32 << 20),
                         temporaries=[_temporary_bytes(layer, batch, profile) for layer in layers], retained=retained)


def _temporary_bytes(layer: LayerCost, batch: int, profile: DeviceProfile) -> int:
    """Scratch a layer allocates and frees while it runs: a oneDNN convolution's reordered weights."""
    if layer.op == "conv2d" and len(layer.shape.get("kernel", ())) == 2 and not profile.is_cuda:
        if _conv_shape(layer, batch, profile).backend == "mkldnn":
            return layer.weight_bytes
    return 0
