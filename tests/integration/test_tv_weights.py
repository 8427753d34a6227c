"""torchvision weights by name, offline: a private TORCH_HOME seeded with random weights in torchvision's format;
what they resolve to (file, preprocessing, categories) and logits equal to torchvision's own build fed by the
enum's transforms.

Tolerance: our resize is Pillow's, as torchvision's `transforms()` on a PIL image (its tensor path, antialiased
`interpolate`, differs from Pillow by a grey level here and there); normalisation runs as one multiply-add
instead of ToTensor + Normalize, so logits agree to float32 rounding: within 1e-4 of their largest magnitude
(random networks give small logits, so the tolerance follows their scale; observed: below 1e-6 of it).
"""

from __future__ import annotations

import io
import logging

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image

from spark_cnn.config import InferenceOptions
from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.imaging.preprocess import preprocess_pixels
from spark_cnn.models.loader import build_module
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import ModelSpec
from spark_cnn.models.tensors import normalise
from spark_cnn.models.tv_weights import resolve_torchvision_weights
from spark_cnn.spark.planning import check_model
from tests.torch_home import IMAGES, assert_logits_close, seed_weights


@pytest.fixture
def torch_home(tmp_path, monkeypatch) -> str:
    home = str(tmp_path / "torch_home")
    monkeypatch.setenv("TORCH_HOME", home)
    return home


def _ours(endpoint, data: bytes) -> np.ndarray:
    module = build_module(endpoint.source, endpoint.weights, endpoint.weights_enum)
    pixels = torch.from_numpy(preprocess_pixels(data, endpoint.preprocessing).copy())[None]
    with torch.inference_mode():
        return module(normalise(pixels, endpoint.preprocessing))[0].numpy()


def _torchvisions(model: str, weights, data: bytes) -> np.ndarray:
    reference = torchvision.models.get_model(model, weights=weights).eval()  # its own loader, from TORCH_HOME
    with Image.open(io.BytesIO(data)) as image, torch.inference_mode():
        return reference(weights.transforms()(image.convert("RGB"))[None])[0].numpy()


def _placeholder(torch_home: str, model: str, member: str) -> None:
    """Resolution alone only needs the cached file to exist."""
    import os

    from spark_cnn.models.weights import cached_path

    path = cached_path(os.path.join(torch_home, "hub"), torchvision.models.get_model_weights(model)[member].url)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()


@pytest.mark.parametrize("model, text, label, resize, crop, interpolation", [
    ("resnet50", "DEFAULT", "ResNet50_Weights.IMAGENET1K_V2", 232, 224, "bilinear"),
    ("resnet50", "ResNet50_Weights.IMAGENET1K_V1", "ResNet50_Weights.IMAGENET1K_V1", 256, 224, "bilinear"),
    ("inception_v3", "IMAGENET1K_V1", "Inception_V3_Weights.IMAGENET1K_V1", 342, 299, "bilinear"),
    ("efficientnet_b1", "IMAGENET1K_V2", "EfficientNet_B1_Weights.IMAGENET1K_V2", 255, 240, "bilinear"),
    ("efficientnet_b0", "DEFAULT", "EfficientNet_B0_Weights.IMAGENET1K_V1", 256, 224, "bicubic"),
])
def test_named_weights_bring_their_preprocessing_and_categories(torch_home, model, text, label, resize, crop,
                                                               interpolation):
    member = label.rpartition(".")[2]
    _placeholder(torch_home, model, member)
    resolved = resolve_torchvision_weights(model, text)
    enum = torchvision.models.get_model_weights(model)[member]
    assert resolved.label == resolved.enum == label
    assert resolved.file == f"{torch_home}/hub/checkpoints/{enum.url.rpartition('/')[2]}"
    prep = resolved.preprocessing
    assert (prep["resize"], prep["crop"], prep["interpolation"]) == (resize, crop, interpolation)
    assert resolved.categories == tuple(enum.meta["categories"]) and len(resolved.categories) == 1000


def test_bad_names_are_refused_before_anything_loads(torch_home):
    with pytest.raises(ConfigError, match="valid: IMAGENET1K_V1, DEFAULT"):
        resolve_torchvision_weights("mobilenet_v3_small", "IMAGENET1K_V2")
    with pytest.raises(ConfigError, match="ResNet50_Weights is another model's weights"):
        resolve_torchvision_weights("resnet18", "ResNet50_Weights.DEFAULT")


def test_without_a_cached_file_or_network_the_error_says_where_to_put_it(torch_home, monkeypatch):
    for name in ("https_proxy", "HTTPS_PROXY"):  # nothing listens there: the download fails at once
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    expected = f"{torch_home}/hub/checkpoints/mobilenet_v3_small-047dcff4.pth"
    with pytest.raises(ModelError) as caught:
        resolve_endpoint(ModelSpec("mobilenet_v3_small", weights="DEFAULT"))
    message = str(caught.value)
    assert "\n" not in message and f"put https://download.pytorch.org/models/mobilenet_v3_small-047dcff4.pth at " \
        f"{expected}, or pass --weights FILE" in message


@pytest.mark.parametrize("model, text", [("mobilenet_v3_small", "DEFAULT"), ("googlenet", "IMAGENET1K_V1"),
                                         ("densenet121", "DEFAULT"), ("efficientnet_b0", "DEFAULT")])
def test_logits_equal_torchvisions_build_fed_by_the_enums_transforms(torch_home, model, text):
    seed_weights(torch_home, model, text, old_densenet_keys=model.startswith("densenet"))
    endpoint = resolve_endpoint(ModelSpec(model, weights=text), logits=True).endpoint
    weights = torchvision.models.get_model_weights(model)[text]
    for data in IMAGES:
        assert_logits_close(_ours(endpoint, data), _torchvisions(model, weights, data))


@pytest.mark.parametrize("model", ["googlenet", "inception_v3"])
def test_a_torchvision_format_state_dict_file_means_what_torchvision_means(torch_home, model):
    """A plain file (no enum) for googlenet or inception_v3: transform_input on, aux heads off, as torchvision's
    builder does for its pretrained weights."""
    path = seed_weights(torch_home, model)
    weights = torchvision.models.get_model_weights(model).DEFAULT
    module = build_module(model, path)
    reference = torchvision.models.get_model(model, weights=weights).eval()
    assert module.transform_input and not module.aux_logits
    images = torch.randn(2, 3, 299, 299)
    with torch.inference_mode():
        assert_logits_close(module(images).numpy(), reference(images).numpy())


def test_check_model_names_the_weights_labels_and_warns_only_on_implicit_random(torch_home, caplog):
    seed_weights(torch_home, "mobilenet_v3_small")
    checked = check_model(InferenceOptions(ModelSpec("mobilenet_v3_small", weights="DEFAULT")))
    assert checked.weights_label == "MobileNet_V3_Small_Weights.IMAGENET1K_V1"
    assert checked.labels == tuple(torchvision.models.MobileNet_V3_Small_Weights.DEFAULT.meta["categories"])
    assert checked.endpoint.weights_enum == "MobileNet_V3_Small_Weights.IMAGENET1K_V1"
    own = check_model(InferenceOptions(ModelSpec("mobilenet_v3_small", weights="DEFAULT"), labels=["a"] * 1000))
    assert own.labels == ("a",) * 1000  # --labels override the categories
    assert not caplog.records
    with caplog.at_level(logging.WARNING):
        randomly = check_model(InferenceOptions(ModelSpec("mobilenet_v3_small")))
        assert randomly.weights_label == "random" and randomly.labels is None
        assert [r.getMessage().count("\n") for r in caplog.records] == [0]
        assert "runs with random weights" in caplog.records[0].getMessage()
        caplog.clear()
        assert check_model(InferenceOptions(ModelSpec("mobilenet_v3_small", weights="random"))).weights_label == \
            "random"
        assert not caplog.records


def test_explicit_preprocessing_overrides_the_weights(torch_home):
    seed_weights(torch_home, "mobilenet_v3_small")
    spec = ModelSpec("mobilenet_v3_small", weights="DEFAULT",
                     preprocessing={"resize": 160, "crop": 128, "interpolation": "bicubic", "mean": (0.5,) * 3})
    prep = resolve_endpoint(spec).endpoint.preprocessing
    assert (prep.resize, prep.crop, prep.interpolation, prep.mean) == (160, 128, "bicubic", (0.5,) * 3)
    assert prep.std == (0.229, 0.224, 0.225)  # not overridden: the weights'


def test_the_classify_command_takes_weights_names_and_interpolation(torch_home):
    from spark_cnn.cli import build_parser, classify

    seed_weights(torch_home, "mobilenet_v3_small")
    args = build_parser().parse_args(["classify", "in/", "out/", "--model", "mobilenet_v3_small", "--weights",
                                      "MobileNet_V3_Small_Weights.IMAGENET1K_V1", "--interpolation", "bicubic"])
    checked = check_model(classify.classify_config(args).inference)
    assert checked.weights_label == "MobileNet_V3_Small_Weights.IMAGENET1K_V1"
    assert (checked.endpoint.preprocessing.interpolation, checked.endpoint.preprocessing.resize) == ("bicubic", 256)
    with pytest.raises(SystemExit):  # argparse: choices from imaging.preprocess.INTERPOLATIONS
        build_parser().parse_args(["classify", "in/", "out/", "--interpolation", "nearest"])


def test_profile_and_plan_use_the_named_weights_and_their_crop(torch_home):
    from spark_cnn.perf_tools.commands import _model_and_cost

    seed_weights(torch_home, "efficientnet_b1", "IMAGENET1K_V2")
    _, shape, _, label = _model_and_cost(ModelSpec("efficientnet_b1", weights="IMAGENET1K_V2"))
    assert (shape, label) == ((3, 240, 240), "EfficientNet_B1_Weights.IMAGENET1K_V2")
