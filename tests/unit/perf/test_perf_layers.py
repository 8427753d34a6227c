"""Layer analysis: hand-computed FLOPs and bytes of single layers, whole torchvision models against
FlopCounterMode, batch scaling, liveness, the hooks and TorchScript tracers, and what is listed as uncosted."""

from __future__ import annotations

import dataclasses
import json
import warnings

import pytest
import torch
import torchvision
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.models.digits import DigitsCNN
from spark_cnn.perf.layers import LayerCost, ModelCost, analyse

F32 = 4  # bytes per element at the default dtype_bytes


@pytest.fixture(scope="module")
def resnet18_cost() -> ModelCost:
    return analyse(torchvision.models.resnet18(weights=None))


def only_layer(module: nn.Module, input_shape: tuple[int, ...]) -> LayerCost:
    cost = analyse(nn.Sequential(module), input_shape)
    assert cost.method == "fx" and cost.uncosted == ()
    assert [layer.name for layer in cost.layers] == ["0"]
    return cost.layers[0]


# --- single layers, counted by hand ------------------------------------------------------------------------------


def test_resnet18_first_conv(resnet18_cost):
    conv1 = resnet18_cost.layers[0]
    assert (conv1.name, conv1.op) == ("conv1", "conv2d")
    assert conv1.flops == 2 * 112 * 112 * 64 * 3 * 7 * 7 == 236_027_904  # 3->64, k7, s2, p3, no bias
    assert conv1.weight_bytes == 64 * 3 * 7 * 7 * F32 == 37_632
    assert conv1.input_bytes == 3 * 224 * 224 * F32
    assert conv1.output_bytes == 64 * 112 * 112 * F32
    assert conv1.shape["kernel"] == (7, 7) and conv1.shape["stride"] == (2, 2) and conv1.shape["padding"] == (3, 3)
    assert (conv1.shape["in_hw"], conv1.shape["out_hw"], conv1.shape["groups"]) == ((224, 224), (112, 112), 1)
    assert conv1.shape["macs"] == 112 * 112 * 64 * 3 * 7 * 7


def test_depthwise_conv():
    layer = only_layer(nn.Conv2d(32, 32, 3, padding=1, groups=32, bias=False), (32, 16, 16))
    assert layer.op == "conv2d" and layer.shape["groups"] == 32
    assert layer.flops == 2 * 16 * 16 * 32 * 1 * 3 * 3  # in_ch / groups = 1
    assert layer.weight_bytes == 32 * 1 * 3 * 3 * F32
    assert layer.input_bytes == layer.output_bytes == 32 * 16 * 16 * F32


def test_linear_with_bias():
    layer = only_layer(nn.Linear(128, 10), (128,))
    assert layer.op == "linear"
    assert (layer.shape["in_features"], layer.shape["out_features"], layer.shape["bias"]) == (128, 10, True)
    assert layer.flops == 2 * 128 * 10 + 10
    assert layer.weight_bytes == (128 * 10 + 10) * F32
    assert (layer.input_bytes, layer.output_bytes) == (128 * F32, 10 * F32)


@pytest.mark.parametrize(("module", "op", "flops", "input_numel", "output_numel", "weight_numel"), [
    (nn.BatchNorm2d(16), "batch_norm", 2 * 16 * 8 * 8, 16 * 8 * 8, 16 * 8 * 8, 4 * 16),  # scale+shift; 4 vectors
    (nn.MaxPool2d(2), "max_pool2d", 16 * 4 * 4 * (2 * 2 - 1), 16 * 8 * 8, 16 * 4 * 4, 0),  # values, no indices
    (nn.AvgPool2d(2), "avg_pool2d", 16 * 4 * 4 * (2 * 2 + 1), 16 * 8 * 8, 16 * 4 * 4, 0),
    (nn.AdaptiveAvgPool2d(1), "adaptive_avg_pool2d", 16 * 8 * 8 + 16, 16 * 8 * 8, 16, 0),
    (nn.ReLU(), "relu", 16 * 8 * 8, 16 * 8 * 8, 16 * 8 * 8, 0),
    (nn.Hardswish(), "hardswish", 5 * 16 * 8 * 8, 16 * 8 * 8, 16 * 8 * 8, 0),
    (nn.Sigmoid(), "sigmoid", 4 * 16 * 8 * 8, 16 * 8 * 8, 16 * 8 * 8, 0),
    (nn.Softmax(dim=1), "softmax", 5 * 16 * 8 * 8, 16 * 8 * 8, 16 * 8 * 8, 0),
    (nn.Dropout(0.5), "dropout", 0, 0, 0, 0),  # eval: the input itself
    # traced as the sidecar computes, on a channels-last image: flattening it is a copy (NCHW: a view, free)
    (nn.Flatten(), "flatten", 0, 16 * 8 * 8, 16 * 8 * 8, 0),
])
def test_layer_rules(module, op, flops, input_numel, output_numel, weight_numel):
    layer = only_layer(module, (16, 8, 8))
    assert (layer.op, layer.flops) == (op, flops)
    assert (layer.input_bytes, layer.output_bytes, layer.weight_bytes) == (
        input_numel * F32, output_numel * F32, weight_numel * F32)


class ChannelShuffle(nn.Module):
    def forward(self, x):
        return x.view(1, 2, 4, 6, 6).transpose(1, 2).contiguous().view(1, 8, 6, 6)


def test_views_move_nothing_but_a_contiguous_copy_does():
    cost = analyse(ChannelShuffle(), (8, 6, 6))
    moved = {layer.name: (layer.input_bytes, layer.output_bytes) for layer in cost.layers}
    numel = 8 * 6 * 6
    assert moved == {"view": (0, 0), "transpose": (0, 0), "contiguous": (numel * F32, numel * F32), "view_1": (0, 0)}


# --- whole models ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "vgg11", "squeezenet1_0", "googlenet",
                                  "efficientnet_b0"])
def test_conv_and_linear_flops_agree_with_flop_counter(name):
    options = {"aux_logits": False, "init_weights": False} if name == "googlenet" else {}
    model = torchvision.models.get_model(name, weights=None, **options).eval()
    cost = analyse(model, (3, 112, 112))  # any size the networks take: a quarter of 224's pixels, a quarter the time
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(torch.zeros(1, 3, 112, 112))
    assert cost.method == "fx" and cost.uncosted == ()
    assert cost.macs() * 2 == pytest.approx(counter.get_total_flops(), rel=1e-3)
    assert cost.flops() > cost.macs() * 2  # plus batch norm, activations, pooling, biases


def test_totals_scale_with_batch_and_weights_do_not(resnet18_cost):
    cost = resnet18_cost
    activations = sum(layer.input_bytes + layer.output_bytes for layer in cost.layers)
    weights = sum(layer.weight_bytes for layer in cost.layers)
    assert cost.flops(8) == 8 * cost.flops(1)
    assert cost.macs(8) == 8 * cost.macs(1)
    assert cost.bytes(1) == activations + weights
    assert cost.bytes(8) == 8 * activations + weights
    assert weights >= 11_000_000 * F32  # resnet18's ~11.7 M parameters, each read once per batch
    assert cost.peak_memory_bytes(8) == cost.parameter_bytes + 8 * cost.peak_activation_bytes
    layer = cost.top(1)[0]
    assert layer.intensity(64) > layer.intensity(1)  # weight reads amortised over the batch


def test_dtype_bytes_scales_bytes_not_flops():
    model = DigitsCNN()
    fp32, bf16 = analyse(model, (3, 32, 32)), analyse(model, (3, 32, 32), dtype_bytes=2)
    assert bf16.flops() == fp32.flops()
    assert 2 * bf16.bytes() == fp32.bytes()
    # Not exactly half: max-pooling's int64 indices are allocated (and counted live) whatever the precision.
    assert bf16.peak_activation_bytes < fp32.peak_activation_bytes
    assert 2 * bf16.parameter_bytes == fp32.parameter_bytes


def test_demo_model():
    cost = analyse(DigitsCNN(), (3, 32, 32))
    assert [(layer.name, layer.op) for layer in cost.layers] == [
        ("features.0", "conv2d"), ("features.1", "relu"), ("features.2", "max_pool2d"), ("features.3", "conv2d"),
        ("features.4", "relu"), ("features.5", "max_pool2d"), ("classifier.0", "flatten"),
        ("classifier.1", "linear"), ("classifier.2", "relu"), ("classifier.3", "linear")]
    expected = [
        2 * 32 * 32 * 16 * 3 * 9 + 16 * 32 * 32,   # conv 3->16 at 32x32, with bias
        16 * 32 * 32,                              # relu
        16 * 16 * 16 * 3,                          # 2x2 max pool: 3 comparisons per output
        2 * 16 * 16 * 32 * 16 * 9 + 32 * 16 * 16,  # conv 16->32 at 16x16
        32 * 16 * 16,
        32 * 8 * 8 * 3,
        0,                                         # flatten
        2 * 2048 * 64 + 64,                        # linear 2048->64
        64,
        2 * 64 * 10 + 10]                          # linear 64->10
    assert [layer.flops for layer in cost.layers] == expected
    assert cost.flops() == 3_575_178
    # The peak is the first relu (not in place): the conv output and the relu output, 16x32x32 each.
    assert cost.peak_activation_bytes == 2 * 16 * 32 * 32 * F32
    assert cost.parameter_bytes == sum(p.numel() for p in DigitsCNN().parameters()) * F32


# --- liveness ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("inplace", "peak"), [
    # input 3x8x8 = 768 B, conv1 out 8x8x8 = 2048 B, relu out 2048 B, conv2 out 4x8x8 = 1024 B
    (False, 2048 + 2048),   # during relu: its input and output (the image died after conv1)
    (True, 2048 + 1024),    # during conv2: relu wrote in place into conv1's output, which conv2 reads
])
def test_peak_activation_bytes_conv_relu_conv(inplace, peak):
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(inplace=inplace), nn.Conv2d(8, 4, 3, padding=1))
    cost = analyse(model, (3, 8, 8))
    assert cost.peak_activation_bytes == peak


# --- fallbacks and what cannot be costed ------------------------------------------------------------------------


class Branchy(nn.Module):
    """Data-dependent control flow: fx cannot trace it."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bright = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.dark = nn.Conv2d(8, 8, 1, bias=False)
        self.head = nn.Linear(8, 4)

    def forward(self, x):
        y = self.stem(x)
        if x.sum() > 0:
            y = y + self.bright(y)
        else:
            y = y + self.dark(y)
        return self.head(y.mean((2, 3)))


def test_hooks_fallback_on_data_dependent_control_flow():
    cost = analyse(Branchy(), (3, 16, 16))
    assert cost.method == "hooks"
    assert "fx could not trace Branchy" in cost.notes[0]
    assert cost.uncosted == ()
    layers = {layer.name: layer for layer in cost.layers}
    # A zero image takes the `else` branch; the functional ops between modules are costed too.
    assert "bright" not in layers
    assert layers["dark"].flops == 2 * 16 * 16 * 8 * 8
    assert layers["stem"].flops == 2 * 16 * 16 * 8 * 3 * 9
    assert layers["add"].flops == 8 * 16 * 16
    assert layers["mean"].flops == 8 * 16 * 16 + 8
    assert layers["head"].flops == 2 * 8 * 4 + 4
    assert {"sum", "gt", "item"} <= set(layers)  # `if x.sum() > 0`: a reduction, a comparison, a host read


class Gated(nn.Module):
    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, x):
        return self.net(x) if x.sum() >= 0 else x


def test_hooks_see_what_fx_sees(resnet18_cost):
    model = Gated(torchvision.models.resnet18(weights=None))
    cost = analyse(model)
    assert cost.method == "hooks" and cost.uncosted == ()
    assert cost.flops() == resnet18_cost.flops() + 3 * 224 * 224 + 1  # + the gate's sum and comparison
    assert cost.macs() == resnet18_cost.macs()
    assert cost.peak_activation_bytes == resnet18_cost.peak_activation_bytes
    assert [layer.name for layer in cost.layers if layer.op == "add"][:2] == ["net.layer1.0.add", "net.layer1.1.add"]
    conv1 = next(layer for layer in cost.layers if layer.name == "net.conv1")
    assert conv1 == dataclasses.replace(resnet18_cost.layers[0], name="net.conv1")


class Spectral(nn.Module):
    def __init__(self, branchy: bool):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.branchy = branchy

    def forward(self, x):
        y = self.conv(x)
        if self.branchy and y.sum() > 0:  # only consulted by fx when branchy: then it cannot trace
            y = y * 2
        return torch.fft.fft2(y).abs()


@pytest.mark.parametrize(("branchy", "method"), [(False, "fx"), (True, "hooks")])
def test_unknown_operator_is_listed_not_counted(branchy, method):
    cost = analyse(Spectral(branchy), (3, 10, 10))
    assert cost.method == method
    assert len(cost.uncosted) == 1 and "fft" in cost.uncosted[0] and "aten._fft" in cost.uncosted[0]
    # The fft node may keep a layer for what it does that is known (a copy to complex), never its FLOPs.
    assert all(layer.flops == 0 for layer in cost.layers if "fft" in layer.name)
    assert [layer.op for layer in cost.layers if layer.flops][0] == "conv2d"
    assert cost.layers[-1].op == "abs"  # what follows is still costed


def test_torchscript_is_analysed_at_operator_level():
    model = DigitsCNN()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated
        scripted = torch.jit.script(model)
    eager, script = analyse(model, (3, 32, 32)), analyse(scripted, (3, 32, 32))
    assert script.method == "dispatch" and script.uncosted == ()
    assert [layer.name for layer in script.layers][:4] == ["conv2d", "relu", "max_pool2d", "conv2d_1"]
    assert script.flops() == eager.flops() and script.bytes() == eager.bytes()
    assert script.peak_activation_bytes == eager.peak_activation_bytes


# --- the interface ----------------------------------------------------------------------------------------------


def test_top_and_as_dict(resnet18_cost):
    top = resnet18_cost.top(3)
    assert len(top) == 3 and top[0].flops >= top[1].flops >= top[2].flops
    assert all(layer.op == "conv2d" for layer in top)
    assert resnet18_cost.top(1, key="weight_bytes")[0].weight_bytes == 512 * 512 * 3 * 3 * F32  # layer4 convs
    assert resnet18_cost.top(1, key=lambda layer: -layer.flops)[0].flops == 0
    data = json.loads(json.dumps(resnet18_cost.as_dict()))
    assert data["flops"] == resnet18_cost.flops() and data["method"] == "fx"
    assert data["layers"][0]["shape"]["kernel"] == [7, 7]
    with pytest.raises(ValueError, match="key must be one of"):
        resnet18_cost.top(3, key="time")
    with pytest.raises(ValueError, match="batch must be a positive integer"):
        resnet18_cost.flops(0)


def test_bad_arguments_and_failing_models_say_what_to_do():
    with pytest.raises(ConfigError, match="input_shape"):
        analyse(DigitsCNN(), (3, 0, 32))
    with pytest.raises(ConfigError, match="dtype_bytes"):
        analyse(DigitsCNN(), (3, 32, 32), dtype_bytes=3)
    with pytest.raises(ModelError, match="nn.Module"):
        analyse("resnet18")
    with pytest.raises(ModelError, match=r"pass the input_shape the model expects"):
        analyse(DigitsCNN(), (3, 64, 64))  # the classifier expects 32x32 inputs
    with pytest.raises(ModelError, match="meta device"):
        analyse(DigitsCNN().to("meta"), (3, 32, 32))


def test_training_flags_are_restored():
    model = DigitsCNN().train()
    model.classifier.eval()
    analyse(model, (3, 32, 32))
    assert model.training and model.features.training and not model.classifier.training
