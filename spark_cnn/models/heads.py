"""Turn a model's output into the job's outputs: a classifier's top-1, top-k, and optionally logits and
embeddings; or any one tensor as it is (`--output raw`)."""

from __future__ import annotations

import torch
from torch import nn

from spark_cnn.errors import ModelError


class Predictor:
    """Wraps a classification module; `predict(images)` returns a dict of tensors with one row per image.

    Keys: label (int64), score (softmax probability of the label), topk_label, topk_score (N x k), and
    logits (N x classes) / embedding (N x features) when asked. The embedding is the input of the last Linear
    layer, or with `embedding_layer` the output of that named module (`model.named_modules()` names, e.g.
    `layer4` of a ResNet), averaged over its spatial positions when it has any, then flattened.

    With `raw` the module may return any one tensor with the batch first, (N, ...): `predict` returns it
    alone as float32 under the key `raw`, and no head runs.
    """

    def __init__(self, module: nn.Module, *, top_k: int, logits: bool = False, embeddings: bool = False,
                 embedding_layer: str | None = None, raw: bool = False):
        self.module = module
        self.raw = raw
        self.top_k = top_k
        self.want_logits = logits
        self._features: list[torch.Tensor] = []
        if embeddings and embedding_layer:
            named_module(module, embedding_layer).register_forward_hook(
                lambda _m, _inputs, out: self._features.append(pool_spatial(_as_tensor(out, embedding_layer))))
        elif embeddings:
            last_linear = _last_linear(module)
            last_linear.register_forward_hook(lambda _m, inputs, _out: self._features.append(inputs[0]))
        self.want_embeddings = embeddings

    def predict(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        self._features.clear()
        if self.raw:
            return {"raw": raw_output(self.module(images), len(images))}
        logits = _as_logits(self.module(images)).float()
        if logits.dim() != 2:
            raise ModelError(f"the model returned outputs of shape {tuple(logits.shape)}; a classifier returns "
                             f"logits of shape (batch, classes): for any other tensor use --output raw "
                             f"(cnn_udf output='raw')")
        probs = torch.softmax(logits, dim=1)
        top = probs.topk(self.top_k, dim=1)
        out = {"label": top.indices[:, 0], "score": top.values[:, 0],
               "topk_label": top.indices, "topk_score": top.values}
        if self.want_logits:
            out["logits"] = logits
        if self.want_embeddings:
            out["embedding"] = self._features[-1].flatten(1).float()  # the last call: a module may run twice
        return out


def _as_logits(output) -> torch.Tensor:
    # GoogLeNet/Inception return named tuples in some modes; their first field holds the logits.
    if isinstance(output, torch.Tensor):
        return output
    if hasattr(output, "logits"):
        return output.logits
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise ModelError(f"the model returned {type(output).__name__}; expected a tensor of logits (N x classes)")


def raw_output(output, images: int) -> torch.Tensor:
    """The model's one output tensor, batch first, as float32; a ModelError naming what it returned otherwise."""
    if not isinstance(output, torch.Tensor):
        raise ModelError(f"--output raw takes one tensor per batch (batch first); the model returned "
                         f"{describe_output(output)}: wrap it in a module:factory that returns the one to keep")
    if output.dim() == 0 or output.shape[0] != images:
        raise ModelError(f"--output raw: the model returned a tensor of shape {tuple(output.shape)} for "
                         f"{images} image(s); expected the batch first, ({images}, ...)")
    if output.is_complex():
        raise ModelError(f"--output raw writes real values; the model returned {output.dtype}")
    return output.float()


def describe_output(output) -> str:
    """What a model returned, in a few words: 'a dict with keys out, aux', 'a tuple of 2: tensor (1, 4), int'."""
    if isinstance(output, torch.Tensor):
        return f"tensor {tuple(output.shape)}"
    if isinstance(output, dict):
        return f"a {type(output).__name__} with keys {', '.join(map(str, output))}"
    if isinstance(output, (tuple, list)):
        items = ", ".join(describe_output(item) if isinstance(item, torch.Tensor) else type(item).__name__
                          for item in output[:4])
        return f"a {type(output).__name__} of {len(output)}: {items}{', ...' if len(output) > 4 else ''}"
    return type(output).__name__


def pool_spatial(features: torch.Tensor) -> torch.Tensor:
    """(N, C, H, W, ...) -> (N, C) by global average pooling; (N, C) unchanged."""
    return features.flatten(2).mean(dim=2) if features.dim() > 2 else features


def named_module(module: nn.Module, name: str) -> nn.Module:
    """The submodule called `name` (as `named_modules()` spells it); ModelError listing some names if none is."""
    if isinstance(module, torch.jit.ScriptModule):
        raise ModelError("--layer needs an nn.Module (hooks cannot be added to TorchScript models)")
    modules = dict(getattr(module, "_orig_mod", module).named_modules())  # torch.compile wraps the module
    if name in modules and name:
        return modules[name]
    top_level = [n for n in modules if n and "." not in n]
    raise ModelError(f"--layer {name}: the model has no module of that name; top-level modules are "
                     f"{', '.join(top_level[:12]) or 'none'}{' ...' if len(top_level) > 12 else ''} "
                     f"(nested ones are dotted, e.g. {_nested_example(modules)})")


def _nested_example(modules: dict) -> str:
    nested = [n for n in modules if n.count(".") == 1]
    return nested[len(nested) // 2] if nested else "features.0"


def _as_tensor(output, name: str) -> torch.Tensor:
    if isinstance(output, torch.Tensor):
        return output
    if isinstance(output, (tuple, list)) and output and isinstance(output[0], torch.Tensor):
        return output[0]
    raise ModelError(f"--layer {name}: the module returns {type(output).__name__}, not a tensor")


def _last_linear(module: nn.Module) -> nn.Linear:
    if isinstance(module, torch.jit.ScriptModule):
        raise ModelError("--embeddings needs an nn.Module (hooks cannot be added to TorchScript models)")
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ModelError("--embeddings takes the input of the model's last nn.Linear layer, and it has none")
    return linears[-1]
