"""Job configuration as frozen, validated data. CLI flags (and later YAML presets) only fill these."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from dataclasses import MISSING, dataclass, field

from spark_cnn.errors import ConfigError
from spark_cnn.formats.petastorm import DEFAULT_JPEG_QUALITY, WRITE_CODECS
from spark_cnn.imaging.limits import DEFAULT_DECODE, DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, DecodeOptions
from spark_cnn.models.spec import ModelSpec
from spark_cnn.task.client import DEFAULT_MAX_IN_FLIGHT, DEFAULT_REQUEST_ROWS, REPLY_TIMEOUT_S
from spark_cnn.task.launcher import DEFAULT_IDLE_TIMEOUT_S
from spark_cnn.task.object_store import StorageOptions
from spark_cnn.task.run_options import DECODE_CHOICES, RunOptions
from spark_cnn.task.schema import CLASSES, OUTPUT_KINDS, RAW, TASKS

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
ON_ERROR_CHOICES = ("record", "fail")
FILE_FORMATS = ("images", "image")  # one file per image (binaryFile, Spark's image source)
TABLE_FORMATS = ("parquet", "petastorm")  # a table with an image column
INPUT_FORMATS = ("auto", *FILE_FORMATS, *TABLE_FORMATS)
# Output columns a job may partition its Parquet by: small, repeated values (never paths, scores or vectors).
PARTITION_COLUMNS = ("label", "label_name", "true_label")


# Field metadata read by the CLI's option table (cli/resolution.py). NESTED: the field holds another options
# dataclass whose own fields are options, under their flat names (flags, preset keys and spark.cnn.* keys stay
# flat: --batch-size fills ClassifyConfig.inference.batch_size). OPTION_NAME: the flat name when it is not the
# field's own (InputOptions.format is --input-format).
NESTED = "spark_cnn.nested"
OPTION_NAME = "spark_cnn.option"
# COMMAND_ONLY: set by the command that runs (detect and segment set `task`; detect has --min-score and
# --max-detections), so never a preset key or spark.cnn.* setting of a command without that flag.
COMMAND_ONLY = "spark_cnn.command_only"


def nested(default=MISSING):
    """A dataclass field holding nested options (see NESTED)."""
    return field(default=default, metadata={NESTED: True})


@dataclass(frozen=True)
class InputOptions:
    """Where the images come from and how to find them in the input (`spark/sources.py` reads them).

    format: auto | images (files, binaryFile) | image (Spark's image source) | parquet | petastorm.
    glob: file-name pattern for images/image (Hadoop glob: *, ?, [ab], {jpg,png}).
    image_column / path_column / label_column: for parquet and petastorm inputs; the path column is the row's id
    in the output, the label column (the true class) fills `true_label`.
    storage_options: (KEY, VALUE) pairs for object-store inputs (endpoint, region, anonymous, ...; see
    task/object_store.py), given as `KEY=VALUE` texts or a mapping; the driver's listing and the tasks use them.
    """

    format: str = field(default="auto", metadata={OPTION_NAME: "input_format"})
    glob: str | None = None
    image_column: str | None = None
    path_column: str | None = None
    label_column: str | None = None
    storage_options: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage_options", StorageOptions.parse(self.storage_options).pairs)
        if self.format not in INPUT_FORMATS:
            raise ConfigError(f"--input-format {self.format}: expected one of {', '.join(INPUT_FORMATS)}")
        if self.glob is not None and (not self.glob or "/" in self.glob):
            raise ConfigError(f"--glob {self.glob!r}: expected a file-name pattern such as '*.jpg' (no '/')")
        table_only = [f"--{name.replace('_', '-')}" for name in ("image_column", "path_column", "label_column")
                      if getattr(self, name) is not None]
        if table_only and self.format in FILE_FORMATS:
            verb = "applies" if len(table_only) == 1 else "apply"
            raise ConfigError(f"{', '.join(table_only)} {verb} to parquet and petastorm inputs, not "
                              f"--input-format {self.format}")
        if self.glob is not None and self.format in TABLE_FORMATS:
            raise ConfigError(f"--glob applies to image files, not --input-format {self.format}")


@dataclass(frozen=True)
class InferenceOptions:
    """Which model runs and how: shared by the jobs (ClassifyConfig.inference), `spark_cnn.classify(df)`,
    `spark_cnn.embed(df)` and `cnn_udf`. `labels` is a file of class names (one per line) or the names
    themselves; `batch_size=None` means auto (chosen per device).

    >>> InferenceOptions(ModelSpec("resnet18"), batch_size=32).run_options.batch_size
    32
    """

    model: ModelSpec
    labels: str | Sequence[str] | None = None
    top_k: int | None = None
    logits: bool = False
    embeddings: bool = False
    layer: str | None = None  # embeddings from this module's output instead of the last Linear's input
    output_kind: str = CLASSES  # --output: classes, or raw (the model's one output tensor, task/schema.py)
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
    request_timeout_s: float = REPLY_TIMEOUT_S  # no reply nor batch completed for this long: hung, replaced
    device_profile: str | None = None  # an exported device profile (file) the sidecars start from
    # classify | detect | segment (task/schema.py TASKS): what the model must compute
    task: str = field(default="classify", metadata={COMMAND_ONLY: True})
    min_score: float = field(default=0.0, metadata={COMMAND_ONLY: True})  # detect: drop boxes scoring less
    # detect: keep at most this many boxes per image (None: the model's own limit)
    max_detections: int | None = field(default=None, metadata={COMMAND_ONLY: True})

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelSpec):
            raise ConfigError(f"model must be a ModelSpec, got {type(self.model).__name__}")
        _check_task_options(self)
        if self.labels is not None and not isinstance(self.labels, str):
            names = tuple(str(name) for name in self.labels)
            if not names:
                raise ConfigError("labels is empty: give a file of class names or a non-empty list of names")
            object.__setattr__(self, "labels", names)
        if self.output_kind not in OUTPUT_KINDS:
            raise ConfigError(f"--output {self.output_kind}: expected one of {', '.join(OUTPUT_KINDS)}")
        if self.output_kind == RAW:
            asked = (("--labels", self.labels is not None), ("--top-k", self.top_k is not None),
                     ("--logits", self.logits), ("--embeddings", self.embeddings))
            heads = [flag for flag, given in asked if given]
            if heads:
                raise ConfigError(f"--output raw writes the model's whole output, without classes: drop "
                                  f"{', '.join(heads)}")
        if self.layer is not None and not self.embeddings:
            raise ConfigError(f"--layer {self.layer} picks the embedding layer; it needs embeddings")
        if not DEVICE_PATTERN.match(self.device):
            raise ConfigError(f"--device {self.device}: expected auto, cpu, cuda or cuda:N")
        check_on_error(self.on_error)
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
        """How the sidecar runs the model (sent in the HELLO)."""
        return RunOptions(batch_size=self.batch_size, precision=self.precision, channels_last=self.channels_last,
                          compile=self.compile, device_profile=device_profile_text(self.device_profile))


def device_profile_text(path: str | None) -> str | None:
    """The JSON of the device profile exported to `path` (None for None), checked: ConfigError (one line) when
    it is missing, malformed or of another profile version. Read once per file version."""
    if path is None:
        return None
    try:
        stamp = os.stat(os.path.expanduser(path)).st_mtime_ns
    except OSError:
        stamp = None  # read_profile_file says what is wrong
    return _checked_profile_text(path, stamp)


@functools.lru_cache(maxsize=8)
def _checked_profile_text(path: str, stamp: int | None) -> str:
    from spark_cnn.perf.calibration import read_profile_file

    return read_profile_file(path).to_json()


def _check_task_options(options: InferenceOptions) -> None:
    """Options that fit one task only: classification heads, detection limits, and where images decode (detectors
    and segmenters take images at their own sizes, which the tasks make)."""
    if options.task not in TASKS:
        raise ConfigError(f"task {options.task!r}: expected one of {', '.join(TASKS)}")
    if options.task == "classify":
        given = [flag for flag, value in (("--min-score", options.min_score != 0.0),
                                          ("--max-detections", options.max_detections is not None)) if value]
        if given:
            raise ConfigError(f"{', '.join(given)}: for spark-cnn detect, not classify")
        return
    heads = [flag for flag, value in (("--logits", options.logits), ("--embeddings", options.embeddings),
                                      ("--top-k", options.top_k is not None), ("--layer", options.layer),
                                      ("--output raw", options.output_kind == RAW)) if value]
    if heads:
        raise ConfigError(f"{', '.join(heads)}: classification outputs; {options.task} writes its own columns")
    if options.decode not in ("auto", "task"):
        raise ConfigError(f"--decode {options.decode}: {options.task} sends each image at its own size, which the "
                          "Spark tasks make; use --decode auto or task")
    if options.task == "segment" and (options.min_score != 0.0 or options.max_detections is not None):
        raise ConfigError("--min-score and --max-detections are for spark-cnn detect, not segment")
    if not 0.0 <= options.min_score <= 1.0:
        raise ConfigError(f"--min-score {options.min_score}: expected a score between 0 and 1")
    if options.max_detections is not None and options.max_detections < 1:
        raise ConfigError(f"--max-detections {options.max_detections}: expected a positive integer")


# How pyspark names a Spark Connect server: `sc://host:port[/;params]`, or `local[...]` for one it starts itself.
REMOTE_PREFIXES = ("sc://", "local")
REMOTE_ENV = "SPARK_REMOTE"  # pyspark's own: a session built while it is set is a Spark Connect session


def check_remote(master: str | None, remote: str | None) -> None:
    """`remote` must name a Spark Connect server, and a job has a master or a remote (given, or SPARK_REMOTE),
    never both."""
    if remote is not None and not remote.startswith(REMOTE_PREFIXES):
        raise ConfigError(f"--remote {remote}: expected a Spark Connect URL, sc://HOST:PORT (or local[N] to start "
                          "a local server)")
    if master and (remote or os.environ.get(REMOTE_ENV)):
        where = f"--remote {remote}" if remote else f"{REMOTE_ENV}={os.environ[REMOTE_ENV]}"
        raise ConfigError(f"--master {master} and {where}: a Spark Connect server has its own master; give one "
                          "of them")


def check_on_error(on_error: str) -> None:
    if on_error not in ON_ERROR_CHOICES:
        raise ConfigError(f"--on-error {on_error}: expected one of {', '.join(ON_ERROR_CHOICES)}")


@dataclass(frozen=True)
class ClassifyConfig:
    """Everything `spark-cnn classify` (and embed) needs: paths, the input, the model and how it runs
    (`inference`), and what only the driver uses (master or a Spark Connect remote, summary, partitioning,
    overwrite, quiet).

    >>> config = ClassifyConfig("in/", "out/", InferenceOptions(ModelSpec("resnet18"), top_k=3))
    >>> config.inference.top_k, config.inputs.format
    (3, 'auto')
    """

    input: str
    output: str
    inference: InferenceOptions = nested()
    inputs: InputOptions = nested(InputOptions())
    master: str | None = None
    summary: str | None = None
    partition_by: str | None = None
    overwrite: bool = False
    quiet: bool = False
    remote: str | None = None

    def __post_init__(self) -> None:
        if not self.input:
            raise ConfigError("INPUT is empty: give a folder of images")
        check_remote(self.master, self.remote)
        if not self.output:
            raise ConfigError("OUTPUT is empty: give a path for the Parquet output")
        if not isinstance(self.inference, InferenceOptions):
            raise ConfigError(f"inference must be InferenceOptions, got {type(self.inference).__name__}")
        if self.partition_by is not None and self.partition_by not in PARTITION_COLUMNS:
            raise ConfigError(f"--partition-by {self.partition_by}: expected one of {', '.join(PARTITION_COLUMNS)}")
        if self.inference.output_kind == RAW and self.partition_by in ("label", "label_name"):
            raise ConfigError(f"--partition-by {self.partition_by}: --output raw writes no classes; partition by "
                              "true_label or not at all")

def parse_batch_size(text: str) -> int | None:
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--batch-size {text}: expected auto or a positive integer") from None


_BYTE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "g": 1 << 30, "gb": 1 << 30,
               "t": 1 << 40, "tb": 1 << 40, "p": 1 << 50, "pb": 1 << 50}


def byte_size(text: str) -> int:
    """A Spark size setting in bytes: `134217728`, `134217728b`, `128m`, `128MB`, `4k`.

    >>> byte_size("128MB"), byte_size("4194304b"), byte_size("1g")
    (134217728, 4194304, 1073741824)
    """
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", str(text))
    if match is None or match.group(2).lower() not in _BYTE_UNITS:
        raise ConfigError(f"{text!r} is not a size in bytes (e.g. 128m)")
    return int(match.group(1)) * _BYTE_UNITS[match.group(2).lower()]


# Files per ETL micro-batch. Each micro-batch pays a fixed cost (a Spark job, its staging folder, the rename, the
# checkpoint's files: ~0.4 s on the 2-core host), so 1,000-file batches of small images ran at half the rate of
# one batch (docs/benchmarks.md); 50,000 small images are ~20-40 s of work on two cores, while a killed run
# redoes at most one batch (and `--max-bytes-per-trigger` bounds it for large files).
DEFAULT_MAX_FILES_PER_TRIGGER = 50_000
# Bytes per ETL micro-batch: a batch of large photos ends long before 50,000 files (8 GiB is ~30,000 300 KB JPEGs,
# minutes of work on a CPU executor), so what a killed run redoes stays bounded by work, not only by count.
DEFAULT_MAX_BYTES_PER_TRIGGER = 8 << 30
# A file unchanged this long is taken as complete: a copy in progress updates its modification time far more
# often, and a cron interval is much longer.
DEFAULT_SETTLE_S = 30.0


@dataclass(frozen=True)
class EtlConfig:
    """`spark-cnn etl`: the classify options plus where the stream keeps its progress."""

    classify: ClassifyConfig = nested()
    checkpoint: str = ""
    max_files_per_trigger: int = DEFAULT_MAX_FILES_PER_TRIGGER
    max_bytes_per_trigger: int = DEFAULT_MAX_BYTES_PER_TRIGGER
    settle_s: float = field(default=DEFAULT_SETTLE_S, metadata={OPTION_NAME: "settle_seconds"})

    def __post_init__(self) -> None:
        if not self.checkpoint:
            raise ConfigError("etl needs --checkpoint DIR: the folder where it remembers which images it has done")
        if self.max_files_per_trigger < 1:
            raise ConfigError(f"--max-files-per-trigger {self.max_files_per_trigger}: expected a positive integer")
        if self.max_bytes_per_trigger < 1:
            raise ConfigError(f"--max-bytes-per-trigger {self.max_bytes_per_trigger}: expected a positive size "
                              "(e.g. 8g)")
        if not self.settle_s >= 0:
            raise ConfigError(f"--settle-seconds {self.settle_s}: expected a number of seconds, 0 or more")
        if self.classify.overwrite:
            raise ConfigError("etl appends to OUTPUT; --overwrite does not apply (to start over, delete OUTPUT "
                              "and the checkpoint)")
        inputs = self.classify.inputs
        if inputs.format not in ("auto", "images"):
            raise ConfigError(f"--input-format {inputs.format}: etl watches a folder for new image files (auto or "
                              "images); classify a table or Spark's image source with classify")
        columns = [f"--{name.replace('_', '-')}" for name in ("image_column", "path_column", "label_column")
                   if getattr(inputs, name) is not None]
        if columns:
            raise ConfigError(f"{', '.join(columns)}: etl reads image files, which have no columns")
        if self.classify.partition_by is not None:
            raise ConfigError(f"--partition-by {self.classify.partition_by}: etl partitions OUTPUT by micro-batch "
                              "(batch=N); partition a copy with classify")


# Row groups of 64 MiB: petastorm's readers load one row group per worker; a few dozen megabytes keeps
# memory per worker bounded while amortising per-group overheads (petastorm's examples use 64-256 MiB).
DEFAULT_ROW_GROUP_MB = 64


@dataclass(frozen=True)
class PetastormConfig:
    """Everything `spark-cnn to-petastorm` needs: images in (any input format, read as the classify job reads
    them, under the same decode guard rails), a Petastorm dataset out."""

    input: str
    output: str
    inputs: InputOptions = nested(InputOptions())
    decode_options: DecodeOptions = nested(DEFAULT_DECODE)
    codec: str = WRITE_CODECS[0]
    jpeg_quality: int = DEFAULT_JPEG_QUALITY
    row_group_mb: int = DEFAULT_ROW_GROUP_MB
    master: str | None = None
    on_error: str = "record"
    overwrite: bool = False
    quiet: bool = False

    def __post_init__(self) -> None:
        if not self.input or not self.output:
            raise ConfigError("INPUT and OUTPUT must both be given")
        if self.codec not in WRITE_CODECS:
            raise ConfigError(f"--codec {self.codec}: expected one of {', '.join(WRITE_CODECS)}")
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError(f"--jpeg-quality {self.jpeg_quality}: expected 1..100")
        if self.row_group_mb < 1:
            raise ConfigError(f"--row-group-mb {self.row_group_mb}: expected a positive number of MiB")
        check_on_error(self.on_error)
