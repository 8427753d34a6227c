"""What model to run and how its outputs are shaped. Plain data, torch-free: it travels to tasks and sidecars."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from spark_cnn.errors import ConfigError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.imaging.sizing import SizeRule
from spark_cnn.models.device_curve import SIM_PREFIX, parse_curve
from spark_cnn.models.factory_code import factory_code_digest
from spark_cnn.models.weights import NAME, RANDOM, TIMM_PRETRAINED, weights_kind

TORCHSCRIPT_SUFFIXES = (".pt", ".pth", ".ts", ".jit", ".torchscript")
TIMM_PREFIX = "timm:"  # --model timm:NAME[.TAG]
# MLflow model URIs (registry, run artifacts); a local MLflow model is a directory holding this file.
MLFLOW_SCHEMES = ("models:/", "runs:/")
MLMODEL_FILE = "MLmodel"
# models:/NAME/VERSION (or a stage, or latest), models:/NAME@ALIAS, models:/MODEL_ID; runs:/RUN_ID/PATH.
_MLFLOW_URI = re.compile(r"^(?:models:/[^/@]+(?:/[^/@]+|@[^/@]+)?|runs:/[^/]+/.+)$")
# Top-5 is the usual ImageNet report; smaller models get min(5, classes).
DEFAULT_TOP_K = 5


def model_kind(source: str) -> str:
    """'timm' for `timm:NAME`, 'simulated' for `sim:CURVE` (a simulated device, models/simulated.py), 'mlflow' for
    an MLflow model URI or directory, 'torchscript' for a file, 'factory' for `module:callable`, else 'torchvision'
    (a model name)."""
    if source.startswith(TIMM_PREFIX):
        return "timm"
    if source.startswith(SIM_PREFIX):
        return "simulated"
    if source.startswith(MLFLOW_SCHEMES) or os.path.isfile(os.path.join(source, MLMODEL_FILE)):
        return "mlflow"
    if source.endswith(TORCHSCRIPT_SUFFIXES) or os.path.isfile(source):
        return "torchscript"
    if ":" in source:
        return "factory"
    return "torchvision"


@dataclass(frozen=True)
class ModelSpec:
    """A model as the user names it.

    `source` is a torchvision classification model name (`resnet50`), a TorchScript file (`model.pt`),
    `package.module:factory` returning an `nn.Module`, a timm model (`timm:resnet50.a1_in1k`, the `timm` extra), or
    an MLflow PyTorch model (`models:/NAME/VERSION`, `models:/NAME@ALIAS`, `runs:/RUN_ID/PATH` or a local MLflow
    model directory, the `mlflow` extra), or a simulated device (`sim:resnet50-h200`, `sim:2.8+0.107n`: a classifier
    that takes a device's time per batch without using the CPU, models/simulated.py). `weights` is an optional
    state_dict file, loaded with `weights_only=True`; for a torchvision model also torchvision's weights by name
    (`DEFAULT`, `IMAGENET1K_V2`, `ResNet50_Weights.IMAGENET1K_V2`) or `random` (its random initialisation, asked
    for); for a timm model `DEFAULT` (timm's pretrained weights for that name and tag) or `random`; an MLflow model
    carries its own. `preprocessing` overrides some or all fields of the model's preprocessing, which is what the
    named weights (or timm's data config) bring, else what the model declares (attribute `spark_cnn_preprocessing`),
    else the torchvision default; give a dict of `Preprocessing` fields or a whole `Preprocessing`.

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
            raise ConfigError("--model is empty: give a torchvision model name, a TorchScript file, module:factory, "
                              "timm:NAME or an MLflow model URI")
        _check_source(self.source, self.kind)
        kind = weights_kind(self.weights)
        if self.weights is not None and kind is None:
            raise ConfigError(f"--weights {self.weights}: no such file (nor a torchvision weights name such as "
                              "DEFAULT)")
        if self.kind == "simulated" and self.weights is not None:
            raise ConfigError(f"--weights {self.weights}: the simulated device {self.source} has no weights; drop "
                              "--weights")
        if self.kind == "mlflow" and self.weights is not None:
            raise ConfigError(f"--weights {self.weights}: the MLflow model {self.source} carries its own weights; "
                              "drop --weights")
        if self.kind == "timm" and kind == NAME and self.weights != TIMM_PRETRAINED:
            raise ConfigError(f"--weights {self.weights}: a timm model takes {TIMM_PRETRAINED} (timm's pretrained "
                              f"weights; name the tag in --model, e.g. timm:resnet50.a1_in1k), a state_dict file "
                              f"or random")
        if kind in (NAME, RANDOM) and self.kind not in ("torchvision", "timm"):
            raise ConfigError(f"--weights {self.weights}: weights by name (and random) are for torchvision and timm "
                              f"models; --model {self.source} takes a state_dict file")
        if self.kind == "torchscript" and not os.path.isfile(self.source):
            raise ConfigError(f"--model {self.source}: no such TorchScript file")

    @property
    def kind(self) -> str:
        return model_kind(self.source)

    @property
    def timm_name(self) -> str:
        """`resnet50.a1_in1k` of `timm:resnet50.a1_in1k`."""
        return self.source[len(TIMM_PREFIX):]

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
    # The spec's kind ("" = derived from `source`): an MLflow directory's source names a path executors lack.
    kind: str = ""
    output_kind: str = "classes"  # or "raw": the model's one output tensor as it is (task/schema.py OUTPUT_KINDS)
    # What the model computes (schema.TASKS): classify, detect (boxes) or segment (a class per pixel).
    task: str = "classify"
    # detect and segment: images travel at their own size under this rule (imaging/sizing.py); None: classify's
    # resize and centre crop (`preprocessing`).
    sizing: SizeRule | None = None
    min_score: float = 0.0  # detect: boxes scoring less are dropped
    max_detections: int | None = None  # detect: at most this many boxes per image, best first (None: the model's)

    @property
    def sized(self) -> bool:
        """Whether images travel at their own size (SizedImages) rather than as fixed crops."""
        return self.sizing is not None

    def to_json(self) -> str:
        data = asdict(self)
        data["preprocessing"] = self.preprocessing.to_dict()
        return json.dumps(data, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Endpoint:
        data = json.loads(text)
        data["preprocessing"] = Preprocessing.from_dict(data["preprocessing"])
        if data.get("sizing") is not None:
            data["sizing"] = SizeRule.from_dict(data["sizing"])
        return cls(**data)

    def with_fingerprint(self) -> Endpoint:
        """Fingerprint = hash of what decides the outputs: the model (a file's contents, not its path; a name as
        written; `module:factory` as written and the bytes of its code, factory_code.py), weights contents,
        preprocessing and heads. The same model under two paths is one model to a sidecar; an edited factory is
        another one."""
        digest = hashlib.sha256()
        model = file_sha256(self.source) if os.path.isfile(self.source) else self.source
        if (self.kind or model_kind(self.source)) == "factory":
            model += "\0code:" + factory_code_digest(self.source)
        weights = file_sha256(self.weights) if self.weights else ""
        for part in (model, weights, json.dumps(self.preprocessing.to_dict(), sort_keys=True),
                     str(self.top_k), str(self.logits), str(self.embeddings)):
            digest.update(part.encode() + b"\0")
        if self.embedding_layer:
            digest.update(b"layer:" + self.embedding_layer.encode())
        if self.weights_enum:
            digest.update(b"weights_enum:" + self.weights_enum.encode())
        if self.output_kind != "classes":
            digest.update(b"output:" + self.output_kind.encode())
        if self.task != "classify":
            heads = {"task": self.task, "sizing": self.sizing.to_dict() if self.sizing else None,
                     "min_score": self.min_score, "max_detections": self.max_detections}
            digest.update(b"heads:" + json.dumps(heads, sort_keys=True).encode())
        return replace(self, fingerprint=digest.hexdigest()[:16])

    def localised(self, resolve) -> Endpoint:
        """The same endpoint with shipped files replaced by `resolve(shipped_name)`, e.g. SparkFiles.get."""
        swap = {path: resolve(name) for path, name in self.files.items()}
        return replace(self, source=swap.get(self.source, self.source),
                       weights=swap.get(self.weights, self.weights) if self.weights else None)


def _check_source(source: str, kind: str) -> None:
    """The syntax of timm and MLflow sources, so a typo stops here, not in a child process or a task."""
    if kind == "timm" and not source[len(TIMM_PREFIX):].strip():
        raise ConfigError(f"--model {source}: name the timm model, e.g. timm:resnet50 or timm:resnet50.a1_in1k")
    if kind == "simulated":
        parse_curve(source[len(SIM_PREFIX):])  # a ConfigError naming the forms it takes
    if kind == "mlflow" and source.startswith(MLFLOW_SCHEMES) and not _MLFLOW_URI.match(source):
        raise ConfigError(f"--model {source}: not an MLflow model URI; expected models:/NAME/VERSION, "
                          "models:/NAME@ALIAS, models:/MODEL_ID or runs:/RUN_ID/PATH")


def file_sha256(path: str, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
