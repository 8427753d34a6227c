"""Models that cost almost nothing, for measuring what serving and the framework themselves cost.

Both average each image's pixels and map the three channel means to ten logits: the work per image (sockets,
Arrow, batching, heads, replies, Spark) is then nearly all there is.

- `identity_classifier` (`bench-sidecar --model identity`, named by `bench.variants.IDENTITY_FACTORY`): 32x32
  inputs, so that moving pixels costs little too and the per-request cost shows.
- `save_identity_torchscript` (`bench --models identity`): the same module with the default preprocessing
  (shorter side 256, centre crop 224, as the user-side variants do), saved as a TorchScript file, so every
  variant loads it as it loads a user's model and decode + resize + crop is all the images cost.
"""

from __future__ import annotations

import warnings

import torch
from torch import nn


class MeanPixelClassifier(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(3, classes)

    def forward(self, images):
        return self.head(self.pool(images).flatten(1))


class IdentityClassifier(MeanPixelClassifier):
    spark_cnn_preprocessing = {"resize": 32, "crop": 32}


def identity_classifier() -> nn.Module:
    return IdentityClassifier()


def save_identity_torchscript(path: str) -> str:
    """Write the near-free model (default preprocessing, seeded weights) as TorchScript to `path`."""
    torch.manual_seed(0)
    with warnings.catch_warnings():  # torch marks TorchScript deprecated; users still ship it, so the bench does
        warnings.simplefilter("ignore", FutureWarning)
        torch.jit.save(torch.jit.script(MeanPixelClassifier().eval()), path)
    return path
