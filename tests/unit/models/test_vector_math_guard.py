"""The vector-math guard: which modules it guards, that it changes no output, that it runs one tiny matrix
product before each guarded call, and that the sidecar's CPU runner and the measurements of perf/ use it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from spark_cnn.models.spec import DEFAULT_TOP_K, Endpoint
from spark_cnn.models.timing import preprocessing_for
from spark_cnn.models.vector_math_guard import GUARDED_ACTIVATIONS, guard_vector_math, is_guarded
from spark_cnn.sidecar.runner import ModelRunner


def _squeeze_excitation_net() -> nn.Module:
    """An efficientnet-like block: convolution, normalisation, silu, a sigmoid gate, then gelu and elu."""
    class Gate(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.pool, self.fc, self.act = nn.AdaptiveAvgPool2d(1), nn.Conv2d(8, 8, 1), nn.Sigmoid()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * self.act(self.fc(self.pool(x)))
    return nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.SiLU(inplace=True), Gate(), nn.GELU(),
                         nn.ReLU(), nn.ELU(), nn.Hardswish()).eval()


@pytest.fixture
def counted_products(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    products: list[int] = []
    real_mm = torch.mm
    monkeypatch.setattr(torch, "mm", lambda *a, **k: (products.append(1), real_mm(*a, **k))[1])
    return products


def test_it_guards_each_guarded_kind_once_and_nothing_else():
    net = _squeeze_excitation_net()
    assert guard_vector_math(net) == 4  # silu, sigmoid, gelu, elu
    assert guard_vector_math(net) == 0  # not twice
    guarded = {type(m) for m in net.modules() if is_guarded(m)}
    assert guarded == {nn.SiLU, nn.Sigmoid, nn.GELU, nn.ELU} == set(GUARDED_ACTIVATIONS)
    assert not any(is_guarded(m) for m in net.modules() if isinstance(m, (nn.ReLU, nn.Hardswish, nn.Conv2d)))


def test_a_guarded_network_computes_bit_identical_outputs():
    torch.manual_seed(0)
    net, images = _squeeze_excitation_net(), torch.randn(4, 3, 32, 32)
    with torch.inference_mode():
        plain = net(images.clone())
        guard_vector_math(net)
        guarded = net(images.clone())
    assert torch.equal(plain, guarded)


def test_each_guarded_call_runs_one_tiny_matrix_product_first(counted_products: list[int]):
    net = _squeeze_excitation_net()
    guard_vector_math(net)
    order: list[str] = []
    for name, module in net.named_modules():
        if is_guarded(module):
            module.register_forward_pre_hook(lambda m, a, name=name: order.append(f"{name}:{len(counted_products)}"))
    with torch.inference_mode():
        net(torch.randn(2, 3, 16, 16))
    assert len(counted_products) == 4
    # each activation's own check sees the product its guard ran just before (hooks run in registration order)
    assert order == ["2:1", "3.act:2", "4:3", "6:4"]


def test_the_sidecars_cpu_runner_guards_its_model(counted_products: list[int]):
    endpoint = Endpoint(source="efficientnet_b0", weights=None, preprocessing=preprocessing_for((3, 64, 64)),
                        top_k=DEFAULT_TOP_K)
    runner = ModelRunner(endpoint, torch.device("cpu"))
    modules = list(runner.predictor.module.modules())
    silu_and_gates = [m for m in modules if isinstance(m, (nn.SiLU, nn.Sigmoid))]
    assert len(silu_and_gates) == 65 and all(is_guarded(m) for m in silu_and_gates)
    runner.forward(runner.upload(torch.zeros(2, 64, 64, 3, dtype=torch.uint8)))
    assert len(counted_products) == 65


def test_perfs_in_process_measurements_time_the_guarded_module():
    from spark_cnn.perf_tools.validate import measure_batch_ms, measure_layers_ms

    def classifier() -> nn.Module:
        return nn.Sequential(_squeeze_excitation_net(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
    net = classifier()
    measure_batch_ms(net, (3, 32, 32), 2, repeats=1, warmup=0)
    assert sum(is_guarded(m) for m in net.modules()) == 4
    other = classifier()
    measure_layers_ms(other, (3, 32, 32), 2, repeats=1)
    assert sum(is_guarded(m) for m in other.modules()) == 4


def test_timms_own_sigmoid_and_gelu_classes_are_guarded_and_its_others_are_not():
    activations = pytest.importorskip("timm.layers.activations")
    net = nn.Sequential(activations.GELU(), activations.Sigmoid(), activations.Swish(), activations.QuickGELU(),
                        activations.GELUTanh(), activations.HardSwish(), activations.Tanh(), activations.PReLU())
    assert guard_vector_math(net) == 5
    assert [is_guarded(m) for m in net] == [True] * 5 + [False] * 3


def test_a_timm_network_built_with_its_own_gates_is_guarded_wherever_it_runs_the_vector_exp():
    timm = pytest.importorskip("timm")
    net = timm.create_model("rexnet_100", pretrained=False).eval()
    assert guard_vector_math(net) == 30  # 17 silu (torch's), 13 squeeze-excitation gates (timm's Sigmoid)
    kinds: dict[str, list[bool]] = {}
    for m in net.modules():
        kinds.setdefault(f"{type(m).__module__}.{type(m).__name__}", []).append(is_guarded(m))
    assert len(kinds["timm.layers.activations.Sigmoid"]) == 13 and all(kinds["timm.layers.activations.Sigmoid"])
    assert all(kinds["torch.nn.modules.activation.SiLU"]) and not any(kinds["torch.nn.modules.activation.ReLU6"])
