"""What `--weights` names, decided without torch: files, random, torchvision weight names and their checks."""

from __future__ import annotations

import pytest

from spark_cnn.errors import ConfigError
from spark_cnn.models.spec import ModelSpec
from spark_cnn.models.weights import FILE, NAME, RANDOM, cached_path, parse_weights_name, pick_member, weights_kind

RESNET50 = ("ResNet50_Weights", ["IMAGENET1K_V1", "IMAGENET1K_V2", "DEFAULT"])


@pytest.mark.parametrize("text, parsed", [
    ("DEFAULT", (None, "DEFAULT")), ("IMAGENET1K_V2", (None, "IMAGENET1K_V2")),
    ("ResNet50_Weights.IMAGENET1K_V2", ("ResNet50_Weights", "IMAGENET1K_V2")),
    ("MobileNet_V3_Small_Weights.DEFAULT", ("MobileNet_V3_Small_Weights", "DEFAULT")),
])
def test_weights_names_parse(text, parsed):
    assert parse_weights_name(text) == parsed
    assert weights_kind(text) == NAME


@pytest.mark.parametrize("text", ["weights.pth", "default", "ResNet50.IMAGENET1K_V2", "dir/DEFAULT", ""])
def test_what_is_neither_a_name_nor_a_file(text):
    assert weights_kind(text) is None
    with pytest.raises(ConfigError, match="not a weights name"):
        parse_weights_name(text)


def test_files_and_random(tmp_path):
    path = tmp_path / "DEFAULT"  # a file wins over a name that looks the same
    path.write_bytes(b"x")
    assert weights_kind(str(path)) == FILE
    assert weights_kind(RANDOM) == RANDOM and weights_kind(None) is None


@pytest.mark.parametrize("text, member", [("DEFAULT", "DEFAULT"), ("IMAGENET1K_V1", "IMAGENET1K_V1"),
                                          ("ResNet50_Weights.IMAGENET1K_V2", "IMAGENET1K_V2")])
def test_pick_member(text, member):
    assert pick_member("resnet50", text, *RESNET50) == member


def test_an_unknown_member_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="no such weights; valid: IMAGENET1K_V1, IMAGENET1K_V2, DEFAULT"):
        pick_member("resnet50", "IMAGENET1K_V9", *RESNET50)


def test_another_models_enum_is_refused():
    with pytest.raises(ConfigError, match="ResNet18_Weights is another model's weights; --model resnet50 takes "
                                          "ResNet50_Weights: IMAGENET1K_V1"):
        pick_member("resnet50", "ResNet18_Weights.IMAGENET1K_V1", *RESNET50)


def test_cached_path_is_torch_hubs():
    assert cached_path("/th/hub", "https://download.pytorch.org/models/resnet50-11ad3fa6.pth") == \
        "/th/hub/checkpoints/resnet50-11ad3fa6.pth"


def test_model_spec_takes_names_for_torchvision_and_timm_models_only():
    assert ModelSpec("resnet50", weights="DEFAULT").weights == "DEFAULT"
    assert ModelSpec("resnet50", weights=RANDOM).weights == RANDOM
    with pytest.raises(ConfigError, match="weights by name .* are for torchvision and timm models"):
        ModelSpec("pkg.mod:factory", weights="DEFAULT")
    assert ModelSpec("timm:resnet18", weights="DEFAULT").kind == "timm"
    with pytest.raises(ConfigError, match="--weights nope.pth: no such file"):
        ModelSpec("resnet50", weights="nope.pth")
