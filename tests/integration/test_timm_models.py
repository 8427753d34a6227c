"""timm models (`timm:NAME`), offline: the preprocessing of timm's data config, logits equal to timm's own
forward on timm's eval transforms (weights from a state_dict file, and timm's pretrained loader reading a seeded
Hugging Face cache), label names from the pretrained config, and the errors before anything runs.

Tolerance as in test_tv_weights.py: Pillow resizes both ways; normalisation differs in float32 rounding only.
"""

from __future__ import annotations

import io
import sys

import numpy as np
import pytest
import timm
import torch
from PIL import Image

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.imaging.preprocess import preprocess_pixels
from spark_cnn.models.loader import build_module
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import ModelSpec
from spark_cnn.models.tensors import normalise
from spark_cnn.models.timm_models import timm_preprocessing
from tests.timm_hub import TIMM_MODEL, save_timm_weights, seed_hf_cache
from tests.torch_home import IMAGES, assert_logits_close


@pytest.fixture(autouse=True)
def private_caches(tmp_path, monkeypatch):
    """timm's pretrained weights are saved under XDG_CACHE_HOME; the hub cache is private and offline."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import huggingface_hub.constants as hub

    # huggingface_hub reads these once, at import
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    return tmp_path


def _ours(endpoint, data: bytes) -> np.ndarray:
    module = build_module(endpoint.source, endpoint.weights, kind=endpoint.kind)
    pixels = torch.from_numpy(preprocess_pixels(data, endpoint.preprocessing).copy())[None]
    with torch.inference_mode():
        return module(normalise(pixels, endpoint.preprocessing))[0].numpy()


def _timms(module: torch.nn.Module, data: bytes) -> np.ndarray:
    transform = timm.data.create_transform(**timm.data.resolve_model_data_config(module))
    with Image.open(io.BytesIO(data)) as image, torch.inference_mode():
        return module.eval()(transform(image.convert("RGB"))[None])[0].numpy()


def test_preprocessing_follows_timms_data_config():
    config = {"input_size": (3, 176, 176), "interpolation": "bicubic", "crop_pct": 0.875, "crop_mode": "center",
              "mean": (0.5, 0.5, 0.5), "std": (0.25, 0.25, 0.25)}
    assert timm_preprocessing("timm:x", config) == {"resize": 201, "crop": 176, "interpolation": "bicubic",
                                                    "mean": (0.5,) * 3, "std": (0.25,) * 3}
    assert timm_preprocessing("timm:x", {**config, "crop_pct": None, "input_size": (3, 224, 224)})["resize"] == 256
    for odd in ({"crop_mode": "squash"}, {"input_size": (3, 224, 256)}, {"interpolation": "nearest"}):
        with pytest.raises(ConfigError, match="pass --resize, --crop and --interpolation"):
            timm_preprocessing("timm:x", {**config, **odd})


def test_a_state_dict_file_classifies_as_timm_does_on_its_transforms(tmp_path):
    path = save_timm_weights(str(tmp_path / "w.pth"))
    resolved = resolve_endpoint(ModelSpec(f"timm:{TIMM_MODEL}", weights=path), logits=True)
    prep = resolved.endpoint.preprocessing
    assert (prep.resize, prep.crop, prep.interpolation) == (201, 176, "bicubic")
    assert resolved.weights.label.startswith("sha256:") and resolved.weights.categories is None
    reference = timm.create_model(TIMM_MODEL)
    reference.load_state_dict(torch.load(path, weights_only=True))
    for data in IMAGES:
        assert_logits_close(_ours(resolved.endpoint, data), _timms(reference, data))


def test_default_loads_timms_pretrained_weights_with_their_label_names(private_caches):
    hub_id = seed_hf_cache(str(private_caches / "hf"))
    resolved = resolve_endpoint(ModelSpec(f"timm:{TIMM_MODEL}", weights="DEFAULT"), logits=True)
    assert resolved.weights.label == f"timm:{hub_id.partition('/')[2]} pretrained (hf-hub:{hub_id})"
    assert resolved.weights.file.startswith(str(private_caches / "cache" / "spark_cnn" / "timm"))
    assert resolved.endpoint.weights == resolved.weights.file  # shipped as a weights file
    assert resolved.weights.categories == tuple(timm.data.ImageNetInfo().label_descriptions())
    assert resolved.weights.categories[0] == "tench, Tinca tinca"
    reference = timm.create_model(TIMM_MODEL, pretrained=True)  # timm's own loader, from the seeded cache
    for data in IMAGES:
        assert_logits_close(_ours(resolved.endpoint, data), _timms(reference, data))


def test_random_and_explicit_preprocessing():
    resolved = resolve_endpoint(ModelSpec(f"timm:{TIMM_MODEL}", preprocessing={"crop": 160, "resize": 180}))
    assert resolved.weights.label == "random" and resolved.endpoint.weights is None
    prep = resolved.endpoint.preprocessing
    assert (prep.resize, prep.crop, prep.interpolation) == (180, 160, "bicubic")


def test_bad_timm_input_stops_with_one_line(monkeypatch):
    with pytest.raises(ModelError, match=r"timm has no model 'resnet10x'; close: resnet10t"):
        resolve_endpoint(ModelSpec("timm:resnet10x"))
    with pytest.raises(ModelError, match="timm could not load its pretrained weights .* or pass --weights FILE"):
        resolve_endpoint(ModelSpec(f"timm:{TIMM_MODEL}", weights="DEFAULT"))  # offline, nothing cached
    with pytest.raises(ConfigError, match="a timm model takes DEFAULT"):
        ModelSpec(f"timm:{TIMM_MODEL}", weights="IMAGENET1K_V2")
    with pytest.raises(ConfigError, match="name the timm model"):
        ModelSpec("timm:")
    monkeypatch.setitem(sys.modules, "timm", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"needs timm, an optional extra: pip install 'spark_cnn\[timm\]'") as e:
        resolve_endpoint(ModelSpec(f"timm:{TIMM_MODEL}"))
    assert "\n" not in str(e.value)


def test_profile_names_the_timm_weights_and_uses_its_input_size(private_caches):
    from spark_cnn.perf_tools.commands import _model_and_cost

    seed_hf_cache(str(private_caches / "hf"))
    _, shape, _, label = _model_and_cost(ModelSpec(f"timm:{TIMM_MODEL}", weights="DEFAULT"))
    assert shape == (3, 176, 176) and label.startswith(f"timm:{TIMM_MODEL}.") and "pretrained (hf-hub:" in label
