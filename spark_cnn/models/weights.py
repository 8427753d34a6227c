"""What `--weights` names, torch-free: a file, `random`, or torchvision weights by name, and what they resolved to.

A torchvision weights name is a member of the model's weights enum (`DEFAULT`, `IMAGENET1K_V2`) or the enum's
full name (`ResNet50_Weights.IMAGENET1K_V2`). Resolving it to a file, its preprocessing and its class names needs
torchvision (models/tv_weights.py); the checks here are pure, so they are tested without it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlparse

from spark_cnn.errors import ConfigError

RANDOM = "random"  # asks for the model's random initialisation, without the warning
TIMM_PRETRAINED = "DEFAULT"  # a timm model's pretrained weights (for its name and tag), as torchvision's DEFAULT
# The weights label when the model brings its own (a factory's, a TorchScript file's) and none are given.
BUILTIN = "builtin"
# An enum member (upper case, as torchvision names them), optionally after its enum class (`*_Weights.`).
_NAME = re.compile(r"^(?:(?P<enum>[A-Za-z0-9_]+_Weights)\.)?(?P<member>[A-Z][A-Z0-9_]*)$")
FILE, NAME = "file", "name"


def weights_kind(weights: str | None) -> str | None:
    """None (no weights given), RANDOM, FILE (an existing file) or NAME (a weights name, syntactically)."""
    if weights is None or weights == RANDOM:
        return weights
    if os.path.isfile(weights):
        return FILE
    return NAME if _NAME.match(weights) else None


def parse_weights_name(text: str) -> tuple[str | None, str]:
    """(enum class name or None, member): `ResNet50_Weights.IMAGENET1K_V2` -> ("ResNet50_Weights", "IMAGENET1K_V2")."""
    found = _NAME.match(text)
    if not found:
        raise ConfigError(f"--weights {text}: not a weights name (e.g. DEFAULT, IMAGENET1K_V2, "
                          "ResNet50_Weights.IMAGENET1K_V2) nor an existing file")
    return found["enum"], found["member"]


def pick_member(model: str, text: str, enum_name: str, members: Sequence[str]) -> str:
    """The member of `model`'s weights enum (`enum_name`, with `members`) that `text` names; a ConfigError
    listing the valid names for an unknown member or another model's enum."""
    given_enum, member = parse_weights_name(text)
    valid = ", ".join(members)
    if given_enum is not None and given_enum != enum_name:
        raise ConfigError(f"--weights {text}: {given_enum} is another model's weights; --model {model} takes "
                          f"{enum_name}: {valid}")
    if member not in members:
        raise ConfigError(f"--weights {text}: --model {model} has no such weights; valid: {valid} (or a state_dict "
                          "file, or random)")
    return member


def cached_path(hub_dir: str, url: str) -> str:
    """Where torchvision's loader caches the file of `url`: `<hub dir>/checkpoints/<file name of the URL>`."""
    return os.path.join(hub_dir, "checkpoints", os.path.basename(urlparse(url).path))


@dataclass(frozen=True)
class ResolvedWeights:
    """What `--weights` resolved to: the file to load and ship (None: none), torchvision's enum (full name) when
    the weights are torchvision's own, the label the summary records (enum name, `sha256:<hash>`, random or
    builtin), and what the weights bring: preprocessing fields and class names (None: nothing)."""

    file: str | None
    label: str
    enum: str | None = None
    preprocessing: dict | None = None
    categories: tuple[str, ...] | None = None
