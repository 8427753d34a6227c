"""Job configuration as frozen, validated data. CLI flags (and later YAML presets) only fill these."""

from __future__ import annotations

import re
from dataclasses import dataclass

from spark_cnn.errors import ConfigError
from spark_cnn.models.spec import ModelSpec
from spark_cnn.sidecar.client import DEFAULT_MAX_IN_FLIGHT
from spark_cnn.sidecar.launcher import DEFAULT_IDLE_TIMEOUT_S
from spark_cnn.sidecar.options import DECODE_CHOICES, RunOptions

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
ON_ERROR_CHOICES = ("record", "fail")
# Rows per request a task sends: large enough to amortise a message (~0.1 ms), small enough that the
# batcher can fill device batches from several tasks at once.
DEFAULT_REQUEST_ROWS = 16


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

    def __post_init__(self) -> None:
        if not self.input:
            raise ConfigError("INPUT is empty: give a folder of images")
        if not self.output:
            raise ConfigError("OUTPUT is empty: give a path for the Parquet output")
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
        if self.idle_timeout_s <= 0:
            raise ConfigError(f"sidecar idle timeout must be positive, got {self.idle_timeout_s}")


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
