"""Driver-side set-up of inference, shared by the jobs, the DataFrame functions and the pandas UDF.

`check_model` loads the model once, in a child process of the driver (before any Spark work, so a bad model,
weights file, label file or layer name is one clear error, not a failed task); `plan_inference` fixes everything
the tasks need in an `InferencePlan`, purely from the options, the checked model and the opened input;
`start_inference` ships the model's files to the executors and plans. `plan_reading` is the input side alone,
which to-petastorm (no model) shares.

Model files are shipped content-addressed (`spark/shipped_copies.py`): each job ships a copy named by the hash
of its bytes, and the endpoint (and its fingerprint) refer to that copy. Spark ignores a second `addFile` of a
path, so shipping the path itself would leave executors running the first version of a file changed in place,
under the new fingerprint.
"""

from __future__ import annotations

import logging
import os
import uuid
from dataclasses import dataclass, replace

from pyspark.sql import SparkSession

from spark_cnn.config import InferenceOptions
from spark_cnn.errors import ConfigError, InputError
from spark_cnn.formats.encodings import ENCODED
from spark_cnn.imaging.limits import DEFAULT_DECODE, DecodeOptions
from spark_cnn.spark.session import application_id, ship_files
from spark_cnn.spark.shipped_copies import content_addressed_copy
from spark_cnn.spark.sources import TRUE_LABEL, ImageSource
from spark_cnn.task.launcher import LaunchOptions
from spark_cnn.task.object_store import NO_STORAGE, StorageOptions
from spark_cnn.task.stream import InferencePlan

_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckedModel:
    """A model that loaded and ran on the driver, with its class names (None without labels)."""

    resolved: object  # models.resolve.ResolvedModel (torch-side module: imported lazily)
    labels: tuple[str, ...] | None

    @property
    def endpoint(self):
        return self.resolved.endpoint

    @property
    def weights_label(self) -> str:
        """The weights actually used: torchvision's enum name, `sha256:<hash>` of a file, timm's pretrained name and
        origin, an MLflow URI with its version and file hash, random or builtin."""
        return self.resolved.weights.label


def read_labels(path: str | None) -> tuple[str, ...] | None:
    """Class names, one per line (blank lines ignored)."""
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            names = tuple(line.strip() for line in f if line.strip())
    except OSError as e:
        raise InputError(f"--labels {path}: {e.strerror}") from e
    if not names:
        raise InputError(f"--labels {path}: the file has no class names (expected one per line)")
    return names


def check_model(options: InferenceOptions) -> CheckedModel:
    """Load the model on the driver's CPU (named weights resolved, from torch's cache or downloaded once), run one
    blank image through it, and check the labels fit. Labels: `options.labels`, else the named weights'
    categories; none for a raw output (`output_kind="raw"`: any one tensor, batch first). A torchvision model
    without weights runs its random initialisation, with one warning."""
    # torch stays out of the driver: the model loads in a child process (once per model and weight files)
    from spark_cnn.models.resolve_isolated import resolve_endpoint_isolated
    from spark_cnn.models.weights import RANDOM

    labels = read_labels(options.labels) if isinstance(options.labels, str) else options.labels
    dense = {} if options.task == "classify" else {"task": options.task, "min_score": options.min_score,
                                                    "max_detections": options.max_detections}
    resolved = resolve_endpoint_isolated(options.model, top_k=options.top_k, logits=options.logits,
                                         embeddings=options.embeddings, embedding_layer=options.layer,
                                         output_kind=options.output_kind, **dense)
    if resolved.num_classes is None:  # a raw output: no classes to name
        return CheckedModel(resolved, None)
    if labels is None:
        labels = resolved.weights.categories
    if resolved.weights.label == RANDOM and options.model.weights is None:
        _log.warning("spark-cnn: warning: --model %s runs with random weights; pass --weights DEFAULT (its "
                     "pretrained weights), a state_dict file, or --weights random to silence this",
                     options.model.source)
    if labels is not None and resolved.num_classes and len(labels) != resolved.num_classes:
        where = f" {options.labels}" if isinstance(options.labels, str) else ""
        raise ConfigError(f"--labels{where} has {len(labels)} names but the model has "
                          f"{resolved.num_classes} classes")
    return CheckedModel(resolved, labels)


@dataclass(frozen=True)
class ReadPlan:
    """How tasks read the rows of one input: how its column holds images (formats.pixels), the input columns
    copied to the output, the decode guard rails and what a bad image does. Inference and to-petastorm share it."""

    encoding: str = ENCODED
    carry: tuple[str, ...] = ()
    decode_options: DecodeOptions = DEFAULT_DECODE
    on_error: str = "record"
    storage: StorageOptions = NO_STORAGE  # how tasks open the object store a listed input lives in


def plan_reading(source: ImageSource | None, *, decode_options: DecodeOptions = DEFAULT_DECODE,
                 on_error: str = "record") -> ReadPlan:
    """The ReadPlan of an opened input (`source`), or of a DataFrame of image bytes or structs (None)."""
    if source is None:
        return ReadPlan(decode_options=decode_options, on_error=on_error)
    return ReadPlan(encoding=source.encoding, carry=(TRUE_LABEL,) if source.has_labels else (),
                    decode_options=decode_options, on_error=on_error, storage=source.storage)


def plan_inference(options: InferenceOptions, model: CheckedModel, *, app_id: str,
                   source: ImageSource | None = None, job_id: str | None = None) -> InferencePlan:
    """What every task of one inference needs, from the options and the checked model: pure (no Spark calls).

    Every inference surface (the classify, embed and etl jobs, `classify(df)`, `embed(df)`, `cnn_udf`) plans
    here, so an InferenceOptions field reaches each of them the same way. `source`: the opened input (None: a
    DataFrame's image column); `job_id`: a fresh one when None."""
    reading = plan_reading(source, decode_options=options.decode_options, on_error=options.on_error)
    return InferencePlan(
        endpoint=model.endpoint,
        launch=LaunchOptions(app_id=app_id, device=options.device, idle_timeout_s=options.idle_timeout_s,
                             threads=options.threads),
        job_id=job_id or uuid.uuid4().hex[:12], run_options=options.run_options, decode=options.decode,
        on_error=reading.on_error, label_names=model.labels, request_rows=options.request_rows,
        max_in_flight=options.max_in_flight, decode_options=reading.decode_options,
        request_timeout_s=options.request_timeout_s, encoding=reading.encoding, carry=reading.carry,
        storage=reading.storage)


def start_inference(spark: SparkSession, options: InferenceOptions, model: CheckedModel, *,
                    source: ImageSource | None = None) -> InferencePlan:
    """Ship the model's files to the executors of `spark` and plan the tasks (plan_inference; a fresh job id)."""
    shipped = ship_model_files(spark, model)
    return plan_inference(options, shipped, app_id=application_id(spark), source=source)


def ship_model_files(spark: SparkSession, model: CheckedModel) -> CheckedModel:
    """Ship a content-addressed copy of each file of the model (session.ship_files: executors find theirs with
    SparkFiles.get(name)); returns the model whose endpoint names those copies, fingerprinted from their bytes."""
    endpoint = model.endpoint
    if not endpoint.files:
        return model
    copies = {path: content_addressed_copy(path) for path in endpoint.files}
    ship_files(spark, copies.values())
    # The fingerprint of what executors will load: the file may have changed since the driver checked it.
    as_shipped = replace(endpoint, source=copies.get(endpoint.source, endpoint.source),
                         weights=copies.get(endpoint.weights, endpoint.weights) if endpoint.weights else None)
    endpoint = replace(endpoint, files={path: os.path.basename(copy) for path, copy in copies.items()},
                       fingerprint=as_shipped.with_fingerprint().fingerprint)
    return replace(model, resolved=replace(model.resolved, endpoint=endpoint))
