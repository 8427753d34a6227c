"""Detectors and segmenters: what task a module performs, the size rule it wants, and its outputs per image.

Images reach these models at their own sizes (imaging/sizing.py). A device batch is run in groups of equal
size, so each image's outputs never depend on which other images shared its batch: a detector's transform pads
a list of images to the largest, and a segmenter's convolutions would see that padding at the borders. Photos
of one camera resize to one or two sizes (landscape, portrait), so groups are large where it matters.

Outputs are per-row lists of tensors (a ragged row each): detect gives `labels` (k,), `scores` (k,), `boxes`
(k, 4) in the source image's pixels, best first; segment gives `mask` (h, w) of class indices at the size the
image was sent at (the task scales it to the source size). Imports torch: driver child and sidecar only.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from torch import nn

from spark_cnn.errors import ModelError
from spark_cnn.imaging.sizing import SizeRule

# torchvision's detection defaults (GeneralizedRCNNTransform of Faster R-CNN): a detector without that
# transform (a module:factory or TorchScript one) gets its images sized so.
DEFAULT_DETECT_SIZING = SizeRule(min_size=800, max_size=1333)
# torchvision's segmentation weights resize the shorter side to 520 (their SemanticSegmentation preset).
DEFAULT_SEGMENT_SHORT_SIDE = 520
# Commands that serve each task, for the message that points a model at the right one.
COMMANDS = {"classify": "spark-cnn classify", "detect": "spark-cnn detect", "segment": "spark-cnn segment"}


def _torchvision_kinds() -> dict[type, str]:
    from torchvision.models import detection, segmentation

    return {detection.generalized_rcnn.GeneralizedRCNN: "detect", detection.RetinaNet: "detect",
            detection.FCOS: "detect", detection.ssd.SSD: "detect", segmentation.DeepLabV3: "segment",
            segmentation.FCN: "segment", segmentation.LRASPP: "segment"}


def declared_task(module: nn.Module) -> str | None:
    """'detect' or 'segment' for torchvision's detection and segmentation models, else None (unknown)."""
    return next((task for cls, task in _torchvision_kinds().items() if isinstance(module, cls)), None)


def output_task(output) -> str | None:
    """The task an output looks like: a list of dicts with boxes (detect), a dict with `out` or a 4-D tensor
    (segment), a 2-D tensor (classify)."""
    if isinstance(output, (list, tuple)) and output and all(isinstance(o, dict) and "boxes" in o for o in output):
        return "detect"
    if isinstance(output, dict) and isinstance(output.get("out"), torch.Tensor):
        return "segment"
    if isinstance(output, torch.Tensor):
        return {2: "classify", 4: "segment"}.get(output.dim())
    return None


def wrong_command(source: str, found: str, wanted: str, aside: str = "") -> str:
    """The one line for a model given to the command of another task (`aside`: a parenthesis before the advice)."""
    nouns = {"classify": "a classifier", "detect": "a detector", "segment": "a segmenter"}
    aside = f" ({aside})" if aside else ""
    return f"--model {source} is {nouns[found]}, not {nouns[wanted]}{aside}; run it with {COMMANDS[found]}"


def detect_sizing(module: nn.Module) -> SizeRule:
    """The size rule of a detector's own transform (torchvision's GeneralizedRCNNTransform), else the default."""
    transform = getattr(module, "transform", None)
    fixed = getattr(transform, "fixed_size", None)
    if fixed is not None:  # torchvision's (width, height)
        return SizeRule(fixed=(int(fixed[1]), int(fixed[0])))
    min_size, max_size = getattr(transform, "min_size", None), getattr(transform, "max_size", None)
    if min_size is not None and max_size is not None:
        # Several min sizes are a training augmentation; evaluation uses the last.
        return SizeRule(min_size=int(min_size[-1] if isinstance(min_size, (tuple, list)) else min_size),
                        max_size=int(max_size))
    return DEFAULT_DETECT_SIZING


def detection_classes(module: nn.Module) -> int | None:
    """How many classes a torchvision detector scores (background included where it has one); None if unknown."""
    for path in ("roi_heads.box_predictor.cls_score.out_features", "head.classification_head.num_classes",
                 "head.classification_head.num_columns"):
        value = module
        for name in path.split("."):
            value = getattr(value, name, None)
        if isinstance(value, int):
            return value
    return None


def _by_size(images: list[torch.Tensor]) -> dict[tuple, list[int]]:
    groups: dict[tuple, list[int]] = defaultdict(list)
    for i, image in enumerate(images):
        groups[tuple(image.shape[-2:])].append(i)
    return groups


class DetectionPredictor:
    """Runs a detector on (3, h, w) float images in [0, 1] (it normalises and pads them itself); keeps boxes
    scoring >= `min_score`, at most `max_detections` per image, and maps them to the source images' pixels."""

    def __init__(self, module: nn.Module, *, min_score: float = 0.0, max_detections: int | None = None):
        self.module = module
        self.min_score = min_score
        self.max_detections = max_detections

    def predict_sized(self, images: list[torch.Tensor], sources: list[tuple[int, int]]) -> dict[str, list]:
        rows: list = [None] * len(images)
        for indices in _by_size(images).values():
            found = self.module([images[i] for i in indices])
            if isinstance(found, tuple) and len(found) == 2 and isinstance(found[1], list):
                found = found[1]  # TorchScript detectors return (losses, detections)
            if output_task(found) != "detect" or len(found) != len(indices):
                raise ModelError(f"the detector returned {type(found).__name__}; expected one dict of boxes, "
                                 f"scores and labels per image")
            for i, out in zip(indices, found, strict=True):
                rows[i] = self._kept(out, tuple(images[i].shape[-2:]), sources[i])
        return {key: [row[key] for row in rows] for key in ("labels", "scores", "boxes")}

    def _kept(self, out: dict, sent: tuple[int, int], source: tuple[int, int]) -> dict[str, torch.Tensor]:
        scores = out["scores"].float()
        order = torch.argsort(scores, descending=True, stable=True)
        order = order[scores[order] >= self.min_score]
        if self.max_detections is not None:
            order = order[:self.max_detections]
        sy, sx = source[0] / sent[0], source[1] / sent[1]
        scale = torch.tensor([sx, sy, sx, sy], dtype=torch.float32, device=scores.device)
        return {"labels": out["labels"][order].to(torch.int32), "scores": scores[order],
                "boxes": out["boxes"][order].float() * scale}


class SegmentationPredictor:
    """Runs a segmenter on normalised (3, h, w) images, in groups of one size; the class of each pixel at the
    size the image was sent at (logits are upsampled to it first when the model returns them smaller)."""

    def __init__(self, module: nn.Module):
        self.module = module

    def predict_sized(self, images: list[torch.Tensor], sources: list[tuple[int, int]]) -> dict[str, list]:
        masks: list = [None] * len(images)
        for size, indices in _by_size(images).items():
            logits = segment_logits(self.module(torch.stack([images[i] for i in indices])), size)
            classes = logits.argmax(1)
            classes = classes.to(torch.uint8 if logits.shape[1] <= 256 else torch.int32)
            for j, i in enumerate(indices):
                masks[i] = classes[j]
        return {"mask": masks}


def segment_logits(output, size: tuple[int, int]) -> torch.Tensor:
    """A segmenter's (N, classes, h, w) logits at `size`, from a tensor or torchvision's {"out": ...}."""
    logits = output.get("out") if isinstance(output, dict) else output
    if not isinstance(logits, torch.Tensor) or logits.dim() != 4:
        raise ModelError(f"the segmenter returned {type(output).__name__}; expected (N, classes, H, W) logits or "
                         "a dict with 'out'")
    if tuple(logits.shape[-2:]) != tuple(size):
        logits = nn.functional.interpolate(logits.float(), size=size, mode="bilinear", align_corners=False)
    return logits
