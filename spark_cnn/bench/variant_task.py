"""What a variant process is given and what the variants share: the task (`VariantTask`), the measured run's
edges (`MeasuredWindow`) and the user's side of the baselines, the model and transform someone writes without
this project (`load_model`, `user_transform`). variants.py and peers.py both build on it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from spark_cnn.bench.cputime import snapshot_to_json, tree_snapshot

BATCH_SIZE = 32  # bare and predict_batch_udf run at one fixed size, a common choice for CNN inference
# Batch sizes the model-only measurement tries at one thread; the limit takes the fastest.
LIMIT_BATCH_SIZES = (8, 16, 32)
# Side-by-side windows the limit measures, taking the median (variants.run_limit).
LIMIT_WINDOWS = 3


@dataclass(frozen=True)
class VariantTask:
    variant: str
    model: str             # a torchvision name, or a TorchScript file (the near-free model)
    weights: str | None
    input: str             # folder of the measured images
    warmup_input: str      # small folder run first (start-up), not measured
    images: int
    measure_s: float = 4.0  # limit only: seconds per measurement
    limit_batch_sizes: tuple[int, ...] = LIMIT_BATCH_SIZES
    limit_windows: int = LIMIT_WINDOWS  # limit only: side-by-side windows, median taken
    measure_model: bool = True  # limit only: False for a near-free model, whose limit is decoding alone
    task: str = "classify"  # or "detect": a torchvision detection builder
    output: str | None = None  # keep the measured run's rows here (Parquet folder); None: a temporary folder
    batch_size: int | None = None  # spark_cnn variants: the sidecar's batch size; None: auto (tuned)
    decode: str | None = None  # spark_cnn variants without a place of their own: where to decode; None: auto
    # spark_cnn variants: a shorter job (folder, images) in the same session, so that the cost per image at
    # steady state and the cost per job can be told apart (device_budget.steady_state); None: not run. It runs
    # after the warm-up and before the measured job, or after the measured job with `short_after` (a real model:
    # the measured job then runs as the other variants' do, after the warm-up alone)
    short_input: str | None = None
    short_images: int = 0
    short_after: bool = False


class MeasuredWindow:
    """Marks the measured run: a snapshot of the bench's process tree (the bench runs this process) on entry and
    on exit, exact edges for the CPU-per-image window (bench/cputime.py)."""

    def __enter__(self) -> MeasuredWindow:
        self.marks = [snapshot_to_json(tree_snapshot(os.getppid()))]
        return self

    def __exit__(self, *exc) -> None:
        self.marks.append(snapshot_to_json(tree_snapshot(os.getppid())))

    def result(self) -> dict:
        return {"measured_window": [mark["at"] for mark in self.marks], "window_snapshots": self.marks}


# --- the user's side: what someone writes without this project -------------------------------------------

_MODELS: dict = {}  # per Python worker: (name, weights) -> module; Spark reuses workers across tasks


def load_model(name: str, weights: str | None):
    """A torchvision model with a state_dict file, or a TorchScript file (`weights` None), as a user loads them."""
    key = (name, weights)
    if key not in _MODELS:
        import torch

        if weights is None:
            model = torch.jit.load(name, map_location="cpu")
        else:
            model = random_torchvision(name)
            model.load_state_dict(torch.load(weights, weights_only=True))
        _MODELS[key] = model.eval()
    return _MODELS[key]


def bench_task(name: str) -> str:
    """What a bench model does: detect or segment (torchvision's detection and segmentation builders), else
    classify."""
    import torchvision

    for task, module in (("detect", torchvision.models.detection), ("segment", torchvision.models.segmentation)):
        if name in torchvision.models.list_models(module=module):
            return task
    return "classify"


def random_torchvision(name: str):
    """A torchvision model with random weights; a detector's or segmenter's backbone stays random too (never
    the ImageNet download: the bench's saved weights replace it anyway)."""
    import torchvision

    dense = {} if bench_task(name) == "classify" else {"weights_backbone": None}
    return torchvision.models.get_model(name, weights=None, **dense)


def user_transform():
    """torchvision's classic ImageNet evaluation transform, on PIL images."""
    from torchvision import transforms

    from spark_cnn.imaging.preprocess import DEFAULT_CROP, DEFAULT_RESIZE, IMAGENET_MEAN, IMAGENET_STD

    return transforms.Compose([transforms.Resize(DEFAULT_RESIZE), transforms.CenterCrop(DEFAULT_CROP),
                               transforms.ToTensor(), transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)])
