"""uint8 pixels -> normalised float tensors, on the device. Imports torch: sidecar and training side only."""

from __future__ import annotations

import torch

from spark_cnn.imaging.preprocess import Preprocessing


def normalise(pixels: torch.Tensor, prep: Preprocessing) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float32 scaled to [0, 1] and normalised by the mean/std of `prep`."""
    mean = torch.tensor(prep.mean, dtype=torch.float32, device=pixels.device).view(1, 3, 1, 1)
    std = torch.tensor(prep.std, dtype=torch.float32, device=pixels.device).view(1, 3, 1, 1)
    images = pixels.permute(0, 3, 1, 2).to(torch.float32).div_(255.0)
    return images.sub_(mean).div_(std)
