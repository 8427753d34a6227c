"""torchvision's detection and segmentation weights by name: what they bring, and how their models are built."""

from __future__ import annotations

import pytest

from spark_cnn.models.loader import _dense_classes, _torchvision_model
from spark_cnn.models.tv_weights import builder_arguments, dense_preprocessing, enum_name, weights_enum


def test_detection_weights_bring_coco_names_and_leave_sizing_to_the_model():
    weights = weights_enum("fasterrcnn_mobilenet_v3_large_320_fpn", "DEFAULT")
    assert weights.meta["categories"][:2] == ["__background__", "person"] and len(weights.meta["categories"]) == 91
    assert dense_preprocessing(weights.transforms()) == {}
    assert builder_arguments("fasterrcnn_mobilenet_v3_large_320_fpn", enum_name(weights)) == {"num_classes": 91}


def test_keypoint_weights_size_the_keypoint_head():
    weights = weights_enum("keypointrcnn_resnet50_fpn", "DEFAULT")
    assert builder_arguments("keypointrcnn_resnet50_fpn", enum_name(weights)) == {"num_classes": 2,
                                                                                   "num_keypoints": 17}


def test_segmentation_weights_bring_their_resize_and_normalisation():
    weights = weights_enum("lraspp_mobilenet_v3_large", "DEFAULT")
    prep = dense_preprocessing(weights.transforms())
    assert prep["resize"] == 520 and prep["mean"] == (0.485, 0.456, 0.406)
    assert len(weights.meta["categories"]) == 21


@pytest.mark.parametrize("name, classes", [("fasterrcnn_mobilenet_v3_large_320_fpn", 4), ("retinanet_resnet50_fpn", 5),
                                           ("lraspp_mobilenet_v3_large", 3), ("fcn_resnet50", 6)])
def test_a_state_dict_says_how_many_classes_it_was_fine_tuned_to(name, classes):
    model = _torchvision_model(name, num_classes=classes)
    assert _dense_classes(name, model.state_dict()) == classes
