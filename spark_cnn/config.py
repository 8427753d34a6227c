"""Job configuration as frozen, validated data. CLI flags, YAML presets and `spark.cnn.*` settings only fill these.

Each option is declared here once, as a field (`spark_cnn.options.option`): its default, help, choices and
parsing; the flags, preset keys, `spark.cnn.*` keys and docs/options.md are generated from these declarations.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass

from spark_cnn.errors import ConfigError
from spark_cnn.formats.petastorm import DEFAULT_JPEG_QUALITY, WRITE_CODECS
from spark_cnn.imaging.limits import DEFAULT_DECODE, DecodeOptions
from spark_cnn.imaging.preprocess import INTERPOLATIONS
from spark_cnn.models.spec import ModelSpec
from spark_cnn.options import check_choices, nested, option, same_as
from spark_cnn.perf.profile import read_profile_file
from spark_cnn.task.client import DEFAULT_MAX_IN_FLIGHT, DEFAULT_REQUEST_ROWS, REPLY_TIMEOUT_S
from spark_cnn.task.launcher import DEFAULT_IDLE_TIMEOUT_S
from spark_cnn.task.object_store import OPTION_KEYS, StorageOptions
from spark_cnn.task.run_options import (  # noqa: F401  (parse_batch_size: re-exported for the commands)
    DECODE_CHOICES,
    DEFAULT_DECODE_PLACE,
    RunOptions,
    parse_batch_size,
)
from spark_cnn.task.schema import CLASSES, OUTPUT_KINDS, RAW, TASKS

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
ON_ERROR_CHOICES = ("record", "fail")
FILE_FORMATS = ("images", "image")  # one file per image (binaryFile, Spark's image source)
TABLE_FORMATS = ("parquet", "petastorm")  # a table with an image column
INPUT_FORMATS = ("auto", *FILE_FORMATS, *TABLE_FORMATS)
# Output columns a job may partition its Parquet by: small, repeated values (never paths, scores or vectors).
PARTITION_COLUMNS = ("label", "label_name", "true_label")
# The commands that write classes, and so have the classification heads' flags (etl classifies).
CLASS_COMMANDS = ("classify", "etl")


def storage_pairs(text) -> tuple[tuple[str, str], ...]:
    """`k=v[,k=v...]` (or several such texts, or (k, v) pairs) -> ((k, v), ...): --storage-option's parsing."""
    return StorageOptions.parse(text).pairs


storage_pairs.accepts_mapping = True  # a preset may give the pairs as a YAML mapping (resolution.convert)


def floats(text: str) -> tuple[float, ...]:
    """`0.5,0.5,0.5` -> (0.5, 0.5, 0.5): per-channel values."""
    return tuple(float(v) for v in text.split(","))


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

    format: str = option("auto", name="input_format", group="input", choices=INPUT_FORMATS,
                         help="auto: petastorm if INPUT has a Unischema, parquet if it holds only .parquet files, "
                              "else images; image = Spark's image data source", reaches="reader", example="images")
    glob: str | None = option(None, group="input",
                              help="only image files whose name matches, e.g. '*.jpg' or '*.{jpg,png}'",
                              reaches="reader", example="*.png")
    image_column: str | None = option(None, group="input",
                                      help="parquet/petastorm: the image column (default: the only one)",
                                      reaches="reader", example="img")
    path_column: str | None = option(None, group="input", help="parquet/petastorm: the row id written as `path` "
                                                               "(default: a column named path, id, ...; else file#row)",
                                                               reaches="reader", example="key")
    label_column: str | None = option(None, group="input",
                                      help="parquet/petastorm: the true class (name or index), for accuracy",
                                      reaches="reader", example="cls")
    storage_options: tuple[tuple[str, str], ...] = option(
        (), group="input", flag="--storage-option", parse=storage_pairs, metavar="KEY=VALUE", repeatable=True,
        help="object-store inputs (s3://, gs://, abfs://, az://, hdfs://): a setting for the driver's listing and "
             "the tasks' reads, over the store's own credential chain; repeatable. Keys: "
             f"{', '.join(OPTION_KEYS)} (e.g. endpoint=http://127.0.0.1:9000, region=eu-west-1, anonymous=true)",
             reaches="reader", example="region=eu-west-1")

    def __post_init__(self) -> None:
        object.__setattr__(self, "storage_options", StorageOptions.parse(self.storage_options).pairs)
        check_choices(self)
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


# The classifier a job runs when none is named: a small torchvision model that runs on a CPU. detect's and
# segment's defaults are small models of their kind, for the same reason.
DEFAULT_MODEL = "resnet50"
DENSE_DEFAULT_MODELS = (("detect", "fasterrcnn_mobilenet_v3_large_320_fpn"), ("segment", "lraspp_mobilenet_v3_large"))
PREPROCESSING_OPTIONS = ("resize", "crop", "interpolation", "mean", "std")
# The commands with preprocessing flags (a detector takes images as they are), and those that crop (classifiers).
PREPROCESSING_COMMANDS = ("classify", "embed", "etl", "segment")
CROP_COMMANDS = ("classify", "embed", "etl")
_PREPROCESSING = {"group": "model", "commands": PREPROCESSING_COMMANDS, "command_only": True}


@dataclass(frozen=True)
class ModelOptions:
    """The model as options name it; `value()` is the ModelSpec a job runs (InferenceOptions.model).
    Preprocessing options left out keep the model's own, decided when the model is resolved.

    >>> ModelOptions("resnet18", crop=200).value()
    ModelSpec(source='resnet18', weights=None, preprocessing={'crop': 200})
    """

    model: str = option(DEFAULT_MODEL, group="model", default_for=DENSE_DEFAULT_MODELS,
                        help="torchvision model name, TorchScript file, module:factory, timm:NAME[.TAG] (the timm "
                             "extra), or an MLflow PyTorch model: models:/NAME/VERSION, models:/NAME@ALIAS, "
                             "runs:/RUN_ID/PATH or a local MLflow model directory (the mlflow extra)",
                             reaches="sidecar", example="mobilenet_v3_small")
    weights: str | None = option(None, group="model",
                                 help="state_dict file (loaded with weights_only=True); for a torchvision model also "
                                      "its weights by name (DEFAULT, IMAGENET1K_V2, ResNet50_Weights.IMAGENET1K_V2: "
                                      "from TORCH_HOME's cache, else downloaded once); for a timm model DEFAULT "
                                      "(timm's pretrained weights); or random",
                                      reaches="sidecar", example="weights.pth")
    resize: int | None = option(None, **_PREPROCESSING,
                                help="shorter side before cropping (default: the weights' or the model's, else 256); "
                                     "segment: the shorter side an image is sent at (default: the weights', "
                                     "else 520)", reaches="sidecar", example="288")
    crop: int | None = option(None, group="model", commands=CROP_COMMANDS, command_only=True,
                              help="centre crop size (default: the weights' or the model's, else 224)",
                              reaches="sidecar", example="256")
    interpolation: str | None = option(None, **_PREPROCESSING, choices=INTERPOLATIONS,
                                       help="resize filter (default: the weights' or the model's, else bilinear)",
                                       reaches="sidecar", example="bicubic")
    mean: tuple[float, ...] | None = option(None, **_PREPROCESSING, parse=floats, metavar="R,G,B",
                                            help="normalisation mean (default: the weights', else ImageNet)",
                                            reaches="sidecar", example="0.4,0.4,0.4")
    std: tuple[float, ...] | None = option(None, **_PREPROCESSING, parse=floats, metavar="R,G,B",
                                           help="normalisation std (default: the weights', else ImageNet)",
                                           reaches="sidecar", example="0.3,0.3,0.3")

    def value(self) -> ModelSpec:
        prep = {k: getattr(self, k) for k in PREPROCESSING_OPTIONS if getattr(self, k) is not None}
        return ModelSpec(self.model, weights=self.weights, preprocessing=prep or None)


@dataclass(frozen=True)
class InferenceOptions:
    """Which model runs and how: shared by the jobs (ClassifyConfig.inference), `spark_cnn.classify(df)`,
    `spark_cnn.embed(df)` and `cnn_udf`. `labels` is a file of class names (one per line) or the names
    themselves; `batch_size=None` means auto (chosen per device).

    >>> InferenceOptions(ModelSpec("resnet18"), batch_size=32).run_options.batch_size
    32
    """

    model: ModelSpec = nested(via=ModelOptions)
    labels: str | Sequence[str] | None = option(
        None, group="model", commands=(*CLASS_COMMANDS, "detect", "segment"),
        help="class names, one per line, in class-index order (default: the named torchvision weights' "
             "categories, or timm's pretrained label names)", reaches="tasks", example="labels.txt")
    top_k: int | None = option(None, group="model", commands=CLASS_COMMANDS,
                               help="classes to keep per image (default: min(5, classes))",
                               reaches="sidecar", example="3")
    logits: bool = option(False, group="output", commands=CLASS_COMMANDS, help="add the logits column",
                          reaches="sidecar")
    embeddings: bool = option(False, group="output", commands=CLASS_COMMANDS,
                              help="add the embedding column (last layer's input)", reaches="sidecar")
    layer: str | None = option(None, group="model", commands=("embed",),
                               help="module whose output is the embedding (a name from the model's named_modules(), "
                                    "e.g. layer4; averaged over space; default: the input of the last Linear layer)",
                                    reaches="sidecar", example="features")
    output_kind: str = option(CLASSES, group="output", commands=CLASS_COMMANDS, flag="--output", metavar="KIND",
                              choices=OUTPUT_KINDS,
                              help="classes: label, score, top-k; raw: the model's one output tensor per image as "
                                   "`raw` (array<float>, row-major) and `shape` (array<int>), for any model that is "
                                   "not a classifier", reaches="sidecar", example="raw")
    batch_size: int | None = same_as(RunOptions, "batch_size")
    device: str = option("auto", help="auto | cpu | cuda | cuda:N", reaches="tasks", example="cpu")
    precision: str = same_as(RunOptions, "precision")
    channels_last: bool | None = same_as(RunOptions, "channels_last")
    compile: bool = same_as(RunOptions, "compile")
    decode: str = option(DEFAULT_DECODE_PLACE, choices=DECODE_CHOICES,
                         help="where images are decoded: Spark tasks, sidecar threads, or the GPU (nvJPEG); auto: "
                              "the sidecar picks from its device, the decode cost and the model's predicted rate",
                              reaches="tasks", example="sidecar")
    threads: int | None = option(None, help="torch CPU threads per compute thread of a CPU sidecar (default: half "
                                            "the cores; up to two compute threads cover the cores)",
                                            reaches="tasks", example="2")
    on_error: str = option("record", choices=ON_ERROR_CHOICES,
                           help="an unreadable image: record it in the error column, or fail the job",
                           reaches="tasks", example="fail")
    request_rows: int = option(DEFAULT_REQUEST_ROWS, commands=(), help="rows per request a task sends its sidecar",
                               reaches="tasks", example="32")
    max_in_flight: int = option(DEFAULT_MAX_IN_FLIGHT, commands=(),
                                help="requests a task keeps unanswered at its sidecar", reaches="tasks", example="16")
    idle_timeout_s: float = option(DEFAULT_IDLE_TIMEOUT_S, commands=(),
                                   help="seconds a sidecar with no connection waits before it exits",
                                   reaches="tasks", example="600")
    max_pixels: int = same_as(DecodeOptions, "max_pixels")
    max_file_bytes: int = same_as(DecodeOptions, "max_file_bytes")
    request_timeout_s: float = option(REPLY_TIMEOUT_S, flag="--request-timeout", metavar="SECONDS",
                                      help="a sidecar that neither answers a request nor completes any batch for "
                                           "this long is stopped and the task retried; waiting behind other tasks' "
                                           "batches does not count", reaches="tasks", example="600")
    device_profile: str | None = option(None, metavar="FILE",
                                        help="a device profile exported with `spark-cnn profile --export` (on a host "
                                             "of the executors' device): the sidecars start their batch size from it "
                                             "instead of their own cached profile",
                                             reaches="sidecar", example="h200.json")
    # classify | detect | segment (task/schema.py TASKS): what the model must compute; set by the command
    task: str = option("classify", commands=(), command_only=True, help="what the model computes (the command)",
                       reaches="sidecar")
    min_score: float = option(0.0, group="model", commands=("detect",), command_only=True,
                              help="drop boxes scoring less (0: keep all the model keeps)",
                              reaches="sidecar", example="0.5")
    max_detections: int | None = option(None, group="model", commands=("detect",), command_only=True,
                                        help="keep at most this many boxes per image, best first (default: the "
                                             "model's limit)", reaches="sidecar", example="3")

    def __post_init__(self) -> None:
        if not isinstance(self.model, ModelSpec):
            raise ConfigError(f"model must be a ModelSpec, got {type(self.model).__name__}")
        _check_task_options(self)
        if self.labels is not None and not isinstance(self.labels, str):
            names = tuple(str(name) for name in self.labels)
            if not names:
                raise ConfigError("labels is empty: give a file of class names or a non-empty list of names")
            object.__setattr__(self, "labels", names)
        check_choices(self)
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
        if self.top_k is not None and self.top_k < 1:
            raise ConfigError(f"--top-k {self.top_k}: expected a positive integer")
        if self.request_rows < 1 or self.max_in_flight < 1:
            raise ConfigError("request rows and requests in flight must be positive")
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


@dataclass(frozen=True)
class ClassifyConfig:
    """Everything `spark-cnn classify` (and embed) needs: paths, the input, the model and how it runs
    (`inference`), and what only the driver uses (master or a Spark Connect remote, summary, partitioning,
    overwrite, quiet).

    >>> config = ClassifyConfig("in/", "out/", InferenceOptions(ModelSpec("resnet18"), top_k=3))
    >>> config.inference.top_k, config.inputs.format
    (3, 'auto')
    """

    input: str = option(metavar="INPUT", help="folder of images (searched recursively), path or URI", reaches="driver")
    output: str = option(metavar="OUTPUT", help="Parquet output directory, path or URI", reaches="driver")
    inference: InferenceOptions = nested()
    inputs: InputOptions = nested(InputOptions())
    master: str | None = option(None, help="Spark master URL (default: Spark's, local[*] outside spark-submit)",
                                reaches="driver", example="local[1]")
    summary: str | None = option(None, group="output", help="also write the JSON summary here",
                                 reaches="driver", example="summary.json")
    partition_by: str | None = option(None, group="output", commands=(*CLASS_COMMANDS, "embed"),
                                      choices=PARTITION_COLUMNS, help="partition the Parquet output by this column",
                                      reaches="driver", example="label")
    overwrite: bool = option(False, group="output", help="replace OUTPUT if it exists", reaches="driver")
    quiet: bool = option(False, group="output", help="print nothing but errors", reaches="driver")
    remote: str | None = option(None, metavar="sc://HOST:PORT",
                                help="run on this Spark Connect server (default: SPARK_REMOTE when set, as pyspark "
                                     "reads it)", reaches="driver", example="sc://127.0.0.1:15002")

    def __post_init__(self) -> None:
        if not self.input:
            raise ConfigError("INPUT is empty: give a folder of images")
        check_remote(self.master, self.remote)
        if not self.output:
            raise ConfigError("OUTPUT is empty: give a path for the Parquet output")
        if not isinstance(self.inference, InferenceOptions):
            raise ConfigError(f"inference must be InferenceOptions, got {type(self.inference).__name__}")
        check_choices(self)
        if self.inference.output_kind == RAW and self.partition_by in ("label", "label_name"):
            raise ConfigError(f"--partition-by {self.partition_by}: --output raw writes no classes; partition by "
                              "true_label or not at all")


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
    # Not required by the parser: a preset or spark.cnn.checkpoint may give it; __post_init__ insists on it.
    checkpoint: str = option("", group="incremental", metavar="DIR",
                             help="where the stream remembers which images are done (keep it with OUTPUT; required)",
                             reaches="driver", example="checkpoint/")
    max_files_per_trigger: int = option(DEFAULT_MAX_FILES_PER_TRIGGER, group="incremental", metavar="N",
                                        help="images per micro-batch: a killed run redoes at most one batch",
                                        reaches="driver", example="1000")
    max_bytes_per_trigger: int = option(DEFAULT_MAX_BYTES_PER_TRIGGER, group="incremental", metavar="SIZE",
                                        parse=byte_size, default_text=f"{DEFAULT_MAX_BYTES_PER_TRIGGER >> 30}g",
                                        help="bytes of input per micro-batch, e.g. 2g: large photos end a batch "
                                             "before --max-files-per-trigger does", reaches="driver", example="512m")
    settle_s: float = option(DEFAULT_SETTLE_S, name="settle_seconds", group="incremental", metavar="S",
                             help="take a file only once nothing has changed it for S seconds, so a copy in "
                                  "progress waits for the next run; 0: take every file at once",
                                  reaches="driver", example="120")

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

    input: str = option(metavar="INPUT", help="image folder, Parquet table or Petastorm dataset", reaches="driver")
    output: str = option(metavar="OUTPUT", help="the Petastorm dataset directory to write, path or URI",
                         reaches="driver")
    inputs: InputOptions = nested(InputOptions())
    decode_options: DecodeOptions = nested(DEFAULT_DECODE)
    codec: str = option(WRITE_CODECS[0], group="output", choices=WRITE_CODECS,
                        help="how images are stored: png (lossless), jpeg, or ndarray (raw RGB arrays)",
                        reaches="tasks", example="jpeg")
    jpeg_quality: int = option(DEFAULT_JPEG_QUALITY, group="output", help="with --codec jpeg: 1..100",
                               reaches="tasks", example="90")
    row_group_mb: int = option(DEFAULT_ROW_GROUP_MB, group="output", help="Parquet row group size in MiB",
                               reaches="driver", example="128")
    master: str | None = same_as(ClassifyConfig, "master")
    remote: str | None = same_as(ClassifyConfig, "remote")
    on_error: str = same_as(InferenceOptions, "on_error")
    overwrite: bool = same_as(ClassifyConfig, "overwrite")
    quiet: bool = same_as(ClassifyConfig, "quiet")

    def __post_init__(self) -> None:
        if not self.input or not self.output:
            raise ConfigError("INPUT and OUTPUT must both be given")
        check_choices(self)
        check_remote(self.master, self.remote)
        if not 1 <= self.jpeg_quality <= 100:
            raise ConfigError(f"--jpeg-quality {self.jpeg_quality}: expected 1..100")
        if self.row_group_mb < 1:
            raise ConfigError(f"--row-group-mb {self.row_group_mb}: expected a positive number of MiB")
