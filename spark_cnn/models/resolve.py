"""Driver-side check of a model before any Spark work: it loads, accepts an image, and fits the options."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.spec import DEFAULT_TOP_K, Endpoint, ModelSpec, file_sha256
from spark_cnn.models.weights import BUILTIN, FILE, NAME, RANDOM, ResolvedWeights, weights_kind


@dataclass(frozen=True)
class ResolvedModel:
    """What the driver learned of a model: the endpoint the sidecars load, and the sizes its outputs have."""

    endpoint: Endpoint
    num_classes: int | None  # None for a raw output: no classes
    embedding_dim: int | None
    weights: ResolvedWeights = ResolvedWeights(file=None, label=BUILTIN)
    raw_shape: tuple[int, ...] | None = None  # the per-image shape of a raw output, from the blank image


# Characters of a weights file's SHA-256 in its label (as the shipped copies' names use).
LABEL_HASH_CHARS = 16


def resolve_weights(spec: ModelSpec) -> ResolvedWeights:
    """What `spec.weights` names, as a file to load and ship, a label and what the weights bring.

    The one place weights are resolved, by the model's source kind: torchvision names resolve through
    torchvision (its cache under TORCH_HOME, downloaded once when missing); a timm model brings timm's data config
    (and with DEFAULT timm's pretrained weights, saved as a file); an MLflow model resolves to its model file
    (downloaded once); other kinds take files only."""
    kind = weights_kind(spec.weights)
    if spec.kind == "mlflow":
        from spark_cnn.models.mlflow_models import resolve_mlflow_model

        return resolve_mlflow_model(spec.source)
    if spec.kind == "timm":
        from spark_cnn.models.timm_models import resolve_timm_weights

        resolved = resolve_timm_weights(spec.source, spec.weights, spec.weights if kind == FILE else None)
        if resolved.label:
            return resolved
        return replace(resolved, label=_file_label(resolved.file) if resolved.file else RANDOM)
    if kind == NAME and spec.kind == "torchvision":
        from spark_cnn.models.tv_weights import resolve_torchvision_weights

        return resolve_torchvision_weights(spec.source, spec.weights)
    if kind == FILE:
        return ResolvedWeights(file=spec.weights, label=_file_label(spec.weights))
    if kind == RANDOM or (kind is None and spec.kind == "torchvision"):
        return ResolvedWeights(file=None, label=RANDOM)
    if kind is None:
        return ResolvedWeights(file=None, label=BUILTIN)
    raise ConfigError(f"--weights {spec.weights}: --model {spec.source} ({spec.kind}) takes a state_dict file")


def _file_label(path: str) -> str:
    return f"sha256:{file_sha256(path)[:LABEL_HASH_CHARS]}"


def resolve_endpoint(spec: ModelSpec, *, top_k: int | None = None, logits: bool = False,
                     embeddings: bool = False, embedding_layer: str | None = None, task: str = "classify",
                     min_score: float = 0.0, max_detections: int | None = None,
                     output_kind: str = "classes") -> ResolvedModel:
    """Load `spec` once on the CPU, run one blank image through it, and fix preprocessing and heads.

    `embedding_layer` names the module whose (spatially averaged) output is the embedding; None: the input
    of the last Linear layer. `task` (classify, detect, segment) is what the command expects the model to do:
    a model that does another stops here, with the command that fits. `output_kind="raw"` (classify): the
    model may return any one tensor, batch first; no head runs."""
    # torch loads here, not at import: a ResolvedModel unpickled from a child process must not pull it in
    import torch

    from spark_cnn.models.dense_heads import declared_task, wrong_command
    from spark_cnn.models.heads import Predictor
    from spark_cnn.models.loader import build_module, declared_preprocessing

    weights = resolve_weights(spec)
    module = build_module(spec.source, weights.file, weights.enum, kind=spec.kind)
    own = Preprocessing.from_dict(weights.preprocessing) if weights.preprocessing else None
    found = declared_task(module)
    if found is not None and found != task:
        raise ConfigError(wrong_command(spec.source, found, task))
    if task != "classify":
        return _resolve_dense(spec, module, weights, own, task, min_score=min_score, max_detections=max_detections)
    prep = spec.preprocessing_over(own or declared_preprocessing(module) or Preprocessing())
    if embedding_layer is not None and not embeddings:
        raise ConfigError("--layer picks the embedding layer: it needs embeddings on")
    raw = output_kind == "raw"
    try:
        probe = Predictor(module, top_k=1, logits=True, embeddings=embeddings, embedding_layer=embedding_layer,
                          raw=raw)
    except ModelError as e:  # e.g. no Linear layer to take embeddings from: a detector or segmenter, perhaps
        _refuse_another_task(module, prep.crop, spec.source, task, raw, e)
        raise
    try:
        with torch.inference_mode():
            out = probe.predict(torch.zeros((1, 3, prep.crop, prep.crop)))
    except ModelError as e:
        _refuse_another_task(module, prep.crop, spec.source, task, raw, e)
        raise ModelError(f"--model {spec.source}: {e}") from None
    except Exception as e:
        raise ModelError(f"--model {spec.source} failed on a 1x3x{prep.crop}x{prep.crop} input "
                         f"({type(e).__name__}: {e}); check --crop/--resize for this model") from e
    files = {path: os.path.basename(path) for path in (spec.source, weights.file)
             if path and os.path.isfile(path)}
    if raw:
        endpoint = Endpoint(source=spec.source, weights=weights.file, preprocessing=prep, top_k=1, files=files,
                            weights_enum=weights.enum, kind=spec.kind, output_kind=output_kind).with_fingerprint()
        return ResolvedModel(endpoint=endpoint, num_classes=None, embedding_dim=None, weights=weights,
                             raw_shape=tuple(out["raw"].shape[1:]))
    num_classes = int(out["logits"].shape[1])
    if top_k is None:
        top_k = min(DEFAULT_TOP_K, num_classes)
    if not 1 <= top_k <= num_classes:
        raise ConfigError(f"--top-k {top_k}: must be between 1 and the model's {num_classes} classes")
    if weights.categories is not None and len(weights.categories) != num_classes:
        raise ModelError(f"--weights {spec.weights} name {len(weights.categories)} categories but the model has "
                         f"{num_classes} classes")
    endpoint = Endpoint(source=spec.source, weights=weights.file, preprocessing=prep, top_k=top_k,
                        logits=logits, embeddings=embeddings, files=files, embedding_layer=embedding_layer,
                        weights_enum=weights.enum, kind=spec.kind).with_fingerprint()
    embedding_dim = int(out["embedding"].shape[1]) if embeddings else None
    return ResolvedModel(endpoint=endpoint, num_classes=num_classes, embedding_dim=embedding_dim, weights=weights)


def _refuse_another_task(module, size: int, source: str, task: str, raw: bool, error: Exception) -> None:
    """A ConfigError naming the command that fits, when a model that failed as a classifier is a detector or a
    segmenter (with --output raw any one tensor is fine, so nothing is refused here)."""
    import torch

    from spark_cnn.models.dense_heads import wrong_command

    if raw:
        return
    with torch.inference_mode():
        found = _probe_task(module, size)
    if found not in (None, "classify"):
        # Segmenter-like output may be any other per-pixel map too: name both ways to run it.
        aside = "for any other tensor use --output raw" if found == "segment" else ""
        raise ConfigError(wrong_command(source, found, task, aside)) from error


def _probe_task(module, size: int) -> str | None:
    """What a module that failed as a classifier is, from what it returns for a blank image; None if unclear."""
    import torch

    from spark_cnn.models.dense_heads import output_task

    for probe in ([torch.zeros((3, size, size))], torch.zeros((1, 3, size, size))):
        try:
            found = output_task(module(probe))
        except Exception:
            continue
        if found is not None:
            return found
    return None


# The blank image a detector or segmenter is checked on: small, so the check costs little on the driver's CPU.
PROBE_SIDE = 128


def _resolve_dense(spec: ModelSpec, module, weights: ResolvedWeights, own: Preprocessing | None, task: str, *,
                   min_score: float, max_detections: int | None) -> ResolvedModel:
    """A detector's or segmenter's endpoint: its size rule, a blank image through it, its class count."""
    import torch

    from spark_cnn.imaging.sizing import SizeRule
    from spark_cnn.models.dense_heads import (
        DEFAULT_SEGMENT_SHORT_SIDE,
        detect_sizing,
        detection_classes,
        output_task,
        segment_logits,
        wrong_command,
    )
    from spark_cnn.models.loader import declared_preprocessing

    if not 0.0 <= min_score <= 1.0:
        raise ConfigError(f"--min-score {min_score}: expected a score between 0 and 1")
    if max_detections is not None and max_detections < 1:
        raise ConfigError(f"--max-detections {max_detections}: expected a positive integer")
    base = own or declared_preprocessing(module)
    if base is None and task == "segment":
        base = Preprocessing(resize=DEFAULT_SEGMENT_SHORT_SIDE, crop=DEFAULT_SEGMENT_SHORT_SIDE)
    merged = {**(base or Preprocessing()).to_dict(), **(spec.preprocessing or {})}
    prep = Preprocessing(**{**merged, "crop": merged["resize"]})  # nothing is cropped: the crop follows the resize
    if task == "detect":
        sizing = detect_sizing(module)
        probe = [torch.zeros((3, PROBE_SIDE, PROBE_SIDE))]
    else:
        sizing = SizeRule(min_size=prep.resize, interpolation=prep.interpolation)
        probe = torch.zeros((1, 3, PROBE_SIDE, PROBE_SIDE))
    try:
        with torch.inference_mode():
            out = module(probe)
    except Exception as e:
        with torch.inference_mode():
            found = _probe_task(module, prep.crop)  # at the model's own input size: a classifier may need it
        if found is not None and found != task:
            raise ConfigError(wrong_command(spec.source, found, task)) from e
        raise ModelError(f"--model {spec.source} failed on a blank {PROBE_SIDE}x{PROBE_SIDE} image as a "
                         f"{'detector' if task == 'detect' else 'segmenter'} ({type(e).__name__}: {e})") from e
    if task == "detect" and isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], list):
        out = out[1]  # TorchScript detectors return (losses, detections)
    found = output_task(out)
    if found == "detect" and task == "detect":
        classes = detection_classes(module)
    elif found == "segment" and task == "segment":
        classes = int(segment_logits(out, (PROBE_SIDE, PROBE_SIDE)).shape[1])
    else:
        expected = ("a detector returns one dict of boxes, scores and labels per image" if task == "detect" else
                    "a segmenter returns (N, classes, H, W) logits or a dict with 'out'")
        raise ConfigError(wrong_command(spec.source, found, task) if found else
                          f"--model {spec.source} returned {type(out).__name__}; {expected}")
    if weights.categories is not None and classes is not None and len(weights.categories) != classes:
        raise ModelError(f"--weights {spec.weights} name {len(weights.categories)} categories but the model has "
                         f"{classes} classes")
    files = {path: os.path.basename(path) for path in (spec.source, weights.file) if path and os.path.isfile(path)}
    endpoint = Endpoint(source=spec.source, weights=weights.file, preprocessing=prep, top_k=1, files=files,
                        weights_enum=weights.enum, kind=spec.kind, task=task, sizing=sizing,
                        min_score=min_score if task == "detect" else 0.0,
                        max_detections=max_detections if task == "detect" else None).with_fingerprint()
    return ResolvedModel(endpoint=endpoint, num_classes=classes or 0, embedding_dim=None, weights=weights)
