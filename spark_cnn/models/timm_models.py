"""timm models (`--model timm:NAME[.TAG]`, the `timm` extra): the module, its weights (a state_dict file, timm's
own pretrained loading, or random), the preprocessing of its data config and the class names of its pretrained
config. Imports torch: driver child and sidecar only; timm is imported when a timm model is asked for.
"""

from __future__ import annotations

import difflib
import math
import os
import tempfile

import torch
from torch import nn

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.imaging.preprocess import INTERPOLATIONS
from spark_cnn.models.extras import import_extra
from spark_cnn.models.spec import TIMM_PREFIX
from spark_cnn.models.weights import ResolvedWeights
from spark_cnn.paths import user_cache_dir

# timm's eval transforms crop this share of the resized image when the config names none (timm.data.constants).
DEFAULT_CROP_PCT = 0.875
# Close names offered for an unknown model.
SUGGESTIONS = 5


def _timm(source: str):
    return import_extra("timm", f"--model {source}")


def timm_module(source: str, *, pretrained: bool = False, num_classes: int | None = None) -> nn.Module:
    """`timm.create_model` for `timm:NAME[.TAG]`; a ModelError naming close matches for an unknown name."""
    timm = _timm(source)
    name = source[len(TIMM_PREFIX):]
    if not timm.is_model(name):
        close = difflib.get_close_matches(name.partition(".")[0], timm.list_models(), n=SUGGESTIONS)
        hint = f"; close: {', '.join(close)}" if close else ""
        raise ModelError(f"--model {source}: timm has no model {name!r}{hint} (timm.list_models() lists them)")
    extra = {} if num_classes is None else {"num_classes": num_classes}
    try:
        return timm.create_model(name, pretrained=pretrained, **extra)
    except Exception as e:
        reason = (str(e).strip().splitlines() or [""])[0]
        if pretrained:
            raise ModelError(f"--model {source} --weights DEFAULT: timm could not load its pretrained weights "
                             f"({type(e).__name__}: {reason}); check the network or the Hugging Face cache "
                             "(HF_HOME), or pass --weights FILE") from e
        raise ModelError(f"--model {source}: timm cannot build it ({type(e).__name__}: {reason})") from e


def resolve_timm_weights(source: str, weights: str | None, weights_file: str | None) -> ResolvedWeights:
    """What a timm model runs with: `weights_file` (a state_dict), timm's pretrained weights (`weights` DEFAULT:
    loaded by timm, saved as a state_dict file to ship), or its random initialisation; preprocessing from timm's
    data config for the model, and class names (pretrained weights only) from its pretrained config."""
    timm = _timm(source)
    pretrained = weights_file is None and weights is not None and weights != "random"
    module = timm_module(source, pretrained=pretrained)
    preprocessing = timm_preprocessing(source, timm.data.resolve_model_data_config(module))
    if not pretrained:
        return ResolvedWeights(file=weights_file, label="", preprocessing=preprocessing)
    categories = timm_categories(module)
    cfg = module.pretrained_cfg
    origin = f"hf-hub:{cfg['hf_hub_id']}" if cfg.get("hf_hub_id") else cfg.get("url") or cfg.get("file") or "timm"
    tagged = f"{cfg.get('architecture', source[len(TIMM_PREFIX):])}.{cfg['tag']}" if cfg.get("tag") else None
    return ResolvedWeights(file=_save_state(module, tagged or source[len(TIMM_PREFIX):]),
                           label=f"{TIMM_PREFIX}{tagged or source[len(TIMM_PREFIX):]} pretrained ({origin})",
                           preprocessing=preprocessing, categories=categories)


def timm_preprocessing(source: str, config: dict) -> dict:
    """Preprocessing fields from timm's data config (`resolve_model_data_config`), as timm's eval transforms
    apply it: shorter side to floor(size / crop_pct), centre crop `size`, the config's filter, mean and std."""
    _, height, width = config["input_size"]
    mode = config.get("crop_mode") or "center"
    interpolation = config.get("interpolation") or INTERPOLATIONS[0]
    if height != width or mode != "center" or interpolation not in INTERPOLATIONS:
        raise ConfigError(f"--model {source}: timm's data config asks for input {height}x{width}, crop mode {mode}, "
                          f"{interpolation} resampling; spark_cnn does square centre crops with "
                          f"{' or '.join(INTERPOLATIONS)}: pass --resize, --crop and --interpolation")
    crop_pct = config.get("crop_pct") or DEFAULT_CROP_PCT
    return {"resize": math.floor(height / crop_pct), "crop": int(height), "interpolation": interpolation,
            "mean": tuple(float(m) for m in config["mean"]), "std": tuple(float(s) for s in config["std"])}


def timm_categories(module: nn.Module) -> tuple[str, ...] | None:
    """Class names of the pretrained weights: the pretrained config's label names (with their descriptions when
    it has them), else the ImageNet subset timm infers from the class count, as timm's inference script labels
    it (descriptions); None when neither says."""
    import timm.data

    cfg = getattr(module, "pretrained_cfg", None) or {}
    names, descriptions = cfg.get("label_names"), cfg.get("label_descriptions") or {}
    if names:
        return tuple(descriptions.get(name, name) for name in names)
    subset = timm.data.infer_imagenet_subset(module)
    return tuple(timm.data.ImageNetInfo(subset).label_descriptions()) if subset else None


def timm_cache_dir() -> str:
    """Where timm's pretrained weights are kept as state_dict files to ship: $XDG_CACHE_HOME/spark_cnn/timm."""
    return user_cache_dir("timm")


def _save_state(module: nn.Module, name: str) -> str:
    """The module's state_dict saved (atomically) as `<cache>/<name>.pth`: executors load it as a weights file."""
    folder = timm_cache_dir()
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{name.replace('/', '_')}.pth")
    handle, partial = tempfile.mkstemp(dir=folder, suffix=".part")
    os.close(handle)
    try:
        torch.save(module.state_dict(), partial)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)
    return path
