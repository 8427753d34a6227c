"""Job configuration as frozen, validated data. CLI flags (and later YAML presets) only fill these."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, fields

from spark_cnn.errors import ConfigError
from spark_cnn.imaging.limits import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, DecodeOptions
from spark_cnn.models.spec import ModelSpec
from spark_cnn.task.client import DEFAULT_MAX_IN_FLIGHT, REPLY_TIMEOUT_S
from spark_cnn.task.launcher import DEFAULT_IDLE_TIMEOUT_S
from spark_cnn.task.run_options import DECODE_CHOICES, RunOptions

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
ON_ERROR_CHOICES = ("record", "fail")
# Rows per request a task sends: large enough to amortise a message (~0.1 ms), small enough that the
# batcher can fill device batches from several tasks at once.
DEFAULT_REQUEST_ROWS = 16
INPUT_FORMATS = ("auto", "images", "image", "parquet", "petastorm")
# Output columns a job may partition its Parquet by: small, repeated values (never paths, scores or vectors).
PARTITION_COLUMNS = ("label", "label_name", "true_label")


@dataclass(frozen=True)
class InputOptions:
    """Where the images come from and how to find them in the input (`spark/sources.py` reads them).

    format: auto | images (files, binaryFile) | image (Spark's image source) | parquet | petastorm.
    glob: file-name pattern for images/image (Hadoop glob: *, ?, [ab], {jpg,png}).
    image_column / path_column / label_column: for parquet and petastorm inputs; the path column is the row's id
    in the output, the label column (the true class) fills `true_label`.
    """

    format: str = "auto"
    glob: str | None = None
    image_column: str | None = None
    path_column: str | None = None
    label_column: str | None = None

    def __post_init__(self) -> None:
        if self.format not in INPUT_FORMATS:
            raise ConfigError(f"--input-format {self.format}: expected one of {', '.join(INPUT_FORMATS)}")
        if self.glob is not None and (not self.glob or "/" in self.glob):
            raise ConfigError(f"--glob {self.glob!r}: expected a file-name pattern such as '*.jpg' (no '/')")
        table_only = [f"--{name.replace('_', '-')}" for name in ("image_column", "path_column", "label_column")
                      if getattr(self, name) is not None]
        if table_only and self.format in ("images", "image"):
            verb = "applies" if len(table_only) == 1 else "apply"
            raise ConfigError(f"{', '.join(table_only)} {verb} to parquet and petastorm inputs, not "
                              f"--input-format {self.format}")
        if self.glob is not None and self.format in ("parquet", "petastorm"):
            raise ConfigError(f"--glob applies to image files, not --input-format {self.format}")


@dataclass(frozen=True)
class ClassifyConfig:
    """Everything `spark-cnn classify` needs. `batch_size=None` means auto (chosen per device)."""

    input: str
    output: str
    model: ModelSpec
    labels: str | None = None
    top_k: int | None = None
    master: str | None = None
    batch_size: int | None = None
    device: str = "auto"
    precision: str = "auto"
    channels_last: bool | None = None
    compile: bool = False
    decode: str = "auto"
    threads: int | None = None
    on_error: str = "record"
    summary: str | None = None
    logits: bool = False
    embeddings: bool = False
    overwrite: bool = False
    quiet: bool = False
    request_rows: int = DEFAULT_REQUEST_ROWS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    layer: str | None = None  # embeddings from this module's output instead of the last Linear's input
    request_timeout_s: float = REPLY_TIMEOUT_S
    inputs: InputOptions = InputOptions()
    partition_by: str | None = None

    def __post_init__(self) -> None:
        if not self.input:
            raise ConfigError("INPUT is empty: give a folder of images")
        if not self.output:
            raise ConfigError("OUTPUT is empty: give a path for the Parquet output")
        _ = self.inference_options  # validates the model and run options
        if self.partition_by is not None and self.partition_by not in PARTITION_COLUMNS:
            raise ConfigError(f"--partition-by {self.partition_by}: expected one of {', '.join(PARTITION_COLUMNS)}")

    @property
    def run_options(self) -> RunOptions:
        return self.inference_options.run_options

    @property
    def decode_options(self) -> DecodeOptions:
        return self.inference_options.decode_options

    @property
    def inference_options(self) -> InferenceOptions:
        """The model and run options of this job, as the DataFrame functions and the UDF take them: every
        InferenceOptions field, which ClassifyConfig declares too (flat, as the CLI and presets fill it)."""
        return InferenceOptions(**{f.name: getattr(self, f.name) for f in fields(InferenceOptions)})


@dataclass(frozen=True)
class InferenceOptions:
    """Which model runs and how: shared by the jobs (through ClassifyConfig), `spark_cnn.classify(df)`,
    `spark_cnn.embed(df)` and `cnn_udf`. `labels` is a file of class names (one per line) or the names
    themselves; `batch_size=None` means auto (chosen per device)."""

    model: ModelSpec
    labels: str | Sequence[str] | None = None
    top_k: int | None = None
    logits: bool = False
    embeddings: bool = False
    layer: str | None = None
    batch_size: int | None = None
    device: str = "auto"
    precision: str = "auto"
    channels_last: bool | None = None
    compile: bool = False
    decode: str = "auto"
    threads: int | None = None
    on_error: str = "record"
    request_rows: int = DEFAULT_REQUEST_ROWS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    max_pixels: int = DEFAULT_MAX_PIXELS
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    request_timeout_s: float = REPLY_TIMEOUT_S  # no reply for this long: the sidecar hangs and is replaced

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelSpec):
            raise ConfigError(f"model must be a ModelSpec, got {type(self.model).__name__}")
        if self.labels is not None and not isinstance(self.labels, str):
            names = tuple(str(name) for name in self.labels)
            if not names:
                raise ConfigError("labels is empty: give a file of class names or a non-empty list of names")
            object.__setattr__(self, "labels", names)
        if self.layer is not None and not self.embeddings:
            raise ConfigError(f"--layer {self.layer} picks the embedding layer; it needs embeddings")
        if not DEVICE_PATTERN.match(self.device):
            raise ConfigError(f"--device {self.device}: expected auto, cpu, cuda or cuda:N")
        if self.on_error not in ON_ERROR_CHOICES:
            raise ConfigError(f"--on-error {self.on_error}: expected one of {', '.join(ON_ERROR_CHOICES)}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"--batch-size {self.batch_size}: expected auto or a positive integer")
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"--top-k {self.top_k}: expected a positive integer")
        if self.request_rows < 1 or self.max_in_flight < 1:
            raise ConfigError("request rows and requests in flight must be positive")
        if self.decode not in DECODE_CHOICES:
            raise ConfigError(f"--decode {self.decode}: expected one of {', '.join(DECODE_CHOICES)}")
        if self.decode == "gpu" and self.device == "cpu":
            raise ConfigError("--decode gpu needs a CUDA device; drop --device cpu or decode in the tasks")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"--threads {self.threads}: expected a positive integer")
        _ = self.run_options  # validates precision and batch size
        _ = self.decode_options  # validates the guard rails
        if self.idle_timeout_s <= 0:
            raise ConfigError(f"sidecar idle timeout must be positive, got {self.idle_timeout_s}")
        if not self.request_timeout_s > 0:
            raise ConfigError(f"--request-timeout {self.request_timeout_s}: expected a positive number of seconds")

    @property
    def decode_options(self) -> DecodeOptions:
        """Guard rails for every decode, in the tasks and in the sidecar."""
        return DecodeOptions(max_pixels=self.max_pixels, max_file_bytes=self.max_file_bytes)

    @property
    def run_options(self) -> RunOptions:
        return RunOptions(batch_size=self.batch_size, precision=self.precision, channels_last=self.channels_last,
                          compile=self.compile)


def parse_batch_size(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--batch-size {text}: expected auto or a positive integer") from None


# Files per ETL micro-batch: a killed run redoes at most this many images, and each batch's output directory
# stays a few hundred MB of JPEG input; a backlog of a million files still makes only ~1,000 batches.
DEFAULT_MAX_FILES_PER_TRIGGER = 1000


@dataclass(frozen=True)
class EtlConfig:
    """`spark-cnn etl`: the classify options plus where the stream keeps its progress."""

    classify: ClassifyConfig
    checkpoint: str
    max_files_per_trigger: int = DEFAULT_MAX_FILES_PER_TRIGGER

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ConfigError("etl needs --checkpoint DIR: the folder where it remembers which images it has done")
        if self.max_files_per_trigger < 1:
            raise ConfigError(f"--max-files-per-trigger {self.max_files_per_trigger}: expected a positive integer")
        if self.classify.overwrite:
            raise ConfigError("etl appends to OUTPUT; --overwrite does not apply (to start over, delete OUTPUT "
                              "and the checkpoint)")


# Row groups of 64 MiB: petastorm's readers load one row group per worker; a few dozen megabytes keeps
# memory per worker bounded while amortising per-group overheads (petastorm's examples use 64-256 MiB).
DEFAULT_ROW_GROUP_MB = 64


@dataclass(frozen=True)
class PetastormConfig:
    """Everything `spark-cnn to-petastorm` needs: images in (any input format), a Petastorm dataset out."""

    input: str
    output: str
    inputs: InputOptions = InputOptions()
    codec: str = "png"
    jpeg_quality: int = 95
    row_group_mb: int = DEFAULT_ROW_GROUP_MB
    master: str | None = None
    on_error: str = "record"
    overwrite: bool = False
    quiet: bool = False

    def __post_init__(self) -> None:
        from spark_cnn.formats.petastorm import WRITE_CODECS

        if not self.input or not self.output:
            raise ConfigError("INPUT and OUTPUT must both be given")
        if self.codec not in WRITE_CODECS:
            raise ConfigError(f"--codec {self.codec}: expected one of {', '.join(WRITE_CODECS)}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError(f"--jpeg-quality {self.jpeg_quality}: expected 1..100")
        if self.row_group_mb < 1:
            raise ConfigError(f"--row-group-mb {self.row_group_mb}: expected a positive number of MiB")
        if self.on_error not in ON_ERROR_CHOICES:
            raise ConfigError(f"--on-error {self.on_error}: expected one of {', '.join(ON_ERROR_CHOICES)}")
