"""A simulated device: a classifier whose forward takes a device's time per batch without using the CPU.

`--model sim:CURVE` (models/device_curve.py) stands a fast accelerator behind the whole pipeline on a host that has
none, so what the rest of the pipeline sustains and what CPU it spends per image are measured against that device's
latency, not assumed. Its forward waits `curve.ms(batch)` on an Event (the GIL is released, no core is busy) and
returns zero logits of CLASSES, views of one zero buffer grown as batches grow (filling a fresh one is host work a
device does not ask for, and a multi-threaded fill leaves OpenMP's threads spinning through the wait): the heads
(softmax and top-k over the logits, ~2 us per image on a core), replies and everything before the device run as for
a real model. Forwards are serialised by one lock per process, as one device runs one batch at a time however many
threads submit them. It declares SIMULATED_DEVICE_ATTRIBUTE, so the sidecar's runner hands it the uint8 pixels as
they are: a GPU sidecar converts and normalises on the device, and the host must not be charged for it.

>>> import torch
>>> SimulatedDevice(parse_curve("1+0.01n"))(torch.zeros(4, 3, 224, 224, dtype=torch.uint8)).shape
torch.Size([4, 1000])
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from spark_cnn.models.device_curve import SIM_PREFIX, LatencyCurve, parse_curve

CLASSES = 1000  # ImageNet's: the heads (softmax, top-k) then cost what they cost for the models simulated
# The attribute a module sets to take uint8 NHWC pixels (seen as NCHW) instead of normalised floats.
SIMULATED_DEVICE_ATTRIBUTE = "spark_cnn_simulated_device"
_DEVICE = threading.Lock()  # one device per sidecar: its batches run one after another


class SimulatedDevice(nn.Module):
    spark_cnn_simulated_device = True

    def __init__(self, curve: LatencyCurve, classes: int = CLASSES):
        super().__init__()
        self.curve = curve
        self.classes = classes
        self._never = threading.Event()  # never set: waiting on it sleeps without holding the GIL or a core
        self._zeros = torch.zeros((0, classes), dtype=torch.float32)  # read only: every reply views it

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        n = int(images.shape[0])
        with _DEVICE:
            self._never.wait(self.curve.ms(n) / 1000.0)
            if len(self._zeros) < n:
                self._zeros = torch.zeros((n, self.classes), dtype=torch.float32)
            return self._zeros[:n]


def simulated_module(source: str) -> SimulatedDevice:
    """The simulated device `sim:CURVE` names."""
    return SimulatedDevice(parse_curve(source[len(SIM_PREFIX):]))


def takes_raw_pixels(module: nn.Module) -> bool:
    """Whether `module` (or the one torch.compile wrapped) takes uint8 pixels: normalising is its device's work."""
    return bool(getattr(getattr(module, "_orig_mod", module), SIMULATED_DEVICE_ATTRIBUTE, False))
