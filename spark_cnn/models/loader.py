"""Build a torch module from a ModelSpec source and load its weights. Imports torch: driver and sidecar only.

TorchScript files and `module:factory` sources run the user's code: treat them as trusted code, like any Python
you import. State dicts are loaded with `weights_only=True`, which refuses pickled code.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from collections import OrderedDict

import torch
from torch import nn

from spark_cnn.errors import ModelError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.batchnorm_folding import fold_batchnorms
from spark_cnn.models.factory_code import factory_code_digest, factory_files
from spark_cnn.models.spec import model_kind

log = logging.getLogger(__name__)

# Torchvision models with training-only auxiliary classifiers, and the state-dict prefixes of those heads. Built for
# given weights, they are built as torchvision builds them for its pretrained weights: the input transform on
# (`transform_input=True`: the weights expect it) and the auxiliary heads off.
AUX_HEAD_MODELS = {"googlenet": ("aux1.", "aux2."), "inception_v3": ("AuxLogits.",)}
# torchvision's densenet files keep the old key names ('norm.1'); its builder renames them on load, as we do.
_DENSENET_OLD_KEY = re.compile(r"^(.*denselayer\d+\.(?:norm|relu|conv))\.((?:[12])\.(?:weight|bias|running_mean|"
                               r"running_var))$")
# A module (or factory) may declare its own preprocessing as this attribute: a dict of Preprocessing fields.
PREPROCESSING_ATTRIBUTE = "spark_cnn_preprocessing"


def build_module(source: str, weights: str | None = None, weights_enum: str | None = None, *,
                 kind: str | None = None) -> nn.Module:
    """The model named by `source`, weights loaded, in eval mode, on the CPU. `weights_enum`: the torchvision
    weights (`ResNet50_Weights.IMAGENET1K_V2`) the `weights` file holds; the model is built as torchvision's
    builder builds it for them (`get_model(name, weights=...)`), without torchvision's pickle-trusting load.
    For an MLflow model `weights` is its model file (mlflow_models.load_mlflow_file). `kind`: the source's kind
    when known (default: from `source`)."""
    kind = kind or model_kind(source)
    if kind == "mlflow":
        from spark_cnn.models.mlflow_models import load_mlflow_file

        if not weights:
            raise ModelError(f"--model {source}: an MLflow model needs its resolved model file")
        return _folded(load_mlflow_file(weights, source).eval())
    if kind == "simulated":
        from spark_cnn.models.simulated import simulated_module

        return simulated_module(source).eval()
    if kind == "timm":
        from spark_cnn.models.timm_models import timm_module

        module = timm_module(source)
    elif kind == "torchscript":
        try:
            module = torch.jit.load(source, map_location="cpu")
        except Exception as e:
            raise ModelError(f"--model {source}: not a loadable TorchScript file ({type(e).__name__}: {e})") from e
    elif kind == "factory":
        module = _from_factory(source)
    else:
        module = _torchvision_model(source, pretrained=bool(weights), weights_enum=weights_enum)
    if weights:
        module = _load_weights(module, source, weights, weights_enum)
    return module.eval() if kind == "torchscript" else _folded(module.eval())


def _folded(module: nn.Module) -> nn.Module:
    """`module` with its BatchNorms folded into the convolutions before them (models/batchnorm_folding.py): what
    the sidecar runs, and what the time model prices, since both build the model here."""
    folded = fold_batchnorms(module)
    if folded:
        log.debug("folded %d BatchNorm(s) of %s into their convolutions", folded, type(module).__name__)
    return module


def declared_preprocessing(module: nn.Module) -> Preprocessing | None:
    declared = getattr(module, PREPROCESSING_ATTRIBUTE, None)
    return Preprocessing.from_dict(dict(declared)) if declared else None


def _torchvision_model(name: str, num_classes: int | None = None, *, pretrained: bool = False,
                       weights_enum: str | None = None) -> nn.Module:
    # Imported here: torchvision costs a sidecar 2.3 s of start (its ops import torch._dynamo), and a TorchScript,
    # MLflow or module:factory model never needs it.
    import torchvision

    from spark_cnn.models.tv_weights import builder_arguments, torchvision_names

    if name not in torchvision_names():
        raise ModelError(f"--model {name}: unknown model; use a torchvision classification, detection or "
                         f"segmentation model name (e.g. resnet50, fasterrcnn_mobilenet_v3_large_320_fpn, "
                         f"lraspp_mobilenet_v3_large), a TorchScript file, or module:factory")
    extra = {}
    if name in _dense_names():
        extra["weights_backbone"] = None  # never the ImageNet backbone download: the whole model's weights follow
    if weights_enum is not None:
        extra.update(builder_arguments(name, weights_enum))
    if num_classes is not None:
        extra["num_classes"] = num_classes
    if name in AUX_HEAD_MODELS:
        extra["aux_logits"] = False  # auxiliary heads only serve training; their weights are dropped on load
        extra["init_weights"] = False
        if pretrained:
            extra["transform_input"] = True
    return torchvision.models.get_model(name, weights=None, **extra)


def _dense_names() -> set[str]:
    import torchvision

    return set(torchvision.models.list_models(module=torchvision.models.detection)) | set(
        torchvision.models.list_models(module=torchvision.models.segmentation))


# Segmenters' auxiliary heads serve training only; torchvision's weights files carry them.
SEGMENT_AUX_PREFIX = "aux_classifier."


def _from_factory(source: str) -> nn.Module:
    module_name, _, attr = source.partition(":")
    try:
        factory = getattr(_import_current(module_name), attr)
    except (ImportError, AttributeError, ValueError) as e:  # ValueError: an empty module name
        raise ModelError(f"--model {source}: cannot import {attr!r} from {module_name!r} ({e}); the module must be "
                         f"importable on the driver and executors (e.g. spark-submit --py-files)") from e
    module = factory()
    if not isinstance(module, nn.Module):
        raise ModelError(f"--model {source}: the factory returned {type(module).__name__}, expected torch.nn.Module")
    return module


# The code digest (factory_code.py) of each factory module as this process imported it. A warm sidecar asked for
# an edited factory (a new fingerprint) must not build it from the module it imported before.
_imported_code: dict[str, str] = {}
_import_lock = threading.Lock()


def _import_current(module_name: str):
    """`module_name` imported as its files are now: when its code changed since this process imported it, its
    modules (those of factory_files) are dropped and imported again, compiled from source."""
    with _import_lock:
        digest = factory_code_digest(module_name)
        if _imported_code.get(module_name, digest) == digest:
            module = importlib.import_module(module_name)
        else:
            _, files = factory_files(module_name)
            stale = set(files)
            for name, loaded in list(sys.modules.items()):
                path = getattr(loaded, "__file__", None)
                if isinstance(path, str) and os.path.abspath(path) in stale:
                    del sys.modules[name]
            importlib.invalidate_caches()
            # Cached bytecode is trusted by size and modification time, which an edit can leave as they were.
            prefix, sys.pycache_prefix = sys.pycache_prefix, tempfile.mkdtemp(prefix="spark_cnn_factory_")
            try:
                module = importlib.import_module(module_name)
            finally:
                shutil.rmtree(sys.pycache_prefix, ignore_errors=True)
                sys.pycache_prefix = prefix
        _imported_code[module_name] = digest
        return module


def _load_weights(module: nn.Module, source: str, weights: str, weights_enum: str | None = None) -> nn.Module:
    try:
        state = torch.load(weights, map_location="cpu", weights_only=True)
    except Exception as e:
        raise ModelError(f"--weights {weights}: not a loadable state_dict ({type(e).__name__}: {e})") from e
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ModelError(f"--weights {weights}: expected a state_dict (a dict of tensors, torch.save(model."
                         f"state_dict(), path)), found {type(state).__name__}")
    kind = model_kind(source)
    torchvision_model = kind == "torchvision"
    aux_prefixes = AUX_HEAD_MODELS.get(source, ()) if torchvision_model else ()
    if torchvision_model and source in _dense_names():
        aux_prefixes = (SEGMENT_AUX_PREFIX,)
    if aux_prefixes:
        state = _keeping_metadata({k: v for k, v in state.items() if not k.startswith(aux_prefixes)}, state)
    if torchvision_model and source.startswith("densenet"):
        state = _keeping_metadata({_DENSENET_OLD_KEY.sub(r"\1\2", k): v for k, v in state.items()}, state)
    try:
        module.load_state_dict(state)
        return module
    except RuntimeError as e:
        first_error = e
    # A torchvision or timm model fine-tuned to another class count: rebuild it with the count the weights carry.
    classes = _dense_classes(source, state) if torchvision_model and source in _dense_names() else \
        _classifier_classes(state)
    if kind in ("torchvision", "timm") and classes is not None and weights_enum is None:
        if torchvision_model:
            rebuilt = _torchvision_model(source, num_classes=classes, pretrained=True)
        else:
            from spark_cnn.models.timm_models import timm_module

            rebuilt = timm_module(source, num_classes=classes)
        try:
            rebuilt.load_state_dict(state)
            return rebuilt
        except RuntimeError:
            pass
    summary = str(first_error).strip().splitlines()
    detail = "; ".join(line.strip() for line in summary[:3])
    raise ModelError(f"--weights {weights} do not fit --model {source}: {detail}") from first_error


def _keeping_metadata(state: dict, loaded: dict) -> dict:
    """`state` with the `_metadata` of the state_dict it came from: the module versions by which torchvision's
    classes read older layouts (mnasnet's v1 stem, ViT's old keys), as torchvision's own loading keeps them."""
    metadata = getattr(loaded, "_metadata", None)
    if metadata is None:
        return state
    kept = OrderedDict(state)
    kept._metadata = metadata
    return kept


# Where a detector's or segmenter's state_dict holds its class count: (key, anchors per position it multiplies).
_DENSE_CLASS_KEYS = (("roi_heads.box_predictor.cls_score.weight", 1), ("head.classification_head.cls_logits.weight", 0),
                     ("classifier.4.weight", 1), ("classifier.low_classifier.weight", 1))
RETINANET_ANCHORS = 9  # torchvision's RetinaNet: 3 scales x 3 aspect ratios per position


def _dense_classes(source: str, state: dict) -> int | None:
    """Classes of a torchvision detector's or segmenter's state_dict (fine-tuned to another count), if found."""
    for key, per in _DENSE_CLASS_KEYS:
        if key in state:
            anchors = per or (RETINANET_ANCHORS if source.startswith("retinanet") else 1)
            return int(state[key].shape[0]) // anchors
    return None


def _classifier_classes(state: dict) -> int | None:
    """Output count of the last 2-D weight in the state dict (the final classifier, in torchvision models)."""
    matrices = [v for k, v in state.items() if k.endswith("weight") and v.dim() == 2]
    return int(matrices[-1].shape[0]) if matrices else None
