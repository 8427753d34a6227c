"""The device side of the sidecar: hold each served model once, run uint8 batches through it."""

from __future__ import annotations

import threading

import numpy as np
import torch

from spark_cnn.errors import ConfigError
from spark_cnn.imaging.tensors import normalise
from spark_cnn.models.heads import Predictor
from spark_cnn.models.loader import build_module
from spark_cnn.models.spec import Endpoint


def resolve_device(requested: str) -> torch.device:
    """'auto' -> cuda:0 when CUDA is usable, else cpu; 'cuda' -> cuda:0; 'cuda:N' and 'cpu' as given."""
    if requested == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device("cuda:0" if requested == "cuda" else requested)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {requested}: CUDA is not available on this host; use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {requested}: this host has {torch.cuda.device_count()} CUDA device(s)")
    return device


class ModelRunner:
    """One loaded model on one device. `run(pixels)` takes (N, H, W, 3) uint8 and returns numpy outputs."""

    def __init__(self, endpoint: Endpoint, device: torch.device):
        self.endpoint = endpoint
        self.device = device
        module = build_module(endpoint.source, endpoint.weights).to(device)
        self.predictor = Predictor(module, top_k=endpoint.top_k, logits=endpoint.logits,
                                   embeddings=endpoint.embeddings)

    def run(self, pixels: np.ndarray) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            batch = torch.from_numpy(pixels).to(self.device, non_blocking=True)
            out = self.predictor.predict(normalise(batch, self.endpoint.preprocessing))
            result = {
                "label": out["label"].to(torch.int32),
                "score": out["score"],
                "topk_label": out["topk_label"].to(torch.int32),
                "topk_score": out["topk_score"],
            }
            for optional in ("logits", "embedding"):
                if optional in out:
                    result[optional] = out[optional]
            return {k: v.cpu().numpy() for k, v in result.items()}


class ModelRegistry:
    """Models by endpoint fingerprint; each is loaded once, by the first connection that asks for it."""

    def __init__(self, device: torch.device):
        self.device = device
        self._runners: dict[str, ModelRunner] = {}
        self._lock = threading.Lock()

    def get(self, endpoint: Endpoint) -> tuple[ModelRunner, bool]:
        """The runner for `endpoint`, and whether this call loaded it."""
        with self._lock:
            runner = self._runners.get(endpoint.fingerprint)
            if runner is not None:
                return runner, False
            runner = ModelRunner(endpoint, self.device)
            self._runners[endpoint.fingerprint] = runner
            return runner, True
