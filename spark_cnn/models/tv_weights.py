"""torchvision's weights by name: the enum member, its file in torch's cache (downloaded once when missing), the
preprocessing its `transforms()` describe and its categories; and the build arguments torchvision's own builder
uses with those weights. Imports torch: driver child and sidecar only.
"""

from __future__ import annotations

import os

import torch
import torchvision

from spark_cnn.errors import ModelError
from spark_cnn.models.weights import ResolvedWeights, cached_path, pick_member

# Builders that size the model from the weights' meta["min_size"], and the argument they set (vit_*, maxvit_*).
SIZE_ARGUMENTS = (("vit_", "image_size", 0), ("maxvit_", "input_size", None))


def weights_enum(model: str, text: str):
    """The member of `model`'s weights enum that `text` names (ConfigError listing the valid ones if none)."""
    try:
        enum = torchvision.models.get_model_weights(model)
    except (ValueError, KeyError) as e:
        raise ModelError(f"--model {model}: unknown torchvision model, so it has no weights named {text}") from e
    return enum[pick_member(model, text, enum.__name__, list(enum.__members__))]


def enum_name(weights) -> str:
    """`ResNet50_Weights.IMAGENET1K_V2`: the canonical full name (DEFAULT is an alias of a member)."""
    return f"{type(weights).__name__}.{weights.name}"


def resolve_torchvision_weights(model: str, text: str) -> ResolvedWeights:
    """Named torchvision weights -> their cached file, preprocessing (from `transforms()`) and categories."""
    weights = weights_enum(model, text)
    transforms = weights.transforms()
    preprocessing = {"resize": _one(transforms.resize_size), "crop": _one(transforms.crop_size),
                     "interpolation": transforms.interpolation.value, "mean": tuple(transforms.mean),
                     "std": tuple(transforms.std)}
    categories = weights.meta.get("categories")
    return ResolvedWeights(file=fetch(weights, text), label=enum_name(weights), enum=enum_name(weights),
                           preprocessing=preprocessing, categories=tuple(categories) if categories else None)


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
    arguments = {"num_classes": len(weights.meta["categories"])}
    for prefix, name, index in SIZE_ARGUMENTS:
        if model.startswith(prefix):
            size = weights.meta["min_size"]
            arguments[name] = size if index is None else size[index]
    return arguments


def _one(size) -> int:
    """transforms keep sizes as one-element lists."""
    return int(size[0]) if isinstance(size, list | tuple) else int(size)
