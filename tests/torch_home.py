"""A private TORCH_HOME seeded with random weights in torchvision's format, under the file names torchvision's
loader looks for, so named weights resolve offline through the real loading code."""

from __future__ import annotations

import os
import re

import torch
import torchvision

from spark_cnn.models.weights import cached_path

AUX_HEADS = ("googlenet", "inception_v3")


def seed_weights(torch_home: str, model: str, weights: str = "DEFAULT", seed: int = 0,
                 old_densenet_keys: bool = False) -> str:
    """Save random weights of `model` for its `weights` member where torchvision caches them; returns the path.
    The state_dict is in torchvision's format: the classes of the enum, the auxiliary heads included, and with
    `old_densenet_keys` densenet's old key names ('norm.1'), as torchvision's published densenet files have."""
    enum = torchvision.models.get_model_weights(model)[weights]
    torch.manual_seed(seed)
    extra = {"aux_logits": True, "init_weights": False} if model in AUX_HEADS else {}
    module = torchvision.models.get_model(model, weights=None, num_classes=len(enum.meta["categories"]), **extra)
    _calibrate_batch_norm(module, enum.transforms().crop_size[0])
    path = cached_path(os.path.join(torch_home, "hub"), enum.url)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    state = module.state_dict()
    if old_densenet_keys:
        # the published files predate num_batches_tracked
        state = {re.sub(r"(denselayer\d+\.(?:norm|relu|conv))([12])\.", r"\1.\2.", k): v for k, v in state.items()
                 if not k.endswith("num_batches_tracked")}
        assert any(".norm.1." in key for key in state)
    torch.save(state, path)
    return path


def _calibrate_batch_norm(module: torch.nn.Module, size: int) -> None:
    """Batch-norm statistics measured on noise images, as training would measure them: with fresh 0/1 statistics
    a random deep network's logits barely depend on its input, so a wrong input transform would not show."""
    for layer in module.modules():
        if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm):
            layer.momentum = None  # a plain average over the calibration batches
    module.train()
    with torch.no_grad():
        for _ in range(2):
            module(torch.randn(4, 3, size, size))
    module.eval()
