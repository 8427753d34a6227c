"""timm models for tests, offline: random weights (batch-norm statistics measured on noise) saved as a state_dict
file, or seeded into a private Hugging Face cache where timm's own pretrained loader finds them with
HF_HUB_OFFLINE=1."""

from __future__ import annotations

import os

import timm
import torch
from safetensors.torch import save_file

from tests.torch_home import _calibrate_batch_norm

# Small and quick on a CPU (5.4 M parameters), with a data config unlike the torchvision default:
# input 176, crop_pct 0.875 (resize 201), bicubic.
TIMM_MODEL = "resnet10t"


def random_timm_module(name: str = TIMM_MODEL, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    module = timm.create_model(name, pretrained=False)
    _calibrate_batch_norm(module, timm.data.resolve_model_data_config(module)["input_size"][1])
    return module


def save_timm_weights(path: str, name: str = TIMM_MODEL, seed: int = 0) -> str:
    torch.save(random_timm_module(name, seed).state_dict(), path)
    return path


def seed_hf_cache(hf_home: str, name: str = TIMM_MODEL, seed: int = 0) -> str:
    """Random weights of `name`'s default pretrained tag where huggingface_hub caches `model.safetensors` of its
    hf_hub_id (`<HF_HOME>/hub/models--timm--<name>.<tag>/snapshots/<revision>/`); returns the hub id."""
    module = random_timm_module(name, seed)
    hub_id = module.pretrained_cfg["hf_hub_id"]
    repo = os.path.join(hf_home, "hub", "models--" + hub_id.replace("/", "--"))
    revision = "0" * 40
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    os.makedirs(os.path.join(repo, "snapshots", revision), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(revision)
    save_file({k: v.contiguous() for k, v in module.state_dict().items()},
              os.path.join(repo, "snapshots", revision, "model.safetensors"))
    return hub_id
