"""Turn a classifier's logits into the job's outputs: top-1, top-k, and optionally logits and embeddings."""

from __future__ import annotations

import torch
from torch import nn

from spark_cnn.errors import ModelError


class Predictor:
    """Wraps a classification module; `predict(images)` returns a dict of tensors with one row per image.

    Keys: label (int64), score (softmax probability of the label), topk_label, topk_score (N x k), and
    logits (N x classes) / embedding (N x features, the input of the last Linear layer) when asked.
    """

    def __init__(self, module: nn.Module, *, top_k: int, logits: bool = False, embeddings: bool = False):
        self.module = module
        self.top_k = top_k
        self.want_logits = logits
        self._features: list[torch.Tensor] = []
        if embeddings:
            last_linear = _last_linear(module)
            last_linear.register_forward_hook(lambda _m, inputs, _out: self._features.append(inputs[0]))
        self.want_embeddings = embeddings

    def predict(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        self._features.clear()
        logits = _as_logits(self.module(images)).float()
        probs = torch.softmax(logits, dim=1)
        top = probs.topk(self.top_k, dim=1)
        out = {"label": top.indices[:, 0], "score": top.values[:, 0],
               "topk_label": top.indices, "topk_score": top.values}
        if self.want_logits:
            out["logits"] = logits
        if self.want_embeddings:
            out["embedding"] = self._features[-1].flatten(1).float()
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


def _last_linear(module: nn.Module) -> nn.Linear:
    if isinstance(module, torch.jit.ScriptModule):
        raise ModelError("--embeddings needs an nn.Module (hooks cannot be added to TorchScript models)")
    linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise ModelError("--embeddings takes the input of the model's last nn.Linear layer, and it has none")
    return linears[-1]
