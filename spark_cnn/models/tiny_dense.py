"""Tiny detector and segmenter with random weights, for checks that need a model of each kind in a second (the
option tests, a quick try of `spark-cnn detect` / `segment`): `--model spark_cnn.models.tiny_dense:tiny_detector`.

The detector is torchvision's Faster R-CNN (its transform, RPN, RoI heads and postprocessing) on a one-layer
backbone; the segmenter is two convolutions returning (N, classes, H, W) logits at a quarter of the input size,
as a module:factory segmenter may (the sidecar upsamples them).
"""

from __future__ import annotations

from torch import nn

TINY_DETECTOR = "spark_cnn.models.tiny_dense:tiny_detector"
TINY_SEGMENTER = "spark_cnn.models.tiny_dense:tiny_segmenter"
TINY_CLASSES = 3  # background and two classes
# The detector's own resize rule: small images keep the forward cheap on a CPU.
TINY_MIN_SIZE, TINY_MAX_SIZE = 128, 192
TINY_PROPOSALS = 200  # region proposals per image: the RoI heads' cost on a CPU


def tiny_detector(num_classes: int = TINY_CLASSES) -> nn.Module:
    """Faster R-CNN on an 8-channel, stride-4 backbone; keeps every box (score threshold 0), at most 20."""
    from torchvision.models.detection import FasterRCNN
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.ops import MultiScaleRoIAlign

    backbone = nn.Sequential(nn.Conv2d(3, 8, 3, stride=4, padding=1), nn.ReLU())
    backbone.out_channels = 8
    anchors = AnchorGenerator(sizes=((16, 32),), aspect_ratios=((0.5, 1.0, 2.0),))
    pool = MultiScaleRoIAlign(featmap_names=["0"], output_size=7, sampling_ratio=2)
    model = FasterRCNN(backbone, num_classes=num_classes, rpn_anchor_generator=anchors, box_roi_pool=pool,
                       min_size=TINY_MIN_SIZE, max_size=TINY_MAX_SIZE, box_score_thresh=0.0,
                       box_detections_per_img=20, rpn_post_nms_top_n_test=TINY_PROPOSALS)
    # One stride-4 convolution takes any size: no padding, so an image's boxes never depend on zeros around it.
    model.transform.size_divisible = 1
    return model.eval()


class TinySegmenter(nn.Module):
    """Two convolutions, stride 4: logits of `num_classes` at a quarter of the input's size."""

    spark_cnn_preprocessing = {"resize": 48, "crop": 48}

    def __init__(self, num_classes: int = TINY_CLASSES):
        super().__init__()
        self.layers = nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                                    nn.Conv2d(8, num_classes, 3, stride=2, padding=1))

    def forward(self, images):
        return self.layers(images)


def tiny_segmenter(num_classes: int = TINY_CLASSES) -> nn.Module:
    return TinySegmenter(num_classes).eval()
