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
                     embeddings: bool = False, embedding_layer: str | None = None,
                     output_kind: str = "classes") -> ResolvedModel:
    """Load `spec` once on the CPU, run one blank image through it, and fix preprocessing and heads.

    `embedding_layer` names the module whose (spatially averaged) output is the embedding; None: the input
    of the last Linear layer. `output_kind="raw"`: the model may return any one tensor, batch first; no head
    runs."""
    # torch loads here, not at import: a ResolvedModel unpickled from a child process must not pull it in
    import torch

    from spark_cnn.models.heads import Predictor
    from spark_cnn.models.loader import build_module, declared_preprocessing

    weights = resolve_weights(spec)
    module = build_module(spec.source, weights.file, weights.enum, kind=spec.kind)
    own = Preprocessing.from_dict(weights.preprocessing) if weights.preprocessing else None
    prep = spec.preprocessing_over(own or declared_preprocessing(module) or Preprocessing())
    if embedding_layer is not None and not embeddings:
        raise ConfigError("--layer picks the embedding layer: it needs embeddings on")
    raw = output_kind == "raw"
    probe = Predictor(module, top_k=1, logits=True, embeddings=embeddings, embedding_layer=embedding_layer, raw=raw)
    try:
        with torch.inference_mode():
            out = probe.predict(torch.zeros((1, 3, prep.crop, prep.crop)))
    except ModelError as e:
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
