"""uint8 pixels -> normalised float tensors, on the device. Imports torch: sidecar and training side only."""

from __future__ import annotations

import torch

from spark_cnn.imaging.preprocess import Preprocessing


def normalise(pixels: torch.Tensor, prep: Preprocessing) -> torch.Tensor:
    """(N, H, W, C) uint8 -> (N, C, H, W) float32, channels-last in memory, scaled to [0, 1] and normalised by
    the mean/std of `prep`."""
    n, height, width, channels = pixels.shape
    # (x / 255 - mean) / std as one multiply and one add, per channel. Broadcasting a (C,) vector over the
    # innermost dimension of size 3 does not vectorise (0.6 ms per 224 px image on a core); the same values
    # tiled along whole rows of W x C floats do (0.12 ms), and give bit-identical results.
    scale = torch.tensor([1.0 / (255.0 * s) for s in prep.std], dtype=torch.float32, device=pixels.device)
    shift = torch.tensor([-m / s for m, s in zip(prep.mean, prep.std, strict=True)], dtype=torch.float32,
                         device=pixels.device)
    images = pixels.to(torch.float32, memory_format=torch.contiguous_format, copy=True)  # never the input
    rows = images.view(n * height, width * channels)
    rows.mul_(scale.repeat(width)).add_(shift.repeat(width))
    # Channels-last on purpose (NHWC memory seen as NCHW: no copy): oneDNN propagates it through the network and
    # runs torchvision CNNs faster so on the CPU (docs/perf-model.md, "Memory layout"); the time model is
    # calibrated on this layout.
    return images.permute(0, 3, 1, 2)


def flush_denormals() -> None:
    """Treat subnormal floats as zero in the calling thread's CPU arithmetic (the flag is per thread: call it
    where forwards run; threads it starts afterwards inherit it).

    An x86 core handles a subnormal operand in microcode, many times slower than a normal one. Shifted-window
    attention (swin) masks its scores with -100, whose softmax exp(-100) ~ 4e-44 is subnormal, so the next matrix
    product runs several times slower; flushed, the logits are identical (docs/perf-model-journal.md, "The zoo on
    a quiet host"). Values that small are below any score a model reports."""
    torch.set_flush_denormal(True)
