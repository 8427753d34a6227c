"""Fixtures of the sidecar tests: a private runtime directory, the demo CNN's weights, endpoint and reference,
one shared running sidecar, and a fresh fake application per test."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING, DigitsCNN
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import Endpoint, ModelSpec
from spark_cnn.models.tensors import normalise
from spark_cnn.task.launcher import RUNTIME_DIR_ENV, SidecarInfo, ensure_sidecar
from tests.sidecar_harness import FakeApp, fake_app


@pytest.fixture(scope="module")
def runtime() -> Iterator[str]:
    """A private runtime directory that does not exist yet (the launcher must create it 0700)."""
    base = tempfile.mkdtemp(prefix="scn")
    path = os.path.join(base, "rt")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(RUNTIME_DIR_ENV, path)
            yield path
    finally:
        shutil.rmtree(base, ignore_errors=True)


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


@pytest.fixture(scope="module")
def shared(runtime: str) -> Iterator[tuple[FakeApp, SidecarInfo]]:
    """One running sidecar for the tests that do not stop it."""
    with fake_app("shared") as app:
        yield app, ensure_sidecar(app.options(), app.executor)


@pytest.fixture
def app(runtime: str) -> Iterator[FakeApp]:
    with fake_app("own") as fresh:
        yield fresh
