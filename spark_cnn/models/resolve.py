"""Driver-side check of a model before any Spark work: it loads, accepts an image, and fits the options."""

from __future__ import annotations

import os
from dataclasses import dataclass

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.spec import DEFAULT_TOP_K, Endpoint, ModelSpec


@dataclass(frozen=True)
class ResolvedModel:
    endpoint: Endpoint
    num_classes: int
    embedding_dim: int | None


def resolve_endpoint(spec: ModelSpec, *, top_k: int | None = None, logits: bool = False,
                     embeddings: bool = False, embedding_layer: str | None = None) -> ResolvedModel:
    """Load `spec` once on the CPU, run one blank image through it, and fix preprocessing and heads.

    `embedding_layer` names the module whose (spatially averaged) output is the embedding; None: the input
    of the last Linear layer."""
    # torch loads here, not at import: a ResolvedModel unpickled from a child process must not pull it in
    import torch

    from spark_cnn.models.heads import Predictor
    from spark_cnn.models.loader import build_module, declared_preprocessing

    module = build_module(spec.source, spec.weights)
    prep = spec.preprocessing_over(declared_preprocessing(module) or Preprocessing())
    if embedding_layer is not None and not embeddings:
        raise ConfigError("--layer picks the embedding layer: it needs embeddings on")
    probe = Predictor(module, top_k=1, logits=True, embeddings=embeddings, embedding_layer=embedding_layer)
    try:
        with torch.inference_mode():
            out = probe.predict(torch.zeros((1, 3, prep.crop, prep.crop)))
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"--model {spec.source} failed on a 1x3x{prep.crop}x{prep.crop} input "
                         f"({type(e).__name__}: {e}); check --crop/--resize for this model") from e
    if out["logits"].dim() != 2:
        raise ModelError(f"--model {spec.source} returned outputs of shape {tuple(out['logits'].shape)}; a "
                         f"classifier must return logits of shape (batch, classes)")
    num_classes = int(out["logits"].shape[1])
    if top_k is None:
        top_k = min(DEFAULT_TOP_K, num_classes)
    if not 1 <= top_k <= num_classes:
        raise ConfigError(f"--top-k {top_k}: must be between 1 and the model's {num_classes} classes")
    files = {path: os.path.basename(path) for path in (spec.source, spec.weights)
             if path and os.path.isfile(path)}
    endpoint = Endpoint(source=spec.source, weights=spec.weights, preprocessing=prep, top_k=top_k,
                        logits=logits, embeddings=embeddings, files=files,
                        embedding_layer=embedding_layer).with_fingerprint()
    embedding_dim = int(out["embedding"].shape[1]) if embeddings else None
    return ResolvedModel(endpoint=endpoint, num_classes=num_classes, embedding_dim=embedding_dim)
