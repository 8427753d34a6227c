"""The device side of the sidecar: hold a model on its device and run uint8 batches through it in stages.

`upload` (host -> device), `forward` (normalise, model, heads) and `download` (device -> host) are separate so
the sidecar can overlap them across consecutive batches: on CUDA the upload runs on its own stream from pinned
memory and the download is non-blocking, so the copy of batch n+1 and the results of batch n-1 move while
batch n computes. On the CPU the stages are plain calls; the overlap there comes from the service's threads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from spark_cnn.errors import ConfigError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.dense_heads import DetectionPredictor, SegmentationPredictor
from spark_cnn.models.heads import Predictor
from spark_cnn.models.loader import build_module
from spark_cnn.models.simulated import takes_raw_pixels
from spark_cnn.models.spec import Endpoint
from spark_cnn.models.tensors import flush_denormals, normalise
from spark_cnn.models.tracing import FX_GATE
from spark_cnn.models.vector_math_guard import guard_vector_math
from spark_cnn.task.protocol import ErrorKind, SizedImages
from spark_cnn.task.run_options import RunOptions
from spark_cnn.task.schema import RAW, layout_of, task_reply_schema
from spark_cnn.task.sidecar_env import cpu_threads

log = logging.getLogger("spark_cnn.sidecar")

REDUCED_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# `auto` precision runs a job's first images in fp32 and in bf16 and keeps bf16 only if top-1 agrees on at
# least 99% of them: 256 images make 99% mean at most two disagreements.
PRECISION_PROBE_IMAGES = 256
MIN_TOP1_AGREEMENT = 0.99
LABEL_OUTPUTS = ("label", "topk_label")  # the Predictor's outputs that hold class indices
# Detectors take images in [0, 1] and normalise them themselves.
# Requests' pixels are views of the received Arrow buffers, read-only; the sidecar only reads them (normalising
# makes new tensors), so torch's warning about wrapping a read-only array would only alarm whoever reads the log.
warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)
UNIT_SCALE = Preprocessing(mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0))


def resolve_device(requested: str) -> torch.device:
    """'auto' -> cuda:0 when CUDA is usable, else cpu; 'cuda' -> cuda:0; 'cuda:N' and 'cpu' as given."""
    if requested == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    device = torch.device("cuda:0" if requested == "cuda" else requested)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"--device {requested}: CUDA is not available on this host; use --device cpu or auto")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ConfigError(f"--device {requested}: this host has {torch.cuda.device_count()} CUDA device(s)")
    return device


# Compute threads of a CPU sidecar, each with cpu_threads() torch threads (half the cores by default).
CPU_COMPUTE_WORKERS = 2


def cpu_compute_workers(device: torch.device, threads: int | None) -> int:
    """Batches a sidecar computes side by side: on a CPU, enough workers of `cpu_threads(threads)` torch threads
    to cover the cores (at most CPU_COMPUTE_WORKERS); one on a GPU (its streams overlap copies and compute).

    Measured on the 2-core host (mobilenet_v3_small, spark-cnn bench-sidecar --clients 4): see docs/benchmarks.md.
    """
    if device.type != "cpu":
        return 1
    cores = os.cpu_count() or 1
    return max(1, min(CPU_COMPUTE_WORKERS, cores // cpu_threads(threads)))


def is_out_of_memory(error: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError for the same condition."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


# CUDA errors after which the context is unusable until the process exits (illegal address, launch failure,
# device-side assert, ECC): every later call fails too, so the sidecar must be replaced, not reused.
STICKY_ERROR_MARKS = ("CUDA error", "CUDA_ERROR", "device-side assert", "illegal memory access",
                      "unspecified launch failure", "CUBLAS_STATUS_EXECUTION_FAILED", "CUDNN_STATUS_EXECUTION_FAILED")


def failure_kind(error: BaseException) -> ErrorKind:
    """Who a failed batch blames: out of memory is the device's (it still works); a CUDA error is sticky (it
    does not); anything else the model raised is the model's."""
    if is_out_of_memory(error):
        return ErrorKind.DEVICE
    accelerator_error = getattr(torch, "AcceleratorError", ())
    if (accelerator_error and isinstance(error, accelerator_error)) or any(
            mark in str(error) for mark in STICKY_ERROR_MARKS):
        return ErrorKind.STICKY
    return ErrorKind.MODEL


class PrecisionProbe:
    """Decides `auto` precision from measured top-1 agreement. Pure bookkeeping; the runner feeds it."""

    def __init__(self, reduced: str = "bf16", images: int = PRECISION_PROBE_IMAGES,
                 min_agreement: float = MIN_TOP1_AGREEMENT):
        self.reduced = reduced
        self.images = images
        self.min_agreement = min_agreement
        self.seen = 0
        self.agreed = 0
        self.choice: str | None = None  # None while probing

    def record(self, agreed: int, total: int) -> None:
        self.seen += total
        self.agreed += agreed
        if self.choice is None and self.seen >= self.images:
            self.choice = self.reduced if self.agreed / self.seen >= self.min_agreement else "fp32"

    def describe(self) -> str:
        if self.choice is None:
            return f"fp32 (probing {self.seen}/{self.images} images)"
        return f"{self.choice} (auto: top-1 agreement {self.agreed / self.seen:.3f} on {self.seen} images)"


@dataclass
class Staged:
    """A batch on its way: device tensor of uint8 pixels, and the event its upload completes with (CUDA)."""

    pixels: torch.Tensor
    ready: torch.cuda.Event | None = None


@dataclass
class Pending:
    """Outputs on their way back to the host; `done` fires when the non-blocking copies have landed (CUDA)."""

    outputs: dict[str, torch.Tensor]
    done: torch.cuda.Event | None = None


class ModelRunner:
    """One loaded model on one device, with its run options."""

    def __init__(self, endpoint: Endpoint, device: torch.device, options: RunOptions | None = None):
        options = options or RunOptions()
        self.endpoint = endpoint
        self.device = device
        self.options = options
        self.cuda = device.type == "cuda"
        self.channels_last = self.cuda if options.channels_last is None else options.channels_last
        module = build_module(endpoint.source, endpoint.weights, endpoint.weights_enum,
                              kind=endpoint.kind or None).to(device)
        if self.channels_last:
            module = module.to(memory_format=torch.channels_last)
        if not self.cuda:
            guard_vector_math(module)  # silu & co. at full speed on the CPU (models/vector_math_guard.py)
        # A simulated device normalises "on the device": pixels reach it as uint8, and the host pays nothing
        # per image for a conversion a GPU sidecar would not make on its CPU (models/simulated.py).
        self.normalises = not takes_raw_pixels(module)
        if options.compile:
            module = torch.compile(module)
        if endpoint.task == "detect":
            self.predictor = DetectionPredictor(module, min_score=endpoint.min_score,
                                                max_detections=endpoint.max_detections)
        elif endpoint.task == "segment":
            self.predictor = SegmentationPredictor(module)
        else:
            self.predictor = Predictor(module, top_k=endpoint.top_k, logits=endpoint.logits,
                                       embeddings=endpoint.embeddings, embedding_layer=endpoint.embedding_layer,
                                       raw=endpoint.output_kind == RAW)
        self.reply_schema = task_reply_schema(endpoint.task, **layout_of(endpoint))  # per request row
        # `auto` precision is judged by top-1 agreement: classes only (the rest run fp32 unless one is asked for).
        probing = options.precision == "auto" and self.cuda and not endpoint.sized and endpoint.output_kind != RAW
        self.probe = PrecisionProbe() if probing else None
        self._copy_stream = torch.cuda.Stream(device) if self.cuda else None
        # The embedding hook keeps per-call state: one forward at a time then. Otherwise forwards may run side
        # by side (the CPU sidecar's compute threads); the precision probe runs only on CUDA, with one thread.
        self._lock = threading.Lock() if endpoint.embeddings else contextlib.nullcontext()

    @property
    def precision(self) -> str:
        if self.probe is not None:
            return self.probe.describe()
        return "fp32" if self.options.precision == "auto" else self.options.precision

    def upload(self, pixels: np.ndarray | torch.Tensor | SizedImages) -> Staged:
        """Host uint8 (N, H, W, 3), or SizedImages -> device. On CUDA: pinned memory, a side stream, non-blocking."""
        if isinstance(pixels, SizedImages):
            return self._upload_sized(pixels)
        if isinstance(pixels, torch.Tensor) and pixels.device == self.device:
            return Staged(pixels)  # decoded on the device already (nvJPEG)
        host = torch.from_numpy(np.ascontiguousarray(pixels)) if isinstance(pixels, np.ndarray) else pixels
        if not self.cuda:
            return Staged(host)
        host = host.pin_memory()
        with torch.cuda.stream(self._copy_stream):
            on_device = host.to(self.device, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        return Staged(on_device, ready)

    def _upload_sized(self, images: SizedImages) -> Staged:
        hosts = [torch.from_numpy(np.ascontiguousarray(image)) for image in images.images]
        if not self.cuda:
            return Staged(SizedImages(hosts, images.sources))
        with torch.cuda.stream(self._copy_stream):
            on_device = [host.pin_memory().to(self.device, non_blocking=True) for host in hosts]
            ready = torch.cuda.Event()
            ready.record(self._copy_stream)
        return Staged(SizedImages(on_device, images.sources), ready)

    def forward(self, staged: Staged) -> Pending:
        """Normalise, run the model and its heads; start copying the outputs back without waiting."""
        if not self.cuda:
            flush_denormals()  # this thread's flag, set where the forward runs; cheap
        if isinstance(staged.pixels, SizedImages):
            return self._forward_sized(staged)
        with FX_GATE.forward(), self._lock, torch.inference_mode():  # never while another model is fx-traced
            pixels = staged.pixels
            if staged.ready is not None:
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(staged.ready)
                pixels.record_stream(stream)  # the caching allocator must not reuse it before compute is done
            images = (normalise(pixels, self.endpoint.preprocessing) if self.normalises
                      else pixels.permute(0, 3, 1, 2))
            if self.channels_last:
                images = images.contiguous(memory_format=torch.channels_last)
            # Labels leave as int32, the reply's type (task/schema.py): half the bytes of torch's int64 to copy.
            result = {name: values.to(torch.int32) if name in LABEL_OUTPUTS else values
                      for name, values in self._predict(images).items()}
            if not self.cuda:
                return Pending(result)
            host = {k: v.to("cpu", non_blocking=True) for k, v in result.items()}
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            return Pending(host, done)

    def _forward_sized(self, staged: Staged) -> Pending:
        """Detectors and segmenters: each image normalised at its own size, outputs one ragged row each."""
        with FX_GATE.forward(), torch.inference_mode():
            sized = staged.pixels
            if staged.ready is not None:
                stream = torch.cuda.current_stream(self.device)
                stream.wait_event(staged.ready)
                for image in sized.images:
                    image.record_stream(stream)
            # Detectors normalise inside (their transform): they take [0, 1] images.
            prep = UNIT_SCALE if self.endpoint.task == "detect" else self.endpoint.preprocessing
            images = [normalise(image[None], prep)[0] for image in sized.images]
            dtype = self._reduced_dtype()
            with torch.autocast(self.device.type, dtype=dtype) if dtype else contextlib.nullcontext():
                result = self.predictor.predict_sized(images, sized.sources)
            if not self.cuda:
                return Pending(result)
            host = {k: [v.to("cpu", non_blocking=True) for v in values] for k, values in result.items()}
            done = torch.cuda.Event()
            done.record(torch.cuda.current_stream(self.device))
            return Pending(host, done)

    def _predict(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        dtype = self._reduced_dtype()
        if dtype is None:
            out = self.predictor.predict(images)
        else:
            with torch.autocast(self.device.type, dtype=dtype):
                out = self.predictor.predict(images)
        if self.probe is not None and self.probe.choice is None:
            with torch.autocast(self.device.type, dtype=REDUCED_DTYPES[self.probe.reduced]):
                reduced = self.predictor.predict(images)["label"]
            self.probe.record(int((reduced == out["label"]).sum()), len(images))
            if self.probe.choice is not None:
                log.info("precision for %s: %s", self.endpoint.source, self.probe.describe())
        return out

    def _reduced_dtype(self) -> torch.dtype | None:
        if self.probe is not None:
            return REDUCED_DTYPES.get(self.probe.choice or "fp32")
        return REDUCED_DTYPES.get(self.options.precision)

    @staticmethod
    def download(pending: Pending) -> dict[str, np.ndarray]:
        if pending.done is not None:
            pending.done.synchronize()
        return {k: _host_rows(v) if isinstance(v, list) else _host_array(v) for k, v in pending.outputs.items()}

    def run(self, pixels: np.ndarray) -> dict[str, np.ndarray]:
        """All three stages for one batch, in the calling thread (tests, the device-only benchmark)."""
        return self.download(self.forward(self.upload(pixels)))


def _host_array(values: torch.Tensor) -> np.ndarray:
    return values.float().numpy() if values.dtype in (torch.bfloat16, torch.float16) else values.numpy()


def _host_rows(rows: list[torch.Tensor]) -> np.ndarray:
    """Ragged per-row outputs (detections, masks) as a 1-D object array: sliced and joined like any output."""
    held = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):
        held[i] = _host_array(row)
    return held
