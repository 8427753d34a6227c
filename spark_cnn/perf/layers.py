"""Layer analysis of any torch.nn.Module: FLOPs, bytes moved and live activation memory, as functions of batch size.

`analyse(module, (3, 224, 224))` runs the module once, in eval mode and without gradients, on one zero image,
and records every ATen operator its forward dispatches; `spark_cnn.perf.op_costs` costs each one from the
shapes of its tensors. Nothing comes from a table of known networks. The tracer decides how operators are
grouped into layers and named (`ModelCost.method`: "fx", "hooks" or "dispatch"; see
`spark_cnn.perf.layer_tracing`).

Operators without a rule are listed in `ModelCost.uncosted` ("layer: target (aten op)"), never counted as zero.

Counts are per image, measured at batch 1, and assume the per-image work does not depend on the batch (true
of every operator that treats images independently, i.e. every CNN layer); weights are read once per batch.
Operations on parameters alone (folding a frozen batch norm's scale, say) run once per batch and are not
layers: what they produce counts as weight bytes of the layers that read it. Tensors a forward creates from
nothing (`torch.zeros(n, ...)`) are treated the same way, as constants.

Peak activation memory is a liveness walk over the recorded operators: a tensor's storage is allocated by the
operator that first produces it (views and in-place results share it), and dies after the last operator that
reads it; the model's outputs live to the end. It counts every allocation seen, including the ones the byte
counts leave out as not useful (max-pooling indices), but not the workspace inside a kernel.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.perf.layer_tracing import TracedLayer, itemsize_of, trace

__all__ = ["DEFAULT_DTYPE_BYTES", "DEFAULT_INPUT_SHAPE", "LayerCost", "ModelCost", "analyse"]

# The crop every torchvision classifier is specified at; inception_v3 wants (3, 299, 299).
DEFAULT_INPUT_SHAPE = (3, 224, 224)
# fp32, what the sidecar runs on the CPU; 2 models bf16/fp16, 1 int8. Only element sizes change: the forward
# that is analysed runs in the module's own dtype.
DEFAULT_DTYPE_BYTES = 4
DTYPE_BYTES_CHOICES = (1, 2, 4, 8)
METHODS = ("fx", "hooks", "dispatch")


def _check_batch(batch: int) -> int:
    if isinstance(batch, bool) or not isinstance(batch, int) or batch < 1:
        raise ValueError(f"batch must be a positive integer, got {batch!r}")
    return batch


def _ratio(flops: int, nbytes: int) -> float:
    if nbytes == 0:
        return float("inf") if flops else 0.0
    return flops / nbytes


@dataclass(frozen=True)
class LayerCost:
    """One layer's cost for one image: FLOPs and activation bytes scale with batch, weight bytes do not.

    `shape` holds what a cost model needs, per kind: conv (in_channels, out_channels, kernel, stride, padding,
    dilation, groups, in_hw, out_hw, bias, macs), linear (in_features, out_features, rows, bias, macs), matmul
    (m, k, n, batch, macs), pooling (kernel, stride, channels, in_hw, out_hw), elementwise and normalisation
    (numel); every layer also has in_shape and out_shape (at batch 1), and a layer made of several costed
    operators has `ops` (operator kind -> count).

    >>> conv = LayerCost("conv1", "conv2d", flops=2_000, input_bytes=300, output_bytes=400, weight_bytes=100)
    >>> conv.flops_at(8), conv.bytes_at(8), round(conv.intensity(8), 2)
    (16000, 5700, 2.81)
    """

    name: str            # module path, or the fx node name of a functional op
    op: str              # normalised kind: conv2d, linear, batch_norm, relu, add, max_pool2d, flatten, ...
    flops: int           # per image; a multiply-add counts 2
    input_bytes: int     # activations read per image
    output_bytes: int    # activations written per image
    weight_bytes: int    # parameters and buffers read, once per batch
    shape: dict[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self):
        for name in ("flops", "input_bytes", "output_bytes", "weight_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"LayerCost {self.name!r}: {name} must be a non-negative int, got {value!r}")

    @property
    def macs(self) -> int:
        """Multiply-accumulates per image of the conv/linear/matmul/attention work in this layer (0 for others)."""
        return int(self.shape.get("macs", 0))

    def flops_at(self, batch: int) -> int:
        return self.flops * _check_batch(batch)

    def bytes_at(self, batch: int) -> int:
        """Activations in and out for `batch` images, plus the weights once."""
        return (self.input_bytes + self.output_bytes) * _check_batch(batch) + self.weight_bytes

    def intensity(self, batch: int) -> float:
        """Arithmetic intensity at `batch`: FLOPs per byte moved (inf for FLOPs without bytes)."""
        return _ratio(self.flops_at(batch), self.bytes_at(batch))


_TOP_KEYS: dict[str, Callable[[LayerCost, int], float]] = {
    "flops": lambda layer, batch: layer.flops_at(batch),
    "bytes": lambda layer, batch: layer.bytes_at(batch),
    "macs": lambda layer, batch: layer.macs,
    "weight_bytes": lambda layer, batch: layer.weight_bytes,
    "output_bytes": lambda layer, batch: layer.output_bytes,
}


@dataclass(frozen=True)
class ModelCost:
    """A module's layers in execution order and its totals as functions of batch size.

    >>> cost = analyse(nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU()), (3, 10, 10))
    >>> [(layer.name, layer.op, layer.flops) for layer in cost.layers]
    [('0', 'conv2d', 28160), ('1', 'relu', 512)]
    """

    layers: tuple[LayerCost, ...]
    uncosted: tuple[str, ...]          # "layer: target (aten op)" for every operator no rule covers
    input_shape: tuple[int, ...]       # one image, e.g. (3, 224, 224)
    dtype_bytes: int                   # bytes per floating-point element assumed in every count
    peak_activation_bytes: int         # per image: most bytes of activations live at once
    parameter_bytes: int               # parameters and buffers held in memory, once
    method: str                        # "fx", "hooks" or "dispatch": the tracer that grouped the layers
    notes: tuple[str, ...] = ()        # why a fallback tracer was used, and similar

    def __post_init__(self):
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")

    def flops(self, batch: int = 1) -> int:
        return sum(layer.flops for layer in self.layers) * _check_batch(batch)

    def macs(self, batch: int = 1) -> int:
        """Multiply-accumulates of conv, linear, matmul and attention layers (what FlopCounterMode counts, / 2)."""
        return sum(layer.macs for layer in self.layers) * _check_batch(batch)

    def bytes(self, batch: int = 1) -> int:
        """Bytes every layer moves for `batch` images: activations in and out, and its weights once."""
        return sum(layer.bytes_at(batch) for layer in self.layers)

    def intensity(self, batch: int = 1) -> float:
        return _ratio(self.flops(batch), self.bytes(batch))

    def peak_memory_bytes(self, batch: int = 1) -> int:
        """Parameters plus `batch` times the per-image peak of live activations."""
        return self.parameter_bytes + _check_batch(batch) * self.peak_activation_bytes

    def top(self, n: int = 10, *, key: str | Callable[[LayerCost], float] = "flops",
            batch: int = 1) -> list[LayerCost]:
        """The `n` costliest layers, by "flops", "bytes" (at `batch`), "macs", "weight_bytes", "output_bytes",
        or a function of a LayerCost. Ties keep execution order."""
        if callable(key):
            score = key
        elif key in _TOP_KEYS:
            _check_batch(batch)

            def score(layer: LayerCost) -> float:
                return _TOP_KEYS[key](layer, batch)
        else:
            raise ValueError(f"key must be one of {sorted(_TOP_KEYS)} or a function of a LayerCost, got {key!r}")
        return sorted(self.layers, key=score, reverse=True)[:max(n, 0)]

    def as_dict(self) -> dict[str, Any]:
        """Plain data for JSON: the fields, with layers as dicts."""
        return {"method": self.method, "input_shape": list(self.input_shape), "dtype_bytes": self.dtype_bytes,
                "peak_activation_bytes": self.peak_activation_bytes, "parameter_bytes": self.parameter_bytes,
                "flops": self.flops(), "macs": self.macs(), "uncosted": list(self.uncosted),
                "notes": list(self.notes),
                "layers": [{"name": layer.name, "op": layer.op, "flops": layer.flops,
                            "input_bytes": layer.input_bytes, "output_bytes": layer.output_bytes,
                            "weight_bytes": layer.weight_bytes, "shape": _plain(layer.shape)}
                           for layer in self.layers]}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return [_plain(v) for v in value]
    return value


def analyse(module: nn.Module, input_shape: tuple[int, ...] = DEFAULT_INPUT_SHAPE, *,
            dtype_bytes: int = DEFAULT_DTYPE_BYTES) -> ModelCost:
    """Per-layer FLOPs, bytes and the peak of live activations of `module` on images of `input_shape`.

    The module runs once on a batch of one zero image, on the device and in the dtype of its parameters,
    in eval mode (its training flags are restored afterwards). `dtype_bytes` is the element size counted for
    floating-point tensors (4 for fp32, 2 for bf16/fp16), whatever dtype the module ran in.

    >>> cost = analyse(nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.ReLU()), (3, 10, 10))
    >>> cost.flops(), cost.flops(4), cost.method
    (28160, 112640, 'fx')
    """
    if not isinstance(module, nn.Module):
        raise ModelError(f"analyse needs a torch.nn.Module, got {type(module).__name__}")
    if (not isinstance(input_shape, (tuple, list)) or not input_shape
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in input_shape)):
        raise ConfigError(f"input_shape {input_shape!r}: expected one image's shape as positive ints, "
                          "e.g. (3, 224, 224)")
    if dtype_bytes not in DTYPE_BYTES_CHOICES:
        raise ConfigError(f"dtype_bytes {dtype_bytes!r}: expected one of {DTYPE_BYTES_CHOICES} "
                          "(4 for fp32, 2 for bf16/fp16)")
    input_shape = tuple(input_shape)
    device, dtype = _placement(module)
    if device.type == "meta":
        raise ModelError(f"{type(module).__name__} has its parameters on the meta device: analyse runs the module, "
                         "so give it real weights first, e.g. module.to_empty(device='cpu')")
    image = torch.zeros((1, *input_shape), device=device, dtype=dtype)
    if image.dim() == 4:  # the layout the sidecar computes in: a convolution's input layout changes its kernel
        image = image.contiguous(memory_format=torch.channels_last)
    training = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            recording, notes = trace(module, image, dtype_bytes)
    finally:
        for m, flag in training:
            m.training = flag
    return ModelCost(layers=tuple(_layer(traced) for traced in recording.layers),
                     uncosted=tuple(recording.uncosted), input_shape=input_shape, dtype_bytes=dtype_bytes,
                     peak_activation_bytes=recording.peak_bytes(),
                     parameter_bytes=_parameter_bytes(module, dtype_bytes), method=recording.method, notes=notes)


def _placement(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.is_floating_point():
            return tensor.device, tensor.dtype
    return torch.device("cpu"), torch.float32


def _parameter_bytes(module: nn.Module, dtype_bytes: int) -> int:
    itemsize = itemsize_of(dtype_bytes)
    seen: set[int] = set()
    total = 0
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * itemsize(tensor)
    return total


def _layer(traced: TracedLayer) -> LayerCost:
    """A traced layer's operators summed into one LayerCost; its shape fields are its costliest operator's."""
    costs = traced.costs
    kinds = Counter(c.kind for c in costs if c.kind != "view")
    primary = max(costs, key=lambda c: (c.flops, c.kind != "view"), default=None)
    shape = dict(primary.shape) if primary is not None else {}
    if len(costs) > 1 and sum(kinds.values()) > 1:
        shape["ops"] = dict(kinds)
    macs = sum(int(c.shape.get("macs", 0)) for c in costs)
    if macs:
        shape["macs"] = macs
    if traced.in_shape is not None:
        shape.setdefault("in_shape", traced.in_shape)
    if traced.out_shape is not None:
        shape.setdefault("out_shape", traced.out_shape)
    return LayerCost(name=traced.name, op=traced.label, flops=sum(c.flops for c in costs),
                     input_bytes=sum(c.input_bytes for c in costs), output_bytes=sum(c.output_bytes for c in costs),
                     weight_bytes=sum(c.weight_bytes for c in costs), shape=shape)
