"""Cost rules for single ATen operators: the FLOPs and bytes of one call, from the shapes of its tensors.

Every tracer in `spark_cnn.perf.layers` ends in the same place: the ATen operators a forward pass dispatches
(`aten.convolution`, `aten.addmm`, `aten.relu_`, ...). Costing them here, rather than nn.Module classes or
Python functions, gives one rule per operator whatever the module, functional call or TorchScript graph that
issued it, with every argument (stride, groups, kernel) explicit in the operator's schema.

The counts are of useful work, not of what a given kernel executes: a convolution is its multiply-adds
whatever algorithm runs it (im2col, Winograd, FFT), a view moves nothing, the indices max-pooling returns
beside its values and the statistics normalisation returns beside its output are not counted as output.

FLOPs per call (a multiply-add counts 2; one arithmetic operation, comparison-and-select, or call of a
transcendental function such as exp, erf or tanh counts 1):

| kind | FLOPs |
| --- | --- |
| conv{1,2,3}d | 2 * out_numel * (in_ch / groups) * prod(kernel), + out_numel with a bias |
| conv_transpose{1,2,3}d | 2 * in_numel * (out_ch / groups) * prod(kernel), + out_numel with a bias |
| linear (a matmul with a weight operand) | 2 * rows * in_features * out_features, + rows * out_features with a bias |
| matmul, bmm (two activations) | 2 * out_numel * k, + out_numel when a bias is added (baddbmm) |
| batch_norm (eval: running statistics) | 2 * numel: scale and shift, folded per channel |
| batch_norm (batch statistics), layer_norm, group_norm | 5 * numel (NORM_STATS_FLOPS), + 2 * numel with an affine |
| unary elementwise | UNARY_FLOPS[kind] * numel (table below) |
| binary elementwise (add, sub, mul, div, ...) | out_numel |
| max_pool, adaptive_max_pool | out_numel * (window - 1) comparisons; adaptive: in_numel |
| avg_pool | out_numel * (window + 1): each window element summed, one divide per output |
| adaptive_avg_pool, mean | in_numel + out_numel: each input summed once, one divide per output |
| sum, amax, amin, argmax; var, std | in_numel; 4 * in_numel + out_numel (REDUCTIONS) |
| index, index_select, gather | 0; reads what it writes |
| softmax, log_softmax | 5 * numel: max, subtract, exp, sum, divide |
| upsample | nearest 0; linear 3, bilinear 9, trilinear 21, bicubic 32 per output element (3 per lerp) |
| attention | the four projections and the two batched matmuls as matmuls, + 5 per attention score (softmax) |
| cat, stack, pad, copy, fill, item (a read to the host) | 0 (bytes only); alloc (empty_like): 0, and 0 bytes |
| view, permute, transpose, split, expand, ... | 0, and 0 bytes: no data moves |

Bytes: every tensor input that holds activations (`is_activation`) is read once, every output counted is
written once; other tensor inputs (parameters, buffers and what is computed from them alone) are weights.
Element sizes come from `itemsize`, so the caller chooses the precision that is being modelled.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

aten = torch.ops.aten

# FLOPs per element of unary elementwise operators, counted as in the module docstring.
UNARY_FLOPS = {
    "relu": 1,              # max(x, 0)
    "hardtanh": 2,          # min(max(x, lo), hi); relu6 is hardtanh(0, 6)
    "relu6": 2,
    "clamp": 2,
    "clamp_min": 1,
    "clamp_max": 1,
    "leaky_relu": 2,        # compare-select, multiply
    "elu": 4,               # compare-select, exp, subtract, multiply
    "hardsigmoid": 4,       # relu6(x + 3) / 6: add, max, min, divide
    "hardswish": 5,         # x * hardsigmoid(x)
    "sigmoid": 4,           # 1 / (1 + exp(-x)): negate, exp, add, divide
    "silu": 5,              # x * sigmoid(x)
    "softplus": 3,          # log(1 + exp(x))
    "mish": 5,              # x * tanh(softplus(x))
    "gelu": 5,              # 0.5 * x * (1 + erf(x / sqrt 2)); the tanh approximation: GELU_TANH_FLOPS
    "tanh": 1,
    "exp": 1,
    "log": 1,
    "sqrt": 1,
    "rsqrt": 1,
    "reciprocal": 1,
    "erf": 1,
    "abs": 1,
    "neg": 1,
    "pow": 1,               # with a scalar exponent
    "square": 1,
}
GELU_TANH_FLOPS = 9         # 0.5 * x * (1 + tanh(c * (x + 0.044715 * x^3))): 8 arithmetic operations + tanh
BINARY_OPS = ("add", "sub", "rsub", "mul", "div", "maximum", "minimum", "where", "masked_fill", "remainder",
              "fmod", "eq", "ne", "lt", "le", "gt", "ge")
# FLOPs per input element of reductions; mean, var and std also divide once per output element.
REDUCTIONS = {"sum": 1, "mean": 1, "amax": 1, "amin": 1, "argmax": 1, "argmin": 1, "prod": 1, "logsumexp": 3,
              "linalg_vector_norm": 2, "var": 4, "std": 4, "var_mean": 4, "std_mean": 4}  # var: sum, sub, square, sum
# Normalisation: sum and sum of squares (3 per element), subtract the mean and multiply by 1/std (2).
NORM_STATS_FLOPS = 5
NORM_AFFINE_FLOPS = 2       # the scale and shift of an affine normalisation
SOFTMAX_FLOPS = 5           # max, subtract, exp, sum, divide
LERP_FLOPS = 3              # a + (b - a) * t
UPSAMPLE_FLOPS = {"nearest": 0, "linear": LERP_FLOPS, "bilinear": 3 * LERP_FLOPS, "trilinear": 7 * LERP_FLOPS,
                  "bicubic": 32}  # bicubic: 16 taps, a multiply-add each
UPSAMPLE_MODES = {"upsample_nearest1d": "nearest", "upsample_nearest2d": "nearest", "upsample_nearest3d": "nearest",
                  "_upsample_nearest_exact1d": "nearest", "_upsample_nearest_exact2d": "nearest",
                  "_upsample_nearest_exact3d": "nearest", "upsample_linear1d": "linear",
                  "upsample_bilinear2d": "bilinear", "upsample_trilinear3d": "trilinear",
                  "upsample_bicubic2d": "bicubic"}

VIEW_OPS = ("view", "_unsafe_view", "_reshape_alias", "t", "transpose", "permute", "expand", "squeeze", "unsqueeze",
            "slice", "select", "split", "split_with_sizes", "unbind", "narrow", "alias", "detach", "as_strided",
            "as_strided_", "unfold", "view_as_real", "view_as_complex", "lift_fresh", "diagonal", "squeeze_",
            "unsqueeze_", "t_", "transpose_")
COPY_OPS = {"clone": "copy", "_to_copy": "copy", "copy_": "copy", "contiguous": "copy", "cat": "cat",
            "stack": "cat", "constant_pad_nd": "pad", "reflection_pad1d": "pad", "reflection_pad2d": "pad",
            "reflection_pad3d": "pad", "replication_pad1d": "pad", "replication_pad2d": "pad",
            "replication_pad3d": "pad", "flip": "copy", "roll": "copy", "repeat": "copy",
            "pixel_shuffle": "copy", "pixel_unshuffle": "copy", "channel_shuffle": "copy", "zeros_like": "fill",
            "ones_like": "fill", "full_like": "fill", "fill": "fill", "zero_": "fill", "fill_": "fill",
            "new_zeros": "fill", "new_ones": "fill", "new_full": "fill", "empty_like": "alloc", "new_empty": "alloc"}


@dataclass(frozen=True)
class OpCost:
    """The cost of one operator call at the batch size it ran with (the analyser runs batch 1)."""

    kind: str
    flops: int
    input_bytes: int
    output_bytes: int
    weight_bytes: int
    shape: dict[str, Any] = field(default_factory=dict, hash=False)


class OpCall:
    """One dispatched call: its arguments by schema name, and its tensors sorted into activations and weights."""

    def __init__(self, func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any, *,
                 is_activation: Callable[[torch.Tensor], bool], itemsize: Callable[[torch.Tensor], int]):
        self.func, self.args, self.kwargs = func, args, kwargs
        self.name = func.overloadpacket.__name__
        inputs = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        self.acts = [t for t in inputs if is_activation(t)]
        self.weights = [t for t in inputs if not is_activation(t)]
        self._act_ids = {id(t) for t in self.acts}
        self.outs = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
        self.itemsize = itemsize

    def arg(self, name: str) -> Any:
        """The argument called `name` in the operator's schema, positional, keyword or default."""
        for index, argument in enumerate(self.func._schema.arguments):
            if argument.name == name:
                if index < len(self.args):
                    return self.args[index]
                return self.kwargs.get(name, argument.default_value)
        raise KeyError(f"{self.func} has no argument {name!r}")

    def is_act(self, tensor: Any) -> bool:
        return id(tensor) in self._act_ids

    def nbytes(self, tensors: Sequence[torch.Tensor | None]) -> int:
        return sum(t.numel() * self.itemsize(t) for t in tensors if t is not None)

    def cost(self, kind: str, flops: float, shape: dict | None = None, *, reads: Sequence | None = None,
             writes: Sequence | None = None) -> OpCost:
        """OpCost with activation reads (default: all activation inputs) and writes (default: all outputs)."""
        return OpCost(kind=kind, flops=int(flops), input_bytes=self.nbytes(self.acts if reads is None else reads),
                      output_bytes=self.nbytes(self.outs if writes is None else writes),
                      weight_bytes=self.nbytes(self.weights), shape=shape or {})


def op_cost(func: torch._ops.OpOverload, args: tuple, kwargs: dict, out: Any, *,
            is_activation: Callable[[torch.Tensor], bool], itemsize: Callable[[torch.Tensor], int]) -> OpCost | None:
    """The cost of one ATen call, or None when no rule knows the operator (the caller lists it as uncosted).

    >>> x, w = torch.zeros(1, 3, 8, 8), torch.zeros(4, 3, 3, 3)
    >>> y = torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    >>> c = op_cost(torch.ops.aten.convolution.default, (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1), {},
    ...             y, is_activation=lambda t: t is x, itemsize=lambda t: 4)
    >>> (c.kind, c.flops, c.weight_bytes)
    ('conv2d', 13824, 432)
    """
    rule = _RULES.get(func.overloadpacket)
    if rule is None:
        return None
    return rule(OpCall(func, args, kwargs, out, is_activation=is_activation, itemsize=itemsize))


# --- rules -----------------------------------------------------------------------------------------------------


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def _spatial(value: Any, dims: int) -> tuple[int, ...]:
    """A kernel/stride/padding argument (an int, or a list of 1 or `dims` ints) as a `dims`-tuple."""
    if isinstance(value, int):
        return (value,) * dims
    values = tuple(int(v) for v in value)
    return values * dims if len(values) == 1 else values


def _unary(kind: str, per_element: int) -> Callable[[OpCall], OpCost]:
    def rule(c: OpCall) -> OpCost:
        flops = per_element
        if kind == "gelu" and c.arg("approximate") == "tanh":
            flops = GELU_TANH_FLOPS
        numel = c.outs[0].numel()
        return c.cost(kind, flops * numel, {"numel": numel})
    return rule


def _binary(kind: str) -> Callable[[OpCall], OpCost]:
    def rule(c: OpCall) -> OpCost:
        numel = c.outs[0].numel()
        return c.cost(kind, numel, {"numel": numel})
    return rule


def _reduction(kind: str, per_element: int) -> Callable[[OpCall], OpCost]:
    def rule(c: OpCall) -> OpCost:
        x, y = c.acts[0], c.outs[0]
        flops = per_element * x.numel() + (y.numel() if kind in ("mean", "var", "std", "var_mean", "std_mean") else 0)
        return c.cost(kind, flops, {"in_shape": tuple(x.shape), "out_shape": tuple(y.shape), "numel": x.numel()})
    return rule


def _gather(c: OpCall) -> OpCost:
    # Reads the elements it writes (and the indices, when they are activations), wherever they lie in the input.
    indices = [t for t in c.acts[1:] if not t.is_floating_point()]
    return c.cost("gather", 0, {"numel": c.outs[0].numel()}, reads=[*c.outs, *indices])


def _max_min(c: OpCall) -> OpCost:
    if c.func._overloadname == "other":  # torch.max(a, b): elementwise
        return _binary(c.name)(c)
    x, y = c.arg("self"), c.outs[0]
    return c.cost(c.name, x.numel(), {"in_shape": tuple(x.shape), "out_shape": tuple(y.shape), "numel": x.numel()},
                  writes=c.outs[:1])  # values; indices are not useful work


def _item(c: OpCall) -> OpCost:
    return c.cost("item", 0, {"numel": c.acts[0].numel()})  # a host read: `if x.sum() > 0`, `x.item()`


def _view(c: OpCall) -> OpCost:
    return c.cost("view", 0, reads=(), writes=())


def _copy(kind: str) -> Callable[[OpCall], OpCost]:
    def rule(c: OpCall) -> OpCost:
        reads = c.acts
        if c.name == "copy_":  # the destination is overwritten, not read
            reads = [c.arg("src")] if c.is_act(c.arg("src")) else []
        elif kind in ("fill", "alloc"):  # the input only gives the shape, dtype or device
            reads = []
        writes = [] if kind == "alloc" else c.outs
        return c.cost(kind, 0, {"numel": c.outs[0].numel(), "inputs": len(reads)}, reads=reads, writes=writes)
    return rule


def _convolution(c: OpCall) -> OpCost:
    x, w, bias, y = c.arg("input"), c.arg("weight"), c.arg("bias"), c.outs[0]
    transposed, dims = bool(c.arg("transposed")), w.dim() - 2
    # w is (out, in/groups, *k), or (in, out/groups, *k) when transposed: each output (or input) element
    # meets prod(w.shape[1:]) weights.
    macs = (x.numel() if transposed else y.numel()) * _numel(w.shape[1:])
    flops = 2 * macs + (y.numel() if bias is not None else 0)
    kind = f"conv_transpose{dims}d" if transposed else f"conv{dims}d"
    return c.cost(kind, flops, {
        "in_channels": x.shape[1], "out_channels": y.shape[1], "kernel": tuple(w.shape[2:]),
        "stride": _spatial(c.arg("stride"), dims), "padding": _spatial(c.arg("padding"), dims),
        "dilation": _spatial(c.arg("dilation"), dims), "groups": int(c.arg("groups")),
        "in_hw": tuple(x.shape[2:]), "out_hw": tuple(y.shape[2:]), "bias": bias is not None, "macs": macs,
        **({"nchw": True} if _nchw(x) else {})})


def _nchw(x: torch.Tensor) -> bool:
    """Whether a 4-D activation is laid out NCHW where channels-last was possible: the layout a model's own
    `.contiguous()` leaves (shufflenet's channel shuffle), on which depthwise convolutions run 2 to 3 times
    their channels-last time (docs/perf-model.md, "The zoo on a quiet host")."""
    return (x.dim() == 4 and x.shape[1] > 1 and x.shape[2] * x.shape[3] > 1
            and not x.is_contiguous(memory_format=torch.channels_last))


def _matmul(c: OpCall, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> OpCost:
    y = c.outs[0]
    k = a.shape[-1]
    macs = y.numel() * k
    flops = 2 * macs + (y.numel() if bias is not None else 0)
    if not c.is_act(b) and b.dim() == 2:  # activation x weight: a linear layer
        return c.cost("linear", flops, {"in_features": k, "out_features": b.shape[1], "rows": y.numel() // b.shape[1],
                                        "bias": bias is not None, "macs": macs})
    return c.cost("matmul", flops, {"m": a.shape[-2], "k": k, "n": b.shape[-1],
                                    "batch": _numel(y.shape[:-2]), "bias": bias is not None, "macs": macs})


def _mm(c: OpCall) -> OpCost:  # mm and bmm
    return _matmul(c, c.arg("self"), c.arg("mat2"), None)


def _addmm(c: OpCall) -> OpCost:
    mats = ("mat1", "mat2") if c.name == "addmm" else ("batch1", "batch2")
    return _matmul(c, c.arg(mats[0]), c.arg(mats[1]), c.arg("self"))


def _batch_norm(c: OpCall) -> OpCost:
    x = c.arg("input")
    training = c.name != "_native_batch_norm_legit_no_training" and bool(c.arg("training"))
    per_element = NORM_STATS_FLOPS + NORM_AFFINE_FLOPS if training else 2
    return c.cost("batch_norm", per_element * x.numel(), {"channels": x.shape[1], "numel": x.numel(),
                                                          "batch_statistics": training}, writes=c.outs[:1])


def _norm(kind: str) -> Callable[[OpCall], OpCost]:
    def rule(c: OpCall) -> OpCost:
        x = c.arg("input")
        affine = c.arg("weight") is not None
        flops = (NORM_STATS_FLOPS + (NORM_AFFINE_FLOPS if affine else 0)) * x.numel()
        return c.cost(kind, flops, {"numel": x.numel(), "in_shape": tuple(x.shape), "affine": affine},
                      writes=c.outs[:1])
    return rule


def _max_pool(c: OpCall) -> OpCost:
    x, y = c.arg("self"), c.outs[0]
    dims = int(c.name[len("max_pool")])
    kernel = _spatial(c.arg("kernel_size"), dims)
    stride = _spatial(c.arg("stride"), dims) if c.arg("stride") else kernel
    window = _numel(kernel)
    return c.cost(f"max_pool{dims}d", y.numel() * (window - 1), {
        "kernel": kernel, "stride": stride, "padding": _spatial(c.arg("padding"), dims),
        "channels": x.shape[-dims - 1], "in_hw": tuple(x.shape[-dims:]), "out_hw": tuple(y.shape[-dims:])},
        writes=c.outs[:1])  # values only: the indices are not useful work in inference


def _avg_pool(c: OpCall) -> OpCost:
    x, y = c.arg("self"), c.outs[0]
    dims = int(c.name[len("avg_pool")])
    kernel = _spatial(c.arg("kernel_size"), dims)
    stride = _spatial(c.arg("stride"), dims) if c.arg("stride") else kernel
    return c.cost(f"avg_pool{dims}d", y.numel() * (_numel(kernel) + 1), {
        "kernel": kernel, "stride": stride, "padding": _spatial(c.arg("padding"), dims),
        "channels": x.shape[-dims - 1], "in_hw": tuple(x.shape[-dims:]), "out_hw": tuple(y.shape[-dims:])})


def _adaptive_pool(c: OpCall) -> OpCost:
    x, y = c.arg("self"), c.outs[0]
    kind = c.name.lstrip("_")  # adaptive_avg_pool2d, adaptive_max_pool3d, ...
    dims = int(kind[-2])
    flops = x.numel() + (y.numel() if "avg" in kind else 0)
    return c.cost(kind, flops, {"channels": x.shape[-dims - 1], "in_hw": tuple(x.shape[-dims:]),
                                "out_hw": tuple(y.shape[-dims:])}, writes=c.outs[:1])


def _softmax(c: OpCall) -> OpCost:
    numel = c.outs[0].numel()
    return c.cost(c.name.lstrip("_"), SOFTMAX_FLOPS * numel, {"numel": numel, "dim": int(c.arg("dim"))})


def _upsample(mode: str) -> Callable[[OpCall], OpCost]:
    def rule(c: OpCall) -> OpCost:
        x, y = c.acts[0], c.outs[0]
        return c.cost(f"upsample_{mode}", UPSAMPLE_FLOPS[mode] * y.numel(),
                      {"mode": mode, "in_hw": tuple(x.shape[2:]), "out_hw": tuple(y.shape[2:]), "numel": y.numel()})
    return rule


def _attention_cost(c: OpCall, batch: int, heads: int, length: int, source: int, head_dim: int, value_dim: int,
                    projections_macs: int, writes: Sequence) -> OpCost:
    scores = batch * heads * length * source
    macs = scores * (head_dim + value_dim) + projections_macs
    return c.cost("attention", 2 * macs + SOFTMAX_FLOPS * scores, {
        "heads": heads, "length": length, "source_length": source, "head_dim": head_dim, "macs": macs},
        writes=writes)


def _sdpa(c: OpCall) -> OpCost:
    q, k, v = c.arg("query"), c.arg("key"), c.arg("value")  # (batch, heads, length, head_dim)
    return _attention_cost(c, _numel(q.shape[:-3]), q.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1], v.shape[-1],
                           0, c.outs[:1])


def _native_mha(c: OpCall) -> OpCost:
    q, k = c.arg("query"), c.arg("key")  # (batch, length, embed)
    embed, heads = int(c.arg("embed_dim")), int(c.arg("num_head"))
    length, source = q.shape[-2], k.shape[-2]
    batch = _numel(q.shape[:-2])
    projections = batch * embed * embed * (2 * length + 2 * source)  # q, k, v and output projections
    cost = _attention_cost(c, batch, heads, length, source, embed // heads, embed // heads, projections, c.outs[:1])
    biases = batch * embed * (2 * length + 2 * source) if c.arg("qkv_bias") is not None else 0
    return OpCost(cost.kind, cost.flops + biases, cost.input_bytes, cost.output_bytes, cost.weight_bytes,
                  {**cost.shape, "embed_dim": embed})


def _build_rules() -> dict[Any, Callable[[OpCall], OpCost]]:
    rules: dict[Any, Callable[[OpCall], OpCost]] = {}

    def add(names: Sequence[str], rule: Callable[[OpCall], OpCost], *, inplace: bool = False) -> None:
        for name in names:
            for variant in (name, name + "_") if inplace else (name,):
                packet = getattr(aten, variant, None)
                if packet is not None:
                    rules[packet] = rule

    for kind, per_element in UNARY_FLOPS.items():
        add([kind], _unary(kind, per_element), inplace=True)
    for kind in BINARY_OPS:
        add([kind], _binary(kind), inplace=True)
    for kind, per_element in REDUCTIONS.items():
        add([kind], _reduction(kind, per_element))
    add(["index", "index_select", "gather", "take_along_dim"], _gather)
    add(["max", "min"], _max_min)
    add(VIEW_OPS, _view)
    add(["_local_scalar_dense"], _item)
    for name, kind in COPY_OPS.items():
        add([name], _copy(kind))
    add(["convolution", "_convolution"], _convolution)
    add(["mm", "bmm"], _mm)
    add(["addmm", "baddbmm"], _addmm)
    add(["native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training",
         "cudnn_batch_norm", "miopen_batch_norm"], _batch_norm)
    add(["native_layer_norm"], _norm("layer_norm"))
    add(["native_group_norm"], _norm("group_norm"))
    add(["max_pool1d", "max_pool2d", "max_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices"], _max_pool)
    add(["avg_pool1d", "avg_pool2d", "avg_pool3d"], _avg_pool)
    add(["_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_max_pool2d", "adaptive_max_pool3d",
         "adaptive_avg_pool1d", "adaptive_max_pool1d"], _adaptive_pool)
    add(["_softmax", "_log_softmax"], _softmax)
    for name, mode in UPSAMPLE_MODES.items():
        add([name], _upsample(mode))
    add(["_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
         "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"], _sdpa)
    add(["_native_multi_head_attention"], _native_mha)
    return rules


_RULES = _build_rules()
