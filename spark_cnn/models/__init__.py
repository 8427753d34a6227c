"""Model specs (torch-free) and, in submodules that import torch, loading and output heads."""

from spark_cnn.models.spec import Endpoint, ModelSpec

__all__ = ["Endpoint", "ModelSpec"]
