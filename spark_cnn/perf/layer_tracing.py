"""Which operators of a forward make a layer, and its name: the tracers behind `spark_cnn.perf.layers.analyse`.

A `Recording` (a TorchDispatchMode) sees every ATen call of one forward on one image, costs it with
`spark_cnn.perf.op_costs` into the open layer and tracks activation storages for the peak of live memory.
The tracer decides the layers:

- "fx": `torch.fx.symbolic_trace`; one layer per graph node, i.e. per leaf-module call (named by its path,
  `features.3.block.0.0`) or functional op (named by its node, `add_3`). Used whenever the module traces.
- "hooks": for modules fx cannot trace: forward hooks make one layer per leaf-module call, named by its path;
  each operator run outside a leaf module becomes its own layer, named by the module that ran it (a residual
  add in `layer1.0` is `layer1.0.add`).
- "dispatch": TorchScript modules, which take no hooks: one layer per operator, named by its kind.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from spark_cnn.errors import ModelError
from spark_cnn.models.tracing import FX_GATE
from spark_cnn.perf.op_costs import OpCost, op_cost

__all__ = ["Recording", "TracedLayer", "itemsize_of", "trace"]


@dataclass(frozen=True)
class TracedLayer:
    """One layer as traced: its unique name, its kind, the costs of its operators, and the shapes (batch 1) of
    its largest activation input and its first activation output (None when it had none)."""

    name: str
    label: str
    costs: tuple[OpCost, ...]
    in_shape: tuple[int, ...] | None
    out_shape: tuple[int, ...] | None


def trace(module: nn.Module, image: torch.Tensor, dtype_bytes: int) -> tuple[Recording, tuple[str, ...]]:
    """The recording of one forward of `module` (already in eval mode, under no_grad) on `image`, with the
    tracer that fits it, and notes saying why a fallback tracer was used. ModelError when the forward fails."""
    if isinstance(module, torch.jit.ScriptModule):
        return _record(_run_dispatch, module, image, dtype_bytes, name=type(module).__name__), ()
    return _trace_fx_or_hooks(module, image, dtype_bytes)


def itemsize_of(dtype_bytes: int) -> Callable[[torch.Tensor], int]:
    def itemsize(tensor: torch.Tensor) -> int:
        if tensor.is_floating_point():
            return dtype_bytes
        if tensor.is_complex():
            return 2 * dtype_bytes
        return tensor.element_size()
    return itemsize


def _trace_fx_or_hooks(module: nn.Module, image: torch.Tensor, dtype_bytes: int) -> tuple[Recording, tuple]:
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


def _record(run: Callable[[nn.Module, torch.Tensor, Recording], Any], module: nn.Module, image: torch.Tensor,
            dtype_bytes: int, *, name: str) -> Recording:
    recording = Recording(dtype_bytes, method=_RUN_METHODS[run])
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


class Recording(TorchDispatchMode):
    """Sees every ATen call of one forward: costs it into the open layer and tracks activation storages.

    A tensor is an activation when its storage was produced by an operator that read an activation (the input
    image is the first); everything else (parameters, buffers, what is computed from them) is a weight.
    """

    def __init__(self, dtype_bytes: int, method: str):
        super().__init__()
        self.method = method
        self.itemsize = itemsize_of(dtype_bytes)
        self.layers: list[TracedLayer] = []
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
            in_shape = tuple(max(ins, key=lambda t: t.numel()).shape) if ins else None  # not a broadcast scale
            out_shape = tuple(outs[0].shape) if outs else None
            self.layers.append(TracedLayer(self._unique(group.name), group.label, tuple(group.costs), in_shape,
                                           out_shape))

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


# --- tracers: which operators make a layer, and its name --------------------------------------------------------


def _run_fx(graph_module: torch.fx.GraphModule, image: torch.Tensor, recording: Recording) -> Any:
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


def _run_hooks(module: nn.Module, image: torch.Tensor, recording: Recording) -> Any:
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


def _run_dispatch(module: nn.Module, image: torch.Tensor, recording: Recording) -> Any:
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
