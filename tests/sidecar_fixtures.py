"""The demo CNN's fixtures both sidecar test layers use: its weights (random, seed 0), its endpoint and the
reference logits computed directly with torch. Each layer's conftest imports them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING, DigitsCNN
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import Endpoint, ModelSpec
from spark_cnn.models.tensors import normalise


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> str:
    """The demo CNN with random weights (seed 0), saved as a state_dict."""
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("digits") / "digits_state.pt")
    torch.save(DigitsCNN().state_dict(), path)
    return path


@pytest.fixture(scope="module")
def endpoint(weights: str) -> Endpoint:
    return resolve_endpoint(ModelSpec(DIGITS_FACTORY, weights=weights), logits=True).endpoint


@pytest.fixture(scope="module")
def reference(weights: str):
    """Logits computed directly with torch, as the sidecar should compute them."""
    model = DigitsCNN()
    model.load_state_dict(torch.load(weights, weights_only=True))
    model.eval()

    def compute(pixels: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return model(normalise(torch.from_numpy(pixels), DIGITS_PREPROCESSING)).numpy()

    return compute
