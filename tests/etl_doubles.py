"""A model for the ETL's fault tests, importable by the sidecar process (`--model tests.etl_doubles:...`)."""

from __future__ import annotations

import torch
from torch import nn

FAILS_ON_RED_FACTORY = "tests.etl_doubles:fails_on_red"
FAILS_ON_RED_MESSAGE = "the test model fails on a red image"


def fails_on_red() -> nn.Module:
    """The demo CNN, except that it raises on any batch holding a mostly red image: grey digits and the driver's
    blank check image pass, one red file fails every job that carries it (a model broken for one input)."""
    from spark_cnn.models.digits import DigitsCNN

    class FailsOnRed(DigitsCNN):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            # normalised with mean 0.5, std 0.5: red is +1 in channel 0, -1 in channel 1; grey is equal in both
            if bool(((images[:, 0] - images[:, 1]).mean(dim=(1, 2)) > 1.0).any()):
                raise RuntimeError(FAILS_ON_RED_MESSAGE)
            return super().forward(images)

    return FailsOnRed()
