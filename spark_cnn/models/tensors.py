"""uint8 pixels -> normalised float tensors, on the device. Imports torch: sidecar and training side only."""

from __future__ import annotations

import torch

from spark_cnn.imaging.preprocess import Preprocessing


def normalise(pixels: torch.Tensor, prep: Preprocessing) -> torch.Tensor:
    """(N, H, W, 3) uint8 -> (N, 3, H, W) float32, channels-last in memory, scaled to [0, 1] and normalised by
    the mean/std of `prep`."""
    # (x / 255 - mean) / std as one multiply and one add: two passes over the batch instead of three.
    scale = torch.tensor([1.0 / (255.0 * s) for s in prep.std], dtype=torch.float32, device=pixels.device)
    shift = torch.tensor([-m / s for m, s in zip(prep.mean, prep.std, strict=True)], dtype=torch.float32,
                         device=pixels.device)
    # Channels-last on purpose (the permute of NHWC pixels already has its strides, so this copies nothing
    # more): oneDNN propagates it through the network and runs torchvision CNNs faster so on the CPU
    # (docs/perf-model.md, "Memory layout"); the time model is calibrated on this layout.
    images = pixels.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.channels_last)
    return images.mul_(scale.view(1, 3, 1, 1)).add_(shift.view(1, 3, 1, 1))
