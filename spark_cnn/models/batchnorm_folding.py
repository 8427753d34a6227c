"""Fold each BatchNorm that only ever follows one convolution into that convolution (inference models only).

In eval mode a BatchNorm is a fixed per-channel affine map, y = (x - mean) * gamma / sqrt(var + eps) + beta;
applied to the convolution's weights and bias instead, it gives the same output with one pass over the
activations fewer. On the 2-core host BatchNorm was 19% of a mobilenet_v3_small sidecar's samples (py-spy,
docs/benchmarks.md). The model is edited in place: the convolution takes the new weights and the BatchNorm
becomes an `nn.Identity`, so module names (an embedding layer, a hook) stay where they were.

Pairs come from the model's fx graph: a convolution each of whose calls feeds one BatchNorm and nothing else,
and a BatchNorm that only that convolution feeds (ResNet's `conv1` -> `bn1` in its forward). A model fx cannot
trace (control flow on values, as detectors have) folds the pairs its `nn.Sequential` chains show, where each
child's output is the next one's only input. Tracing holds FX_GATE, as every trace in a sidecar does.
"""

from __future__ import annotations

import itertools
import logging

import torch
from torch import nn

from spark_cnn.models.tracing import FX_GATE

log = logging.getLogger(__name__)


def fold_batchnorms(module: nn.Module) -> int:
    """Fold every foldable (convolution, BatchNorm) pair of eval-mode `module` in place; how many were folded.

    >>> torch.manual_seed(0) is not None
    True
    >>> net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).eval()
    >>> net[1].running_mean.uniform_(-1, 1) is not None and net[1].running_var.uniform_(0.5, 2) is not None
    True
    >>> x = torch.randn(2, 3, 8, 8)
    >>> before = net(x)
    >>> fold_batchnorms(net), type(net[1]).__name__, torch.allclose(net(x), before, atol=1e-5)
    (1, 'Identity', True)
    """
    if module.training:
        raise ValueError("fold_batchnorms: the module is in training mode; fold only a model in eval mode")
    modules = dict(module.named_modules())
    folded = 0
    for conv_name, bn_name in _pairs(module, modules):
        _fold(modules[conv_name], modules[bn_name])
        _replace(module, bn_name, nn.Identity())
        folded += 1
    return folded


def _foldable(conv: nn.Module, bn: nn.Module) -> bool:
    return (type(conv) in (nn.Conv1d, nn.Conv2d, nn.Conv3d) and type(bn) in (nn.BatchNorm1d, nn.BatchNorm2d,
                                                                               nn.BatchNorm3d)
            and bn.track_running_stats and bn.running_mean is not None and bn.running_var is not None
            and bn.num_features == conv.out_channels and conv.weight.dtype.is_floating_point)


def _pairs(module: nn.Module, modules: dict[str, nn.Module]) -> list[tuple[str, str]]:
    """(conv name, BatchNorm name) pairs to fold, each module registered once (a shared one is left alone)."""
    counts: dict[int, int] = {}
    for _, child in module.named_modules(remove_duplicate=False):
        counts[id(child)] = counts.get(id(child), 0) + 1
    try:
        pairs = _traced_pairs(module, modules)
    except Exception as e:  # untraceable: the Sequential chains are still safe to read
        log.debug("fold_batchnorms: fx could not trace %s (%s); folding nn.Sequential chains only",
                  type(module).__name__, type(e).__name__)
        pairs = _sequential_pairs(module)
    return [(c, b) for c, b in pairs if counts[id(modules[c])] == 1 and counts[id(modules[b])] == 1
            and _foldable(modules[c], modules[b])]


def _traced_pairs(module: nn.Module, modules: dict[str, nn.Module]) -> list[tuple[str, str]]:
    from torch import fx

    with FX_GATE.tracing():
        graph = fx.symbolic_trace(module).graph
    feeds: dict[str, set] = {}    # BatchNorm name -> what feeds its calls (a conv name, or None for anything else)
    follows: dict[str, set] = {}  # conv name -> what its calls feed (a BatchNorm name, or None)
    for node in graph.nodes:
        if node.op != "call_module":
            continue
        target = modules.get(node.target)
        if isinstance(target, nn.modules.batchnorm._BatchNorm):
            source = node.args[0] if node.args else None
            conv = (source.target if isinstance(source, fx.Node) and source.op == "call_module"
                    and isinstance(modules.get(source.target), nn.modules.conv._ConvNd) else None)
            feeds.setdefault(node.target, set()).add(conv)
        elif isinstance(target, nn.modules.conv._ConvNd):
            users = list(node.users)
            only = users[0] if len(users) == 1 else None
            follows.setdefault(node.target, set()).add(
                only.target if only is not None and only.op == "call_module"
                and isinstance(modules.get(only.target), nn.modules.batchnorm._BatchNorm)
                and only.args and only.args[0] is node else None)
    return [(conv, bn) for bn, sources in feeds.items() if len(sources) == 1 and (conv := next(iter(sources)))
            and follows.get(conv) == {bn}]


def _sequential_pairs(module: nn.Module) -> list[tuple[str, str]]:
    pairs = []
    for name, child in module.named_modules():
        if type(child) is not nn.Sequential:  # a subclass may have its own forward
            continue
        items = list(child.named_children())
        prefix = f"{name}." if name else ""
        for (conv_name, conv), (bn_name, bn) in itertools.pairwise(items):
            if isinstance(conv, nn.modules.conv._ConvNd) and isinstance(bn, nn.modules.batchnorm._BatchNorm):
                pairs.append((prefix + conv_name, prefix + bn_name))
    return pairs


@torch.no_grad()
def _fold(conv: nn.Module, bn: nn.Module) -> None:
    scale = torch.rsqrt(bn.running_var.double() + bn.eps)
    if bn.weight is not None:
        scale = scale * bn.weight.double()
    shift = -bn.running_mean.double() * scale
    if bn.bias is not None:
        shift = shift + bn.bias.double()
    bias = conv.bias.double() * scale + shift if conv.bias is not None else shift
    shape = (-1,) + (1,) * (conv.weight.dim() - 1)
    conv.weight.copy_((conv.weight.double() * scale.reshape(shape)).to(conv.weight.dtype))
    conv.bias = nn.Parameter(bias.to(conv.weight.dtype), requires_grad=conv.weight.requires_grad)


def _replace(root: nn.Module, name: str, new: nn.Module) -> None:
    parent_name, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent_name) if parent_name else root, child, new)
