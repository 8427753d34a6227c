"""What model to run and how its outputs are shaped. Plain data, torch-free: it travels to tasks and sidecars."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from spark_cnn.errors import ConfigError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.weights import NAME, RANDOM, weights_kind

TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".jit", ".torchscript")
# Top-5 is the usual ImageNet report; smaller models get min(5, classes).
DEFAULT_TOP_K = 5


def model_kind(source: str) -> str:
    """'torchscript' for a file, 'factory' for `module:callable`, else 'torchvision' (a model name)."""
    if source.endswith(TORCHSCRIPT_SUFFIXES) or os.path.isfile(source):
        return "torchscript"
    if ":" in source:
        return "factory"
    return "torchvision"


@dataclass(frozen=True)
class ModelSpec:
    """A model as the user names it.

    `source` is a torchvision classification model name (`resnet50`), a TorchScript file (`model.pt`), or
    `package.module:factory` returning an `nn.Module`. `weights` is an optional state_dict file, loaded with
    `weights_only=True`; for a torchvision model also torchvision's weights by name (`DEFAULT`, `IMAGENET1K_V2`,
    `ResNet50_Weights.IMAGENET1K_V2`) or `random` (its random initialisation, asked for). `preprocessing`
    overrides some or all fields of the model's preprocessing, which is what the named weights bring, else what
    the model declares (attribute `spark_cnn_preprocessing`), else the torchvision default; give a dict of
    `Preprocessing` fields or a whole `Preprocessing`.

    >>> ModelSpec("mobilenet_v3_small").kind
    'torchvision'
    """

    source: str
    weights: str | None = None
    preprocessing: Preprocessing | Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        overrides = self.preprocessing
        if isinstance(overrides, Preprocessing):
            overrides = overrides.to_dict()
        if overrides is not None:
            unknown = set(overrides) - set(Preprocessing.__dataclass_fields__)
            if unknown:
                raise ConfigError(f"unknown preprocessing field(s) {sorted(unknown)}; expected "
                                  f"{sorted(Preprocessing.__dataclass_fields__)}")
            # Check each given value now; whether crop fits resize is checked against the model's own values
            # once they are known (a base with a huge resize and a tiny crop accepts any single one of them).
            Preprocessing(**{"resize": 1 << 30, "crop": 1, **overrides})
            object.__setattr__(self, "preprocessing", dict(overrides))
        if not self.source or not self.source.strip():
            raise ConfigError("--model is empty: give a torchvision model name, a TorchScript file or module:factory")
        kind = weights_kind(self.weights)
        if self.weights is not None and kind is None:
            raise ConfigError(f"--weights {self.weights}: no such file (nor a torchvision weights name such as "
                              "DEFAULT)")
        if kind in (NAME, RANDOM) and self.kind != "torchvision":
            raise ConfigError(f"--weights {self.weights}: weights by name (and random) are for torchvision model "
                              f"names; --model {self.source} takes a state_dict file")
        if self.kind == "torchscript" and not os.path.isfile(self.source):
            raise ConfigError(f"--model {self.source}: no such TorchScript file")

    @property
    def kind(self) -> str:
        return model_kind(self.source)

    def preprocessing_over(self, base: Preprocessing) -> Preprocessing:
        """`base` (the model's own preprocessing) with this spec's overrides applied."""
        return Preprocessing(**{**base.to_dict(), **(self.preprocessing or {})})


@dataclass(frozen=True)
class Endpoint:
    """A model ready to serve: the spec with files resolved, preprocessing fixed and the heads chosen.

    The sidecar hosts one loaded model per `fingerprint`; every connection names the endpoint it uses.
    `files` maps each local path in the spec to the name it was shipped under (Spark's addFile), so an executor
    can find its own copy.
    """

    source: str
    weights: str | None
    preprocessing: Preprocessing
    top_k: int
    logits: bool = False
    embeddings: bool = False
    fingerprint: str = ""
    files: dict = field(default_factory=dict)
    embedding_layer: str | None = None  # None: the input of the last Linear layer
    weights_enum: str | None = None  # torchvision weights the `weights` file holds: the model is built for them

    def to_json(self) -> str:
        data = asdict(self)
        data["preprocessing"] = self.preprocessing.to_dict()
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Endpoint:
        data = json.loads(text)
        data["preprocessing"] = Preprocessing.from_dict(data["preprocessing"])
        return cls(**data)

    def with_fingerprint(self) -> Endpoint:
        """Fingerprint = hash of what decides the outputs: the model (a file's contents, not its path; a name
        or `module:factory` as written, so a factory's code is not covered), weights contents, preprocessing
        and heads. The same model under two paths is one model to a sidecar."""
        digest = hashlib.sha256()
        model = file_sha256(self.source) if os.path.isfile(self.source) else self.source
        weights = file_sha256(self.weights) if self.weights else ""
        for part in (model, weights, json.dumps(self.preprocessing.to_dict(), sort_keys=True),
                     str(self.top_k), str(self.logits), str(self.embeddings)):
            digest.update(part.encode() + b"\0")
        if self.embedding_layer:
            digest.update(b"layer:" + self.embedding_layer.encode())
        if self.weights_enum:
            digest.update(b"weights_enum:" + self.weights_enum.encode())
        return replace(self, fingerprint=digest.hexdigest()[:16])

    def localised(self, resolve) -> Endpoint:
        """The same endpoint with shipped files replaced by `resolve(shipped_name)`, e.g. SparkFiles.get."""
        swap = {path: resolve(name) for path, name in self.files.items()}
        return replace(self, source=swap.get(self.source, self.source),
                       weights=swap.get(self.weights, self.weights) if self.weights else None)


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
