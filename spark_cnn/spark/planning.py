"""Driver-side set-up of inference, shared by the jobs, the DataFrame functions and the pandas UDF.

`check_model` loads the model once on the driver (before any Spark work, so a bad model, weights file, label
file or layer name is one clear error, not a failed task); `plan_inference` ships the model's files to the
executors and fixes everything the tasks need in an `InferencePlan`.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

from pyspark.sql import SparkSession

from spark_cnn.config import InferenceOptions
from spark_cnn.errors import ConfigError, InputError
from spark_cnn.formats.encodings import ENCODED
from spark_cnn.task.launcher import LaunchOptions
from spark_cnn.task.stream import InferencePlan


@dataclass(frozen=True)
class CheckedModel:
    """A model that loaded and ran on the driver, with its class names (None without labels)."""

    resolved: object  # models.resolve.ResolvedModel (torch-side module: imported lazily)
    labels: tuple[str, ...] | None

    @property
    def endpoint(self):
        return self.resolved.endpoint


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
    """Load the model on the driver's CPU, run one blank image through it, and check the labels fit."""
    # torch stays out of the driver: the model loads in a child process (once per model and weight files)
    from spark_cnn.models.resolve_isolated import resolve_endpoint_isolated

    labels = read_labels(options.labels) if isinstance(options.labels, str) else options.labels
    resolved = resolve_endpoint_isolated(options.model, top_k=options.top_k, logits=options.logits,
                                         embeddings=options.embeddings, embedding_layer=options.layer)
    if labels is not None and len(labels) != resolved.num_classes:
        where = f" {options.labels}" if isinstance(options.labels, str) else ""
        raise ConfigError(f"--labels{where} has {len(labels)} names but the model has "
                          f"{resolved.num_classes} classes")
    return CheckedModel(resolved, labels)


def plan_inference(spark: SparkSession, options: InferenceOptions, model: CheckedModel, *,
                   encoding: str = ENCODED, carry: tuple[str, ...] = ()) -> InferencePlan:
    """Ship the model's files to the executors and fix the tasks' plan (a fresh job id each call). `encoding`:
    how the input column holds images (formats.pixels); `carry`: input columns copied to the output."""
    shipped = {urlparse(uri).path for uri in spark.sparkContext.listFiles}
    for path in model.endpoint.files:
        if os.path.abspath(path) not in shipped:  # Spark warns on a second addFile of a path, and ignores it
            spark.sparkContext.addFile(path)  # executors find their copy with SparkFiles.get(name)
    return InferencePlan(
        endpoint=model.endpoint,
        launch=LaunchOptions(app_id=spark.sparkContext.applicationId, device=options.device,
                             idle_timeout_s=options.idle_timeout_s, threads=options.threads),
        job_id=uuid.uuid4().hex[:12], options=options.run_options.to_dict(), decode=options.decode,
        on_error=options.on_error, label_names=model.labels, request_rows=options.request_rows,
        max_in_flight=options.max_in_flight, decode_options=options.decode_options.to_dict(),
        request_timeout_s=options.request_timeout_s, encoding=encoding, carry=carry)
