"""Start-up decisions for a served model: the batch size it starts from (with the tuner and the prediction check
around it), where `--decode auto` decodes, and what is done when measured batches disagree with the prediction.

The decisions are pure functions over plain values (unit-tested without a model or a process); the few functions
that fetch their inputs (the time model's prediction, the device profile, nvJPEG's check) or act on a decision
(marking a cached profile stale) stay thin beside them.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import torch

from spark_cnn.models.spec import Endpoint
from spark_cnn.sidecar.batch_decode import gpu_decode_works
from spark_cnn.sidecar.online_tuner import OnlineTuner
from spark_cnn.sidecar.prediction_check import FASTER, PredictionCheck
from spark_cnn.sidecar.service import MAX_QUEUED_BATCHES
from spark_cnn.task.run_options import RunOptions

log = logging.getLogger("spark_cnn.sidecar")

# Where the batch size starts without a cached device profile (perf/startpoint.py), by device type: small CNNs
# ran fastest near batch 8 on the 2-core CPU (docs/benchmarks.md); GPUs want large batches.
AUTO_BATCH_ROWS = {"cpu": 8, "cuda": 64}
# The online tuner explores up to these sizes: a CPU gains nothing past a few dozen images per batch, and
# 512 images of 224 px are ~300 MB of float32 input, still small beside a data-centre GPU's memory.
MAX_AUTO_BATCH_ROWS = {"cpu": 64, "cuda": 512}
# Queue bound, in batches, for images at their own sizes (detectors, segmenters): one such image is up to ~20x a
# 224 px crop (800 x 1333 x 3 = 3.2 MB), so the queue holds fewer batches than a classifier's (service.py).
SIZED_QUEUED_BATCHES = 2


@dataclass(frozen=True)
class BatchStart:
    """Where a service's batch size starts, and what corrects and checks it (both None for a fixed size)."""

    rows: int
    tuner: OnlineTuner | None = None
    check: PredictionCheck | None = None
    source: str | None = None  # whose profile predicted the start: "job", "cached", or None


def default_batch_rows(device_type: str) -> int:
    """The start without a prediction, for a device type ("cpu", "cuda", ...)."""
    return AUTO_BATCH_ROWS.get(device_type, AUTO_BATCH_ROWS["cpu"])


def max_batch_rows(device_type: str) -> int:
    """The largest batch the online tuner may try on this device type."""
    return MAX_AUTO_BATCH_ROWS.get(device_type, default_batch_rows(device_type))


def service_rows(options: RunOptions, device_type: str) -> int:
    """The batch size that keys a service: the job's `--batch-size`, else the device default (auto)."""
    return int(options.batch_size) if options.batch_size else default_batch_rows(device_type)


def queued_batches(sized: bool) -> int:
    """A service's queue bound, in batches: fewer for images at their own (larger) sizes."""
    return SIZED_QUEUED_BATCHES if sized else MAX_QUEUED_BATCHES


def time_model_applies(endpoint: Endpoint, options: RunOptions) -> bool:
    """Whether the analytical model may predict this service's batch times: tracing a compiled module would
    compile it again, and a detector's cost depends on its boxes, so fixed-size, uncompiled models only."""
    return not options.compile and not endpoint.sized


def predicted_batch_ms(images_per_s: dict[int, float]) -> dict[int, float]:
    """Predicted ms per batch by batch size, from predicted images/s (sizes without a rate left out)."""
    return {size: 1000.0 * size / rate for size, rate in images_per_s.items() if rate > 0}


def batch_start(device_type: str, predicted: tuple[int, dict[int, float], str] | None = None) -> BatchStart:
    """An auto batch size's start: the prediction's (`perf.startpoint.predicted_start`'s (size, images/s by size,
    source)) when there is one, else the device default; the tuner corrects either, and the check compares
    measured batches with the predicted ones when there are any."""
    start, images_per_s, source = predicted if predicted is not None else (default_batch_rows(device_type), None, None)
    tuner = OnlineTuner(start, max_size=max(start, max_batch_rows(device_type)), predicted=images_per_s)
    check = PredictionCheck(predicted_batch_ms(tuner.predicted)) if tuner.predicted else None
    return BatchStart(start, tuner, check, source)


def auto_start(runner, device: torch.device, threads: int | None) -> BatchStart:
    """`batch_start` for this runner's model on `device`, from the time model when a profile allows it (the job's
    `--device-profile`, else a cached one that is not stale)."""
    device_type = device.type
    predicted = None
    if time_model_applies(runner.endpoint, runner.options):
        try:
            from spark_cnn.perf.startpoint import predicted_start

            predicted = predicted_start(runner.predictor.module, (3, *runner.endpoint.preprocessing.pixel_shape[:2]),
                                        str(device), threads=threads, max_size=max_batch_rows(device_type),
                                        profile_json=runner.options.device_profile)
        except Exception as e:  # the model is an aid here, never a reason not to serve
            log.warning("no predicted batch size (%s: %s); starting from %d", type(e).__name__, e,
                        default_batch_rows(device_type))
    return batch_start(device_type, predicted)


# What a sustained disagreement leads to, by case (verdict_response).
REPORT_SLOWER = ("reported only: slower batches can be this job's own load (tasks decoding on the same cores); "
                 "calibrate on a quiet host to check (spark-cnn profile --recalibrate)")
REPORT_JOB_PROFILE = "reported only: the job's --device-profile is not this host's cache; export a fresh one"
MARKED_STALE = "marked the cached device profile stale: the next calibration measures the device again"
NOT_MARKED = "the cached profile could not be marked stale (gone, or its folder is read-only)"


def verdict_response(source: str | None, verdict: str) -> str | None:
    """What to report for a service whose batches disagreed with the profile for long enough, or None when the
    cached profile is to be marked stale: one that predicted too slow was calibrated under load. Slower batches
    can be the job's own load, and a job's own profile is not this host's to mark."""
    if verdict != FASTER:
        return REPORT_SLOWER
    if source != "cached":
        return REPORT_JOB_PROFILE
    return None


def act_on_verdict(device: str, threads: int | None, source: str | None, verdict: str) -> str:
    """Carry out `verdict_response` (the next calibration measures a stale profile again; sidecars stop starting
    from it); returns what was done, for the summary."""
    report = verdict_response(source, verdict)
    if report is not None:
        return report
    from spark_cnn.perf.startpoint import mark_profile_stale

    reason = f"a job's batches ran faster than it predicted (sidecar pid {os.getpid()})"
    if mark_profile_stale(device, threads, reason):
        log.warning("marked the cached device profile stale: the next calibration measures this device again")
        return MARKED_STALE
    return NOT_MARKED


def choose_decode(service, device: torch.device, threads: int | None):
    """Where `--decode auto` decodes for this service (perf/placement.py's choice, a DecodeChoice), from the
    device, the cores, the profile's decode cost and the model's predicted rate at its batch size."""
    from spark_cnn.perf.startpoint import choose_decode_place, start_profile

    cuda = device.type == "cuda"
    profile = start_profile(str(device), threads, service.runner.options.device_profile) if cuda else None
    predicted = service.tuner.predicted.get(service.target_rows) if service.tuner is not None else None
    return choose_decode_place(device.type, gpu_decode_works=cuda and gpu_decode_works(device),
                               cores=os.cpu_count() or 1, decode_ms=profile.decode_ms if profile else None,
                               device_images_per_s=predicted)
