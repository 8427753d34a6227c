"""Folding BatchNorms into the convolutions before them: same outputs, same module names, only safe pairs."""

from __future__ import annotations

import pytest
import torch
import torchvision
from torch import nn

from spark_cnn.models.batchnorm_folding import fold_batchnorms


def _with_statistics(module: nn.Module, seed: int = 0) -> nn.Module:
    """`module` in eval mode with BatchNorm statistics and affine parameters far from the identity a fresh
    model has, so a wrong fold shows in the outputs."""
    generator = torch.Generator().manual_seed(seed)
    for child in module.modules():
        if isinstance(child, nn.modules.batchnorm._BatchNorm):
            n = child.num_features
            child.running_mean.copy_(torch.rand(n, generator=generator) - 0.5)
            child.running_var.copy_(torch.rand(n, generator=generator) * 1.5 + 0.5)
            if child.affine:
                child.weight.data.copy_(torch.rand(n, generator=generator) + 0.5)
                child.bias.data.copy_(torch.rand(n, generator=generator) - 0.5)
    return module.eval()


def _batchnorms(module: nn.Module) -> int:
    return sum(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in module.modules())


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small"])
def test_a_torchvision_model_folds_every_batchnorm_keeps_its_names_and_its_outputs(name):
    torch.manual_seed(0)
    model = _with_statistics(torchvision.models.get_model(name, weights=None))
    names = [n for n, _ in model.named_modules()]
    images = torch.randn(2, 3, 96, 96)
    with torch.inference_mode():
        before = model(images)
    batchnorms = _batchnorms(model)

    assert fold_batchnorms(model) == batchnorms > 0

    assert _batchnorms(model) == 0
    assert [n for n, _ in model.named_modules()] == names  # the BatchNorms are Identities under their names
    with torch.inference_mode():
        torch.testing.assert_close(model(images), before, rtol=1e-4, atol=1e-4)


class _PreActivation(nn.Module):
    """A BatchNorm before its convolution, and a convolution whose output also feeds a residual sum."""

    def __init__(self):
        super().__init__()
        self.norm = nn.BatchNorm2d(3)
        self.conv = nn.Conv2d(3, 3, 3, padding=1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        y = self.conv(self.norm(x))
        return self.bn(y) + y


class _SharedConvolution(nn.Module):
    """One convolution called twice, once before a BatchNorm and once not."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 1)
        self.bn = nn.BatchNorm2d(3)

    def forward(self, x):
        return self.bn(self.conv(x)) + self.conv(x)


@pytest.mark.parametrize("model", [_PreActivation(), _SharedConvolution()], ids=["pre_activation", "shared"])
def test_a_batchnorm_whose_convolution_has_other_uses_or_comes_after_it_stays(model):
    model = _with_statistics(model)
    x = torch.randn(2, 3, 8, 8)
    before = model(x)

    assert fold_batchnorms(model) == 0
    assert _batchnorms(model) == 2 if isinstance(model, _PreActivation) else 1
    torch.testing.assert_close(model(x), before)


class _Untraceable(nn.Module):
    """Control flow on a tensor's value (fx cannot trace it), around a Sequential chain and a loose pair."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())
        self.conv = nn.Conv2d(4, 4, 1)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        y = self.stem(x)
        if y.mean() > 0:  # fx: a Proxy cannot be a bool
            return self.bn(self.conv(y))
        return self.conv(y)


def test_an_untraceable_model_folds_the_pairs_of_its_sequential_chains_only():
    model = _with_statistics(_Untraceable())
    x = torch.randn(2, 3, 8, 8)
    before = model(x)

    assert fold_batchnorms(model) == 1
    assert isinstance(model.stem[1], nn.Identity) and isinstance(model.bn, nn.BatchNorm2d)
    torch.testing.assert_close(model(x), before, rtol=1e-4, atol=1e-5)


def test_a_model_in_training_mode_is_refused():
    with pytest.raises(ValueError, match="training mode"):
        fold_batchnorms(nn.Sequential(nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)))
