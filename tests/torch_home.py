"""A private TORCH_HOME seeded with random weights in torchvision's format, under the file names torchvision's
loader looks for, so named weights resolve offline through the real loading code; and the images and the logits
tolerance the tests comparing our outputs with torchvision's (and timm's) own build use."""

from __future__ import annotations

import io
import os
import re
import typing
import warnings
from contextlib import contextmanager

import numpy as np
import torch
import torchvision
from PIL import Image

from spark_cnn.models.weights import cached_path


def seed_weights(torch_home: str, model: str, weights: str = "DEFAULT", seed: int = 0,
                 old_densenet_keys: bool = False, calibration: torch.Tensor | None = None,
                 legacy_format: bool = False) -> str:
    """Save random weights of `model` for its `weights` member where torchvision caches them; returns the path.
    The state_dict is in torchvision's format: the model as torchvision's builder builds it for these weights
    (their classes and input size, the auxiliary heads included), and with `old_densenet_keys` densenet's old key
    names ('norm.1'), as torchvision's published densenet files have. Batch norm is calibrated on `calibration`
    images (N, 3, H, W), else on noise: calibrated on the very images a test feeds, a deep random network stays
    well-conditioned (float32 rounding of its input moves its logits by ~1e-5 of their scale; calibrated on noise,
    efficientnet_v2_s's move by 10%). `legacy_format`: older layouts torchvision's own classes still load (files
    published before those classes changed may have them): mnasnet's version-1 stem (the file says so in its
    metadata), the ViT MLP blocks' `linear_1`/`linear_2` keys (no metadata)."""
    enum = torchvision.models.get_model_weights(model)[weights]
    cls, args, kwargs = torchvision_construction(model, enum)
    torch.manual_seed(seed)
    module = cls(*args, **kwargs)
    if legacy_format and model.startswith("mnasnet"):
        with warnings.catch_warnings():  # "saved using the previous version": what we ask for
            warnings.simplefilter("ignore", UserWarning)
            module._load_from_state_dict({}, "", {"version": 1}, False, [], [], [])  # its own switch to v1
        assert module._version == 1
    _randomise_constants(module)
    _calibrate_batch_norm(module, enum.transforms().crop_size[0], calibration)
    path = cached_path(os.path.join(torch_home, "hub"), enum.url)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    state = module.state_dict()
    if old_densenet_keys:
        # the published files predate num_batches_tracked
        state = {re.sub(r"(denselayer\d+\.(?:norm|relu|conv))([12])\.", r"\1.\2.", k): v for k, v in state.items()
                 if not k.endswith("num_batches_tracked")}
        assert any(".norm.1." in key for key in state)
    if legacy_format and model.startswith("vit_"):
        state = {re.sub(r"\.mlp\.([03])\.", lambda m: f".mlp.linear_{int(m[1]) // 3 + 1}.", k): v
                 for k, v in state.items()}
        assert any(".mlp.linear_2." in key for key in state)
    torch.save(state, path)
    return path


class _Constructed(Exception):
    """Raised in place of building the model: what torchvision's builder was about to construct it with."""

    def __init__(self, cls: type, args: tuple, kwargs: dict):
        super().__init__(cls.__name__)
        self.construction = (cls, args, kwargs)


@contextmanager
def _stop_at(cls: type) -> None:
    """Within: constructing `cls` raises _Constructed instead (the original __init__ is put back after)."""
    original = cls.__dict__["__init__"]

    def intercept(self, *args, **kwargs):
        raise _Constructed(cls, args, kwargs)

    cls.__init__ = intercept
    try:
        yield
    finally:
        cls.__init__ = original


def torchvision_construction(model: str, weights) -> tuple[type, tuple, dict]:
    """(class, args, kwargs) that `torchvision.models.get_model(model, weights=weights)` constructs its model
    with, before it loads the weights."""
    return construction(model, lambda: torchvision.models.get_model(model, weights=weights))


def construction(model: str, build) -> tuple[type, tuple, dict]:
    """(class, args, kwargs) that `build()`, a call that builds torchvision's `model`, constructs the model with;
    neither the model nor any weights are made or loaded. The class is what the model's builder declares it
    returns."""
    cls = typing.get_type_hints(torchvision.models.get_model_builder(model))["return"]
    with _stop_at(cls):
        try:
            build()
        except _Constructed as stopped:
            return stopped.construction
    raise AssertionError(f"building {model} constructed no {cls.__name__}")


def _randomise_constants(module: torch.nn.Module) -> None:
    """Random values for the parameters torchvision initialises to one constant outside normalisation layers
    (the zero head of vit_*, convnext's 1e-6 layer scale, zero biases): a zero head gives zero logits for any
    input, a tiny layer scale silences whole blocks, so a wrong input or a missing block would not show."""
    norms = (torch.nn.modules.batchnorm._NormBase, torch.nn.LayerNorm, torch.nn.GroupNorm)
    with torch.no_grad():
        for layer in module.modules():
            if isinstance(layer, norms):
                continue
            for parameter in layer.parameters(recurse=False):
                if parameter.numel() > 1 and bool((parameter == parameter.flatten()[0]).all()):
                    bound = parameter[0].numel() ** -0.5 if parameter.dim() > 1 else 0.1
                    parameter.uniform_(-bound, bound)


def _calibrate_batch_norm(module: torch.nn.Module, size: int, images: torch.Tensor | None = None) -> None:
    """Batch-norm statistics measured on noise images, as training would measure them: with fresh 0/1 statistics
    a random deep network's logits barely depend on its input, so a wrong input transform would not show.
    Models without batch norm (the transformers, convnext) skip the forward passes."""
    norms = [layer for layer in module.modules() if isinstance(layer, torch.nn.modules.batchnorm._BatchNorm)]
    if not norms:
        module.eval()
        return
    for layer in norms:
        layer.momentum = None  # a plain average over the calibration batches
    module.train()
    with torch.no_grad():
        for batch in [images] if images is not None else [torch.randn(4, 3, size, size) for _ in range(2)]:
            module(batch)
    module.eval()


def png_image(width: int, height: int, seed: int) -> bytes:
    """A PNG of a noisy colour ramp: deterministic for a seed, different enough between seeds."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 255, width, dtype=np.float32)[None, :, None] * np.ones((height, 1, 3), np.float32)
    pixels = np.clip(ramp * rng.uniform(0.3, 1.0, 3) + rng.normal(0, 25, (height, width, 3)), 0, 255)
    buf = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


IMAGES = [png_image(400, 300, 1), png_image(260, 380, 2)]


def assert_logits_close(ours: np.ndarray, reference: np.ndarray) -> None:
    """Equal to float32 rounding: within 1e-4 of the reference's largest magnitude (random logits are small)."""
    np.testing.assert_allclose(ours, reference, rtol=0, atol=1e-4 * float(np.abs(reference).max()))
