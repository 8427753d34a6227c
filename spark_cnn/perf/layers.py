"""Layer analysis of any torch.nn.Module: FLOPs, bytes moved and live activation memory, as functions of batch size.

`analyse(module, (3, 224, 224))` runs the module once, in eval mode and without gradients, on one zero image,
and records every ATen operator its forward dispatches; `spark_cnn.perf.op_costs` costs each one from the
shapes of its tensors. Nothing comes from a table of known networks. The tracer decides how operators are
grouped into layers and named (`ModelCost.method`):

- "fx": `torch.fx.symbolic_trace`; one layer per graph node, i.e. per leaf-module call (named by its path,
  `features.3.block.0.0`) or functional op (named by its node, `add_3`). Used whenever the module traces.
- "hooks": for modules fx cannot trace (data-dependent control flow, ...): forward hooks make one layer per
  leaf-module call, named by its path; each operator run outside a leaf module becomes its own layer, named
  by the module that ran it (a residual add in `layer1.0` is `layer1.0.add`), so functional ops are costed too.
- "dispatch": TorchScript modules, which take no hooks: one layer per operator, named by its kind (`conv2d_3`).

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

import operator
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.models.tracing import FX_GATE
from spark_cnn.perf.op_costs import OpCost, op_cost

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
    training = [(m, m.training) for m in module.modules()]
    module.eval()
    try:
        with torch.no_grad():
            if isinstance(module, torch.jit.ScriptModule):
                recording, notes = _record(_run_dispatch, module, image, dtype_bytes, name=type(module).__name__), ()
            else:
                recording, notes = _trace_fx_or_hooks(module, image, dtype_bytes)
    finally:
        for m, flag in training:
            m.training = flag
    return ModelCost(layers=tuple(recording.layers), uncosted=tuple(recording.uncosted), input_shape=input_shape,
                     dtype_bytes=dtype_bytes, peak_activation_bytes=recording.peak_bytes(),
                     parameter_bytes=_parameter_bytes(module, dtype_bytes), method=recording.method, notes=notes)


def _placement(module: nn.Module) -> tuple[torch.device, torch.dtype]:
    for tensor in [*module.parameters(), *module.buffers()]:
        if tensor.is_floating_point():
            return tensor.device, tensor.dtype
    return torch.device("cpu"), torch.float32


def _itemsize(dtype_bytes: int) -> Callable[[torch.Tensor], int]:
    def itemsize(tensor: torch.Tensor) -> int:
        if tensor.is_floating_point():
            return dtype_bytes
        if tensor.is_complex():
            return 2 * dtype_bytes
        return tensor.element_size()
    return itemsize


def _parameter_bytes(module: nn.Module, dtype_bytes: int) -> int:
    itemsize = _itemsize(dtype_bytes)
    seen: set[int] = set()
    total = 0
    for tensor in [*module.parameters(), *module.buffers()]:
        if id(tensor) not in seen:
            seen.add(id(tensor))
            total += tensor.numel() * itemsize(tensor)
    return total


def _trace_fx_or_hooks(module: nn.Module, image: torch.Tensor, dtype_bytes: int) -> tuple[_Recording, tuple]:
    name = type(module).__name__
    try:
        with FX_GATE.tracing():  # fx patches nn.Module.__call__ process-wide: no forward may run meanwhile
            graph_module = torch.fx.symbolic_trace(module)
    except Exception as e:  # fx raises many kinds: TraceError, TypeError, NotImplementedError, ...
        note = f"torch.fx could not trace {name} ({type(e).__name__}: {e}); used forward hooks"
        return _record(_run_hooks, module, image, dtype_bytes, name=name), (note,)
    try:
        return _record(_run_fx, graph_module, image, dtype_bytes, name=name), ()
    except ModelError as e:  # the model may be at fault (then hooks fail too and say so) or the trace
        note = f"the fx graph of {name} failed to run ({e.__cause__!r}); used forward hooks"
        return _record(_run_hooks, module, image, dtype_bytes, name=name), (note,)


def _record(run: Callable[[nn.Module, torch.Tensor, _Recording], Any], module: nn.Module, image: torch.Tensor,
            dtype_bytes: int, *, name: str) -> _Recording:
    recording = _Recording(dtype_bytes, method=_RUN_METHODS[run])
    try:
        with recording:
            recording.add_input(image)
            output = run(module, image, recording)
    except Exception as e:
        raise ModelError(f"{name} failed on a batch of one {tuple(image.shape[1:])} image ({type(e).__name__}: {e}); "
                         "pass the input_shape the model expects, e.g. (3, 224, 224)") from e
    recording.keep_alive(output)
    return recording


# --- the recording: operators -> costs, storages -> liveness ---------------------------------------------------


@dataclass
class _Group:
    """The operators of one layer while it runs."""

    name: str
    label: str
    target: str
    costs: list[OpCost] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


class _Recording(TorchDispatchMode):
    """Sees every ATen call of one forward: costs it into the open layer and tracks activation storages.

    A tensor is an activation when its storage was produced by an operator that read an activation (the input
    image is the first); everything else (parameters, buffers, what is computed from them) is a weight.
    """

    def __init__(self, dtype_bytes: int, method: str):
        super().__init__()
        self.method = method
        self.itemsize = _itemsize(dtype_bytes)
        self.layers: list[LayerCost] = []
        self.uncosted: list[str] = []
        self.group: _Group | None = None
        self.loose_prefix: Callable[[], str] = lambda: ""  # names a layer for an operator outside any group
        self._names: set[str] = set()
        self._buffer_at: dict[tuple, int] = {}  # storage key of a live activation -> buffer id
        self._buffer_bytes: list[int] = []
        self._steps: list[tuple[tuple[int, ...], tuple[int, ...]]] = []  # (buffers read, buffers allocated)
        self._kept: set[int] = set()

    # storages and liveness

    @staticmethod
    def _key(tensor: torch.Tensor) -> tuple | None:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse and other storage-less tensors
            return None
        if storage.nbytes() == 0:
            return None
        return tensor.device.type, tensor.device.index, storage.data_ptr()

    def is_activation(self, tensor: Any) -> bool:
        return isinstance(tensor, torch.Tensor) and self._key(tensor) in self._buffer_at

    def _allocate(self, tensor: torch.Tensor, key: tuple) -> int:
        elements = tensor.untyped_storage().nbytes() // tensor.element_size()
        self._buffer_bytes.append(elements * self.itemsize(tensor))
        self._buffer_at[key] = len(self._buffer_bytes) - 1
        return self._buffer_at[key]

    def add_input(self, image: torch.Tensor) -> None:
        self._steps.append(((), (self._allocate(image, self._key(image)),)))

    def keep_alive(self, output: Any) -> None:
        """The module's outputs stay live to the end."""
        for tensor in tree_leaves(output):
            if self.is_activation(tensor):
                self._kept.add(self._buffer_at[self._key(tensor)])

    def peak_bytes(self) -> int:
        """The most bytes of activation storages live at once, over the recorded steps."""
        last = len(self._steps) - 1
        born: dict[int, int] = {}
        dies: dict[int, int] = {}
        for step, (reads, allocated) in enumerate(self._steps):
            for buffer in allocated:
                born[buffer] = dies[buffer] = step
            for buffer in reads:
                dies[buffer] = step
        for buffer in self._kept:
            dies[buffer] = last
        change = [0] * (last + 2)
        for buffer, step in born.items():
            change[step] += self._buffer_bytes[buffer]
            change[dies[buffer] + 1] -= self._buffer_bytes[buffer]
        peak = live = 0
        for delta in change:
            live += delta
            peak = max(peak, live)
        return peak

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        outputs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        activations = [t for t in inputs if self.is_activation(t)]
        input_keys = {self._key(t) for t in inputs}
        if not activations:  # an operation on constants; a fresh one may reuse a dead activation's address
            for tensor in outputs:
                if self._key(tensor) not in input_keys:
                    self._buffer_at.pop(self._key(tensor), None)
            return out
        activation_ids = {id(t) for t in activations}
        try:
            cost = op_cost(func, args, kwargs, out, is_activation=lambda t: id(t) in activation_ids,
                           itemsize=self.itemsize)
        except Exception as e:  # a rule that does not fit this call: listed, not guessed
            cost, func = None, f"{func}: rule failed with {type(e).__name__}: {e}"
        reads = tuple(sorted({self._buffer_at[self._key(t)] for t in activations}))
        allocated: list[int] = []
        fresh: set[tuple] = set()
        for tensor in outputs:
            key = self._key(tensor)
            if key is None or key in fresh or (key in input_keys and key in self._buffer_at):
                continue  # a view or an in-place result shares its input's storage
            fresh.add(key)
            allocated.append(self._allocate(tensor, key))
        self._steps.append((reads, tuple(allocated)))
        self._add(func, cost, activations, outputs)
        return out

    # layers

    def open(self, name: str, label: str, target: str) -> None:
        self.group = _Group(name, label, target)

    def close(self, inputs: Any, outputs: Any, *, passthrough: bool = True) -> None:
        """End the open layer. A layer that ran no operator but returns an activation (dropout, identity in
        eval) is kept with zero cost when `passthrough`."""
        group, self.group = self.group, None
        if group is None:
            return
        ins = [t for t in tree_leaves(inputs) if self.is_activation(t)]
        outs = [t for t in tree_leaves(outputs) if self.is_activation(t)]
        for op in group.unknown:
            self.uncosted.append(f"{group.name}: {group.target} ({op})" if group.target else f"{group.name}: {op}")
        if group.costs or (passthrough and outs and not group.unknown):
            self.layers.append(_layer(self._unique(group.name), group.label, group.costs, ins, outs))

    def _add(self, func: Any, cost: OpCost | None, inputs: list[torch.Tensor], outputs: list[torch.Tensor]) -> None:
        if self.group is not None:
            if cost is None:
                self.group.unknown.append(str(func))
            else:
                self.group.costs.append(cost)
            return
        label = cost.kind if cost is not None else _aten_label(func)
        prefix = self.loose_prefix()
        self.group = _Group(f"{prefix}.{label}" if prefix else label, label, "")
        self._add(func, cost, inputs, outputs)
        self.close(inputs, outputs)

    def _unique(self, name: str) -> str:
        unique, n = name, 0
        while unique in self._names:
            n += 1
            unique = f"{name}_{n}"
        self._names.add(unique)
        return unique


def _layer(name: str, label: str, costs: list[OpCost], inputs: list[torch.Tensor],
           outputs: list[torch.Tensor]) -> LayerCost:
    kinds = Counter(c.kind for c in costs if c.kind != "view")
    primary = max(costs, key=lambda c: (c.flops, c.kind != "view"), default=None)
    shape = dict(primary.shape) if primary is not None else {}
    if len(costs) > 1 and sum(kinds.values()) > 1:
        shape["ops"] = dict(kinds)
    macs = sum(int(c.shape.get("macs", 0)) for c in costs)
    if macs:
        shape["macs"] = macs
    if inputs:  # the largest: a broadcast scale is not what the layer is about
        shape.setdefault("in_shape", tuple(max(inputs, key=lambda t: t.numel()).shape))
    if outputs:
        shape.setdefault("out_shape", tuple(outputs[0].shape))
    return LayerCost(name=name, op=label, flops=sum(c.flops for c in costs),
                     input_bytes=sum(c.input_bytes for c in costs), output_bytes=sum(c.output_bytes for c in costs),
                     weight_bytes=sum(c.weight_bytes for c in costs), shape=shape)


# --- tracers: which operators make a layer, and its name --------------------------------------------------------


def _run_fx(graph_module: torch.fx.GraphModule, image: torch.Tensor, recording: _Recording) -> Any:
    class LayerInterpreter(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> Any:
            if node.op not in ("call_module", "call_function", "call_method"):
                return super().run_node(node)
            args, kwargs = self.fetch_args_kwargs_from_env(node)
            if node.op == "call_module":
                submodule = self.fetch_attr(node.target)
                recording.open(node.target, _module_label(submodule), type(submodule).__name__)
            elif node.op == "call_function":
                recording.open(node.name, _function_label(node.target), _qualified_name(node.target))
            else:
                recording.open(node.name, _function_label(node.target), f"Tensor.{node.target}")
            result = super().run_node(node)
            recording.close((args, kwargs), result, passthrough=node.target is not operator.getitem)
            return result

    return LayerInterpreter(graph_module).run(image)


def _run_hooks(module: nn.Module, image: torch.Tensor, recording: _Recording) -> Any:
    stack: list[str] = []
    opened_by: list[int] = []  # the leaf module whose layer is open
    paths = {id(m): path for path, m in module.named_modules()}
    leaves = {id(m) for m in module.modules() if next(m.children(), None) is None}

    def before(m: nn.Module, args: tuple) -> None:
        path = paths.get(id(m), "")
        stack.append(path)
        if id(m) in leaves and recording.group is None:
            opened_by.append(id(m))
            label = _module_label(m)
            recording.open(path or label, label, type(m).__name__)

    def after(m: nn.Module, args: tuple, output: Any) -> None:
        stack.pop()
        if opened_by and opened_by[-1] == id(m):
            opened_by.pop()
            recording.close(args, output)

    recording.loose_prefix = lambda: next((p for p in reversed(stack) if p), "")
    handles = []
    try:
        for m in module.modules():
            handles.append(m.register_forward_pre_hook(before))
            handles.append(m.register_forward_hook(after))
        return module(image)
    finally:
        for handle in handles:
            handle.remove()


def _run_dispatch(module: nn.Module, image: torch.Tensor, recording: _Recording) -> Any:
    return module(image)


_RUN_METHODS = {_run_fx: "fx", _run_hooks: "hooks", _run_dispatch: "dispatch"}


# --- labels ----------------------------------------------------------------------------------------------------

# Class names whose snake_case is not the operator's usual name.
_MODULE_LABELS = {"ReLU": "relu", "ReLU6": "relu6", "SiLU": "silu", "GELU": "gelu", "PReLU": "prelu", "ELU": "elu",
                  "SELU": "selu", "CELU": "celu", "RReLU": "rrelu", "GLU": "glu", "LeakyReLU": "leaky_relu",
                  "SyncBatchNorm": "batch_norm", "MultiheadAttention": "multihead_attention"}
_FUNCTION_LABELS = {"truediv": "div", "iadd": "add", "isub": "sub", "imul": "mul",
                    "itruediv": "div"}


def _module_label(module: nn.Module) -> str:
    """nn.Conv2d -> conv2d, nn.BatchNorm2d -> batch_norm, nn.AdaptiveAvgPool2d -> adaptive_avg_pool2d, ..."""
    name = type(module).__name__
    if name in _MODULE_LABELS:
        return _MODULE_LABELS[name]
    label = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()
    # batch_norm2d -> batch_norm, dropout2d -> dropout: the dimensions are in the shape
    return re.sub(r"^(batch_norm|instance_norm|dropout|feature_alpha_dropout|alpha_dropout)[123]d$", r"\1", label)


def _function_label(target: Any) -> str:
    """operator.add / torch.add / Tensor.add_ -> add, F.relu -> relu, torch._C._nn.avg_pool2d -> avg_pool2d."""
    name = target if isinstance(target, str) else getattr(target, "__name__", str(target))
    name = name.strip("_") if name.startswith("__") else name.rstrip("_")
    return _FUNCTION_LABELS.get(name, name)


def _aten_label(func: Any) -> str:
    packet = getattr(func, "overloadpacket", None)
    return packet.__name__.lstrip("_") if packet is not None else "unknown"


def _qualified_name(target: Any) -> str:
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None) or repr(target)
    return f"{module.lstrip('_')}.{name}" if module else name

