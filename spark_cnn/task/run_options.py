"""How a model runs in the sidecar: plain data, torch-free, sent by tasks in the HELLO."""

from __future__ import annotations

from dataclasses import dataclass

from spark_cnn.errors import ConfigError
from spark_cnn.options import check_choices, option

PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DECODE_PLACES = ("task", "sidecar", "gpu")
# `auto`: the sidecar picks a place from its device, the decode cost and the model's rate (perf/placement.py)
DECODE_AUTO = "auto"
DECODE_CHOICES = (DECODE_AUTO, *DECODE_PLACES)
# A job's --decode (config, InferencePlan): auto, since the right place depends on the sidecar's device, which only
# the sidecar knows.
DEFAULT_DECODE_PLACE = DECODE_AUTO
# Where a connection's images decode when its HELLO names no place: in the tasks, the client sending pixels. What
# clients that predate the field did, and what a probe or benchmark client that sends pixels means; not a job default.
PIXELS_DECODE_PLACE = "task"


def parse_batch_size(text: str) -> int | None:
    """`--batch-size` text -> rows per batch, None for auto (RunOptions checks the number).

    >>> parse_batch_size("auto"), parse_batch_size("32")
    (None, 32)
    """
    if text == "auto":
        return None
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"--batch-size {text}: expected auto or a positive integer") from None


@dataclass(frozen=True)
class RunOptions:
    """How a model runs on its device; each option can be measured on and off.

    batch_size: rows per device batch (None: the sidecar's choice for its device).
    precision: fp32, bf16, fp16, or auto (fp32 on CPU; on CUDA bf16 where top-1 agrees with fp32 on >= 99% of
    the job's first 256 images). channels_last: NHWC memory layout (None: on for CUDA, where cuDNN prefers it).
    compile: torch.compile the model (opt-in: minutes of compilation for seconds of gain on short jobs).
    device_profile: an exported device profile's JSON (`--device-profile FILE`, read and checked by the driver),
    which the sidecar's start point uses instead of its own cache; it does not change the loaded model.
    """

    batch_size: int | None = option(None, help="rows per device batch: auto or N", parse=parse_batch_size,
                                    default_text="auto", metavar="auto|N", reaches="sidecar", example="8")
    precision: str = option("auto", choices=PRECISIONS,
                            help="auto: fp32 on CPU; on CUDA bf16 where top-1 agrees with fp32 on >= 99% of the "
                                 "first images", reaches="sidecar", example="fp16")
    channels_last: bool | None = option(None, help="NHWC memory layout (default: on for CUDA)", reaches="sidecar")
    compile: bool = option(False, help="torch.compile the model in the sidecar", reaches="sidecar")
    device_profile: str | None = None  # the JSON, not an option: InferenceOptions.device_profile names the file

    def __repr__(self) -> str:  # the profile's JSON is tens of KB: name it, do not print it
        profile = "None" if self.device_profile is None else f"<{len(self.device_profile)} chars>"
        return (f"RunOptions(batch_size={self.batch_size!r}, precision={self.precision!r}, "
                f"channels_last={self.channels_last!r}, compile={self.compile!r}, device_profile={profile})")

    def __post_init__(self) -> None:
        if self.batch_size is not None and (isinstance(self.batch_size, bool) or not isinstance(self.batch_size, int)
                                            or self.batch_size < 1):
            raise ConfigError(f"--batch-size {self.batch_size}: expected auto or a positive integer")
        check_choices(self)

    def model_key(self) -> tuple:
        """The options that change the loaded model (batch size does not)."""
        return (self.precision, self.channels_last, self.compile)


DEFAULT_RUN = RunOptions()
