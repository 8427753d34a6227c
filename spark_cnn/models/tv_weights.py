"""torchvision's weights by name: the enum member, its file in torch's cache (downloaded once when missing), the
preprocessing its `transforms()` describe and its categories; and the build arguments torchvision's own builder
uses with those weights. Imports torch: driver child and sidecar only.
"""

from __future__ import annotations

import os

import torch
import torchvision
from torchvision.transforms._presets import ImageClassification

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.imaging.preprocess import INTERPOLATIONS
from spark_cnn.models.weights import ResolvedWeights, cached_path, pick_member

# Builders that size the model from the weights' meta["min_size"], and the argument they set (vit_*, maxvit_*).
SIZE_ARGUMENTS = (("vit_", "image_size", 0), ("maxvit_", "input_size", None))


def torchvision_names() -> list[str]:
    """The torchvision models `--model NAME` builds: classification, detection and segmentation."""
    return [name for module in (torchvision.models, torchvision.models.detection, torchvision.models.segmentation)
            for name in torchvision.models.list_models(module=module)]


def weights_enum(model: str, text: str):
    """The member of `model`'s weights enum that `text` names (ConfigError listing the valid ones if none)."""
    # get_model_weights also knows the quantized and video models, which we do not build
    if model not in torchvision_names():
        raise ModelError(f"--model {model}: not a torchvision classification, detection or segmentation model, so "
                         f"it has no weights named {text}")
    enum = torchvision.models.get_model_weights(model)
    return enum[pick_member(model, text, enum.__name__, list(enum.__members__))]


def enum_name(weights) -> str:
    """`ResNet50_Weights.IMAGENET1K_V2`: the canonical full name (DEFAULT is an alias of a member)."""
    return f"{type(weights).__name__}.{weights.name}"


def resolve_torchvision_weights(model: str, text: str) -> ResolvedWeights:
    """Named torchvision weights -> their cached file, preprocessing (from `transforms()`) and categories."""
    weights = weights_enum(model, text)
    categories = weights.meta.get("categories")
    if not categories:
        classifiers = [name for name, member in type(weights).__members__.items() if member.meta.get("categories")]
        raise ConfigError(f"--weights {text}: {enum_name(weights)} are feature-extraction weights without a "
                          f"classifier (torchvision names no categories for them); --model {model} classifies "
                          f"with {', '.join(classifiers)}")
    preprocessing = dense_preprocessing(weights.transforms())
    if preprocessing is None:
        preprocessing = transforms_preprocessing(weights.transforms(), enum_name(weights))
    return ResolvedWeights(file=fetch(weights, text), label=enum_name(weights), enum=enum_name(weights),
                           preprocessing=preprocessing, categories=tuple(categories))


def dense_preprocessing(transforms) -> dict | None:
    """The Preprocessing fields of a detector's or segmenter's weights: none for detection (the model's own
    transform normalises and resizes), the shorter side and mean/std for segmentation; None for other presets."""
    from torchvision.transforms._presets import ObjectDetection, SemanticSegmentation

    if isinstance(transforms, ObjectDetection):
        return {}
    if isinstance(transforms, SemanticSegmentation):
        size = int(transforms.resize_size[0])
        return {"resize": size, "crop": size, "interpolation": transforms.interpolation.value,
                "mean": tuple(transforms.mean), "std": tuple(transforms.std)}
    return None


def transforms_preprocessing(transforms, label: str) -> dict:
    """The Preprocessing fields that do what torchvision's `transforms` (of the weights `label`) do; a ModelError
    for transforms this preprocessing cannot do: another preset than ImageClassification (resize the shorter
    side, centre crop, normalise), a non-square size, a filter Pillow's resize does not share with it, or a
    resize without antialiasing (Pillow's filters always antialias)."""
    if not isinstance(transforms, ImageClassification):
        raise ModelError(f"--weights {label}: their transforms are {type(transforms).__name__}, not "
                         "ImageClassification (resize, centre crop, normalise), which is all spark_cnn's "
                         "preprocessing does; pass the weights as a state_dict file with --resize/--crop/--mean/--std")
    interpolation = transforms.interpolation.value
    problem = None
    if len(transforms.resize_size) != 1 or len(transforms.crop_size) != 1:
        problem = f"resize to {transforms.resize_size} and crop to {transforms.crop_size} (not one size each)"
    elif interpolation not in INTERPOLATIONS:
        problem = f"resize with {interpolation} interpolation (spark_cnn has {', '.join(INTERPOLATIONS)})"
    elif transforms.antialias is False:
        problem = "resize without antialiasing (spark_cnn's resize always antialiases, as Pillow's does)"
    if problem:
        raise ModelError(f"--weights {label}: their transforms {problem}; pass the weights as a state_dict file "
                         "with --resize/--crop/--interpolation of your choice")
    return {"resize": int(transforms.resize_size[0]), "crop": int(transforms.crop_size[0]),
            "interpolation": interpolation, "mean": tuple(transforms.mean), "std": tuple(transforms.std)}


def fetch(weights, text: str) -> str:
    """The file of `weights` in torch's cache (`$TORCH_HOME/hub/checkpoints/<file name of its URL>`), downloaded
    there by torch's own loader (hash-checked) when missing; a one-line ModelError when it cannot be."""
    path = cached_path(torch.hub.get_dir(), weights.url)
    if os.path.isfile(path):
        return path
    match = torch.hub.HASH_REGEX.search(os.path.basename(path))
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.hub.download_url_to_file(weights.url, path, match.group(1) if match else None, progress=False)
    except Exception as e:
        reason = (str(e).strip().splitlines() or [""])[0]
        raise ModelError(f"--weights {text}: {enum_name(weights)} is not cached and cannot be downloaded "
                         f"({type(e).__name__}: {reason}); put {weights.url} at {path}, or pass --weights FILE") from e
    return path


def builder_arguments(model: str, enum: str) -> dict:
    """What torchvision's builder of `model` sets when given these weights: the class count, and the input size
    of the models sized by their weights. (googlenet and inception_v3: see loader.AUX_HEAD_MODELS.)"""
    weights = torchvision.models.get_weight(enum)
    if type(weights) is not torchvision.models.get_model_weights(model):
        raise ModelError(f"--weights {enum} are not weights of --model {model}")
    categories = weights.meta["categories"]
    arguments = {"num_classes": len(categories)} if categories is not None else {}  # as torchvision's vgg builder
    if "keypoint_names" in weights.meta:  # keypoint R-CNN: its keypoint head's size
        arguments["num_keypoints"] = len(weights.meta["keypoint_names"])
    for prefix, name, index in SIZE_ARGUMENTS:
        if model.startswith(prefix):
            size = weights.meta["min_size"]
            arguments[name] = size if index is None else size[index]
    return arguments
