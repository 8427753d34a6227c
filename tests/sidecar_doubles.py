"""Test doubles: a slow echo model, to load-test a sidecar and check every reply.

`slow_echo` returns, as its three "logits", the first pixel's R, G, B values (0-255, exact in float32) of each
image, after sleeping a fixed time per batch like a heavy model on a slow device. A client that writes a request
id into that pixel can check that every reply row belongs to its request.

A sidecar imports it by name in its own process, which inherits the test's environment: `pythonpath_with_repo`
gives the PYTHONPATH under which that import works wherever the test runs from.
"""

from __future__ import annotations

import os
import threading
import time

import torch
from torch import nn

from spark_cnn.imaging.preprocess import Preprocessing

SLOW_ECHO_FACTORY = "tests.sidecar_doubles:slow_echo"
# 64 x 64 pixels: 12 KB per image on the wire, large enough that buffering requests without bound would show in
# memory within a load test. Mean 0, std 1: the model sees pixel / 255 and scales it back.
ECHO_PREPROCESSING = Preprocessing(resize=64, crop=64, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))
# Per batch: a batch of 64 rows then runs at ~12,800 images/s at most, slower than 16 clients can send.
ECHO_BATCH_DELAY_S = 0.005


REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def pythonpath_with_repo(environ: dict[str, str] | None = None) -> str:
    """PYTHONPATH of `environ` (default: this process's) with the repository root first, so that a child process
    imports `tests.sidecar_doubles`."""
    current = (os.environ if environ is None else environ).get("PYTHONPATH", "")
    return os.pathsep.join([REPO_ROOT, *(p for p in current.split(os.pathsep) if p)])


class SlowEcho(nn.Module):
    """(N, 3, H, W) in [0, 1] -> (N, 3): the first pixel's values times 255, after `delay_s` seconds."""

    spark_cnn_preprocessing = ECHO_PREPROCESSING.to_dict()

    def __init__(self, delay_s: float = ECHO_BATCH_DELAY_S):
        super().__init__()
        self.delay_s = delay_s

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return images[:, :, 0, 0] * 255.0


def slow_echo() -> SlowEcho:
    return SlowEcho()


WIDE_ECHO_FACTORY = "tests.sidecar_doubles:wide_echo"


class WideEcho(SlowEcho):
    """(N, 3, H, W) -> (N, 3 * H * W): every pixel times 255, so each row's reply (48 KB) is as large as its request
    and a few dozen replies fill a socket's buffer, as a detector's boxes can."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        time.sleep(self.delay_s)
        return images.flatten(1) * 255.0


def wide_echo() -> WideEcho:
    return WideEcho()


FAILING_FACTORY = "tests.sidecar_doubles:fails_on_images"
FAILING_MESSAGE = "the test model fails on every real image"


def fails_on_images() -> nn.Module:
    """The demo CNN, except that it raises on any batch that is not one blank colour: it passes the driver's
    model check (one blank image) and fails on every real image, as a model broken for real data does."""
    from spark_cnn.models.digits import DigitsCNN

    class FailsOnImages(DigitsCNN):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            if bool(images.amax() != images.amin()):
                raise RuntimeError(FAILING_MESSAGE)
            return super().forward(images)

    return FailsOnImages()


RAW_GRID_FACTORY = "tests.sidecar_doubles:raw_grid"
TWO_HEADS_FACTORY = "tests.sidecar_doubles:two_heads"


class RawGrid(nn.Module):
    """(N, 3, H, W) -> (N, 2, 3, 3): the first two channels averaged over a 3 x 3 grid. Not a classifier: its
    output is written only with --output raw."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return nn.functional.adaptive_avg_pool2d(images[:, :2], 3)


def raw_grid() -> RawGrid:
    return RawGrid()


class TwoHeads(nn.Module):
    """Returns a dict of two tensors, as torchvision's segmentation models do: refused even with --output raw."""

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"out": images.mean(dim=(2, 3)), "aux": images.amax(dim=(2, 3))}


def two_heads() -> TwoHeads:
    return TwoHeads()


PACED_ECHO_FACTORY = "tests.sidecar_doubles:paced_echo"
# Per batch: a slow model on a CPU, slow enough that a queue of a few tasks' requests takes longer than a short
# request timeout, fast enough that a test of dozens of batches ends in seconds.
PACED_BATCH_S = 0.5
# A request whose first pixel has this red value never returns from the forward: a model stuck on the device.
STALL_MARK = 255


class PacedEcho(SlowEcho):
    """SlowEcho at PACED_BATCH_S per batch, whose forward blocks for good on a batch holding a STALL_MARK pixel."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if bool((images[:, 0, 0, 0] * 255.0 >= STALL_MARK - 0.5).any()):
            threading.Event().wait()  # stuck for good, as a wedged kernel is; the test kills the process
        return super().forward(images)


def paced_echo() -> PacedEcho:
    return PacedEcho(delay_s=PACED_BATCH_S)
