"""Every classification weight enum torchvision has, used as torchvision uses it.

Fast, for every member of every weights enum of `torchvision.models.list_models(module=torchvision.models)`:
what our resolution derives (preprocessing, categories, file) equals the enum's `transforms()` and meta, and the
model we build for the weights is constructed with the arguments torchvision's builder uses for them (the
constructor call is intercepted: no model is made, no weights are loaded).

Slow: logits of our model, built through the product's loading path from a torchvision-format state_dict seeded
in a private TORCH_HOME, equal `torchvision.models.get_model(name, weights=W)` fed with `W.transforms()` output,
on real photos, for every enum whose model is under SLOW_MAX_GFLOPS and SLOW_MAX_PARAMS, plus one of each family
above them. Tolerance as in test_tv_weights.py.
"""

from __future__ import annotations

import functools
import io
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
import torchvision
from PIL import Image
from torchvision.transforms._presets import ImageClassification, VideoClassification

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.imaging.preprocess import Preprocessing, preprocess_pixels
from spark_cnn.models.loader import AUX_HEAD_MODELS, build_module
from spark_cnn.models.resolve import resolve_weights
from spark_cnn.models.spec import ModelSpec
from spark_cnn.models.tensors import normalise
from spark_cnn.models.tv_weights import enum_name, resolve_torchvision_weights, transforms_preprocessing
from spark_cnn.models.weights import cached_path
from tests.sample_images import real_image_files
from tests.torch_home import assert_logits_close, construction, seed_weights, torchvision_construction

MODELS = torchvision.models.list_models(module=torchvision.models)
ALL_WEIGHTS = [weights for model in MODELS for weights in torchvision.models.get_model_weights(model)]
MODEL_OF = {weights: model for model in MODELS for weights in torchvision.models.get_model_weights(model)}
# torchvision's feature-extraction weights (vgg16's IMAGENET1K_FEATURES) have no categories: no classifier.
CLASSIFIERS = [w for w in ALL_WEIGHTS if w.meta.get("categories")]
FEATURE_ONLY = [w for w in ALL_WEIGHTS if not w.meta.get("categories")]


@pytest.fixture
def torch_home(tmp_path, monkeypatch) -> str:
    home = str(tmp_path / "torch_home")
    monkeypatch.setenv("TORCH_HOME", home)
    return home


def _placeholder(torch_home: str, weights) -> str:
    """Resolution alone only needs the cached file to exist."""
    path = cached_path(os.path.join(torch_home, "hub"), weights.url)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "wb").close()
    return path


def test_the_zoo_is_what_this_test_was_written_for():
    """A torchvision that adds or drops enums changes these counts: look at the new ones (and the slow list)."""
    assert (len(MODELS), len(ALL_WEIGHTS), len(CLASSIFIERS)) == (80, 115, 114)
    assert [enum_name(w) for w in FEATURE_ONLY] == ["VGG16_Weights.IMAGENET1K_FEATURES"]


@pytest.mark.parametrize("weights", CLASSIFIERS, ids=enum_name)
def test_every_classification_weight_resolves_to_its_transforms_and_categories(torch_home, weights):
    model = MODEL_OF[weights]
    path = _placeholder(torch_home, weights)
    resolved = resolve_torchvision_weights(model, enum_name(weights))
    assert resolved.enum == resolved.label == enum_name(weights) and resolved.file == path
    assert resolved.categories == tuple(weights.meta["categories"])
    theirs = weights.transforms()
    assert type(theirs) is ImageClassification
    assert theirs.antialias is True  # Pillow's resize, ours, always antialiases
    prep = Preprocessing.from_dict(resolved.preprocessing)
    assert ([prep.resize], [prep.crop], prep.interpolation, list(prep.mean), list(prep.std)) == \
        (theirs.resize_size, theirs.crop_size, theirs.interpolation.value, theirs.mean, theirs.std)


def _canonical(value):
    """A comparable form of a constructor argument: configs and partials by their contents, modules by repr."""
    if isinstance(value, functools.partial):
        return ("partial", _canonical(value.func), _canonical(value.args), _canonical(value.keywords))
    if isinstance(value, torch.nn.Module):
        return ("module", repr(value))
    if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__"):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, dict):
        return {key: _canonical(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return (type(value).__name__, [_canonical(item) for item in value])
    if hasattr(value, "__dict__"):
        return (type(value).__qualname__, _canonical(vars(value)))
    return value


@pytest.mark.parametrize("weights", ALL_WEIGHTS, ids=enum_name)
def test_every_weight_builds_the_model_torchvisions_builder_builds_for_it(weights):
    model = MODEL_OF[weights]
    cls, args, theirs = torchvision_construction(model, weights)
    our_cls, our_args, ours = construction(model, lambda: build_module(model, "weights.pth", enum_name(weights)))
    theirs, ours = dict(theirs), dict(ours)
    # What torchvision sets only for loading, to the same model in the end: init_weights skips the random
    # initialisation the weights overwrite; aux_logits builds the training-only auxiliary heads to load them,
    # which torchvision then drops (we drop their weights instead and build without them).
    theirs.pop("init_weights", None)
    ours.pop("init_weights", None)
    if model in AUX_HEAD_MODELS:
        assert (theirs.pop("aux_logits"), ours.pop("aux_logits")) == (True, False)
        assert ours["transform_input"] is True
    assert our_cls is cls
    assert _canonical(our_args) == _canonical(args)
    assert _canonical(ours) == _canonical(theirs)


@pytest.mark.parametrize("weights", FEATURE_ONLY, ids=enum_name)
def test_feature_extraction_weights_are_refused_naming_the_classifying_ones(torch_home, weights):
    model = MODEL_OF[weights]
    _placeholder(torch_home, weights)
    classifiers = ", ".join(name for name, w in type(weights).__members__.items() if w.meta.get("categories"))
    with pytest.raises(ConfigError, match=f"feature-extraction weights without a classifier .* --model {model} "
                                          f"classifies with {classifiers}$") as caught:
        resolve_torchvision_weights(model, enum_name(weights))
    assert "\n" not in str(caught.value)


@pytest.mark.parametrize("transforms, problem", [
    (torchvision.models.video.R3D_18_Weights.DEFAULT.transforms(), "their transforms are VideoClassification, not "
                                                                    "ImageClassification"),
    (ImageClassification(crop_size=224, interpolation=torchvision.transforms.InterpolationMode.NEAREST),
     "resize with nearest interpolation"),
    (ImageClassification(crop_size=224, antialias=False), "resize without antialiasing"),
])
def test_transforms_our_preprocessing_cannot_do_are_refused_in_one_line(transforms, problem):
    with pytest.raises(ModelError, match=problem) as caught:
        transforms_preprocessing(transforms, "Some_Weights.V1")
    assert str(caught.value).startswith("--weights Some_Weights.V1: ") and "\n" not in str(caught.value)
    assert isinstance(torchvision.models.video.R3D_18_Weights.DEFAULT.transforms(), VideoClassification)


@pytest.mark.parametrize("model", ["r3d_18", "quantized_resnet50", "raft_small"])
def test_weights_of_models_that_are_not_our_classifiers_are_refused_before_any_download(torch_home, model):
    """torchvision has weights enums for them, but they are not models --model builds."""
    with pytest.raises(ModelError, match=f"--model {model}: not a torchvision classification, detection or "
                                         "segmentation model"):
        resolve_torchvision_weights(model, "DEFAULT")


# --- logits, slow -------------------------------------------------------------------------------------------------

# Bounds for the whole-zoo logits test on this 2-core CPU. Each enum costs 6 image forwards at its crop (batch-norm
# calibration and each side on the 2 photos; the first of a family 1 more, the sensitivity check) and three builds
# (seed, ours, torchvision's) that initialise, save or load every parameter. Forwards dominate, so the bound is on
# the enum's GFLOPs per image (meta "_ops"), and on parameters for the builds and the 4-byte-per-parameter file.
# Under it every enum took at most 0.9 s, the family representatives above it 1.8-5.5 s (vgg11's 133 M parameters
# the most), all 35 40 s wall (`pytest -m slow tests/integration/test_tv_weight_zoo.py --durations=0` on this
# 2-core machine at 18:04 UTC, niced, with a load of ~3.5 from other work).
SLOW_MAX_GFLOPS = 1.0
SLOW_MAX_PARAMS = 12_000_000
# One member of each family (torchvision builder module) with no enum under the bounds, and of efficientnet_v2
# (fused blocks, crop 384): the smallest, but swin_v2_t rather than swin_t (its V2 attention and 260/256
# preprocessing); resnet18 stands for resnet/resnext/wide_resnet, inception_v3 brings its 342/299.
SLOW_FAMILY_REPRESENTATIVES = ("Swin_V2_T_Weights.IMAGENET1K_V1", "ViT_B_32_Weights.IMAGENET1K_V1",
                               "MaxVit_T_Weights.IMAGENET1K_V1", "ConvNeXt_Tiny_Weights.IMAGENET1K_V1",
                               "EfficientNet_V2_S_Weights.IMAGENET1K_V1", "ResNet18_Weights.IMAGENET1K_V1",
                               "AlexNet_Weights.IMAGENET1K_V1", "VGG11_Weights.IMAGENET1K_V1",
                               "Inception_V3_Weights.IMAGENET1K_V1")
# Families whose logits test_tv_weights.py compares already, through the same loading path.
COVERED_IN_TEST_TV_WEIGHTS = ("googlenet", "densenet121")


def _family(model: str) -> str:
    return torchvision.models.get_model_builder(model).__module__


def _small(weights) -> bool:
    return weights.meta["_ops"] <= SLOW_MAX_GFLOPS and weights.meta["num_params"] <= SLOW_MAX_PARAMS


SLOW_WEIGHTS = [w for w in CLASSIFIERS if _small(w) or enum_name(w) in SLOW_FAMILY_REPRESENTATIVES]
FIRST_OF_FAMILY = list({_family(MODEL_OF[w]): w for w in reversed(SLOW_WEIGHTS)}.values())
# Real photos, a landscape and a portrait one (shorter sides 427 and 280: downscaled and upscaled).
PHOTOS = [real_image_files()[name] for name in ("photos/flower.jpg", "photos/portrait/china_tall.jpg")]


def test_the_slow_zoo_covers_every_family():
    covered = {_family(MODEL_OF[w]) for w in SLOW_WEIGHTS} | {_family(m) for m in COVERED_IN_TEST_TV_WEIGHTS}
    assert covered == {_family(m) for m in MODELS}
    assert sorted(enum_name(w) for w in SLOW_WEIGHTS if not _small(w)) == sorted(SLOW_FAMILY_REPRESENTATIVES)


def _our_logits(module, prep: Preprocessing, photos: list[bytes]) -> np.ndarray:
    pixels = torch.from_numpy(np.stack([preprocess_pixels(data, prep) for data in photos]))
    with torch.inference_mode():
        return module(normalise(pixels, prep)).numpy()


def _transformed(weights, photos: list[bytes]) -> torch.Tensor:
    """The photos through the enum's own `transforms()`, as torchvision documents feeding its models."""
    inputs = []
    for data in photos:
        with Image.open(io.BytesIO(data)) as image:
            inputs.append(weights.transforms()(image.convert("RGB")))
    return torch.stack(inputs)


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op thread: on this shared 2-core machine, with other tests running alongside, two threads wait
    for each other's core (measured 18:00 UTC: 172 s with two threads, 43 s with one, though the former also ran
    the sensitivity check for every enum)."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.mark.slow
@pytest.mark.parametrize("weights", SLOW_WEIGHTS, ids=enum_name)
def test_logits_equal_torchvisions_build_fed_by_the_enums_transforms(torch_home, one_thread, weights):
    _assert_logits_equal(torch_home, weights)


@pytest.mark.slow
@pytest.mark.parametrize("weights", [torchvision.models.MNASNet0_5_Weights.IMAGENET1K_V1,
                                     torchvision.models.ViT_B_32_Weights.IMAGENET1K_V1], ids=enum_name)
def test_files_in_layouts_torchvisions_classes_still_load_give_the_same_logits(torch_home, one_thread, weights):
    """mnasnet's version-1 stem is chosen by the file's metadata, the old ViT keys by its lack: our load must keep
    what torchvision's keeps."""
    _assert_logits_equal(torch_home, weights, legacy_format=True)


def _assert_logits_equal(torch_home: str, weights, **seeding) -> None:
    model = MODEL_OF[weights]
    inputs = _transformed(weights, PHOTOS)
    seed_weights(torch_home, model, weights.name, calibration=inputs, **seeding)
    # The product's path: the driver resolves the name (resolve_endpoint's preprocessing, without its probe
    # forward), the sidecar builds the module from the shipped file and the enum.
    spec = ModelSpec(model, weights=enum_name(weights))
    resolved = resolve_weights(spec)
    prep = spec.preprocessing_over(Preprocessing.from_dict(resolved.preprocessing))
    module = build_module(spec.source, resolved.file, resolved.enum)
    ours = _our_logits(module, prep, PHOTOS)
    del module
    reference = torchvision.models.get_model(model, weights=weights).eval()  # its own loader, from TORCH_HOME
    with torch.inference_mode():
        expected = reference(inputs).numpy()
    assert_logits_close(ours, expected)
    if weights in FIRST_OF_FAMILY:
        _assert_a_wrong_filter_shows(reference, prep, expected[0])


def _assert_a_wrong_filter_shows(reference, prep: Preprocessing, expected: np.ndarray) -> None:
    """The comparison can fail: the first photo through the other resampling filter gives other logits. Once a
    family: what decides it is how the family's random network depends on its input (see torch_home.py)."""
    other = replace(prep, interpolation="bicubic" if prep.interpolation == "bilinear" else "bilinear")
    pixels = torch.from_numpy(preprocess_pixels(PHOTOS[0], other).copy())[None]
    with torch.inference_mode():
        moved = reference(normalise(pixels, other))[0].numpy()
    with pytest.raises(AssertionError):
        assert_logits_close(moved, expected)
