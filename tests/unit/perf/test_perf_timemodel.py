"""Device calibration, the per-batch time model and its validation: the profile's format and cache, torch's
convolution backend rule, interpolation, the allocator replay that predicts page faults, and the measuring
side, on synthetic profiles and tiny modules (the one real calibration here has a budget of a second)."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from torch import nn

from spark_cnn.errors import ConfigError
from spark_cnn.models.digits import DigitsCNN
from spark_cnn.perf import heap as heap_replay
from spark_cnn.perf import timemodel
from spark_cnn.perf.device_key import device_key
from spark_cnn.perf.layers import LayerCost, analyse
from spark_cnn.perf.profile import PROFILE_VERSION, DeviceProfile, conv_backend
from spark_cnn.perf.timemodel import (
    HEADS_LAYER,
    MODULES_LAYER,
    NORMALISE_LAYER,
    layer_kind,
    predict_batch_ms,
    predict_layers_ms,
    predict_peak_memory_bytes,
    predict_throughput,
)
from spark_cnn.perf_tools.calibration import calibrate, measure
from spark_cnn.perf_tools.calibration import conv_bench as convolutions
from spark_cnn.perf_tools.calibration.conv_bench import (
    CONV_GRID,
    LARGE_CONV_BATCH,
    LARGE_CONV_MAX_OUT_HW,
    LARGE_DEPTHWISE_BATCH,
    LARGE_DEPTHWISE_GRID,
    LARGE_POINTWISE_GRID,
    POINTWISE_NCHW_BATCHES,
    POINTWISE_NCHW_GRID,
    POINTWISE_ONEDNN_BATCH,
    STRIDED_GROUPED,
)
from spark_cnn.perf_tools.calibration.gemm_bench import TOKEN_ROWS
from spark_cnn.perf_tools.calibration.harness import Bench, Budget, Timing
from spark_cnn.perf_tools.validate import measure_batch_ms, measure_layers_ms, validate
from tests.perf_doubles import (
    CALL_US,
    CALL_WARMTH,
    GFLOPS,
    KIB,
    MIB,
    US_PER_BYTE,
    WARMTH,
    conv_us,
    synthetic_conv,
    synthetic_gemm,
    synthetic_profile,
)


@pytest.fixture(scope="module")
def profile() -> DeviceProfile:
    return synthetic_profile()


@pytest.fixture(scope="module")
def digits_cost():
    return analyse(DigitsCNN(), (3, 32, 32))


# --- the profile ---------------------------------------------------------------------------------------------


def test_profile_json_round_trip_and_immutability(profile):
    again = DeviceProfile.from_json(profile.to_json())
    assert again == profile
    assert isinstance(again.conv, tuple) and isinstance(again.curves["relu"][0], tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        again.threads = 2


def test_profile_of_another_version_is_refused(profile):
    data = json.loads(profile.to_json())
    data["version"] = PROFILE_VERSION + 1
    with pytest.raises(ConfigError, match="calibrate again"):
        DeviceProfile.from_json(json.dumps(data))
    with pytest.raises(ConfigError, match="not a device profile"):
        DeviceProfile.from_json("[1, 2]")


def test_device_key_names_threads_and_torch():
    key = device_key("cpu", 3)
    assert key.startswith("cpu-") and "-3t-" in key and torch.__version__.split("+")[0] in key
    assert device_key("cpu", 1) != key
    with pytest.raises(ConfigError, match="'cpu' or 'cuda"):
        device_key("tpu")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this host has CUDA")
def test_cuda_without_cuda_says_so():
    with pytest.raises(ConfigError, match="CUDA is not available"):
        calibrate("cuda", budget_s=1.0)


def test_calibration_threads_are_the_sidecars():
    # calibrate() times the device with the thread count a sidecar uses when none is asked for
    from spark_cnn.task.sidecar_env import cpu_threads

    assert device_key("cpu", None) == device_key("cpu", cpu_threads(None))


@pytest.mark.parametrize("bad", [{"budget_s": 0}, {"threads": 0}, {"threads": True}])
def test_calibrate_rejects_bad_options(bad, tmp_path):
    with pytest.raises(ConfigError):
        calibrate("cpu", cache_dir=str(tmp_path), **bad)


def test_measure_counts_calls_and_passes_fresh_arguments():
    seen = []
    timing = measure(seen.append, repeats=4, warmup=2, before=lambda: (len(seen),))
    assert len(timing.seconds) == len(timing.faults) == 4
    assert seen == list(range(6))  # each call got its own fresh argument
    assert timing.best_s <= timing.median_s and timing.spread >= 0
    assert timing.best_without_faults_s(1.0) >= 0.05 * timing.best_s


def test_calibration_prices_a_point_at_its_typical_call_without_its_faults():
    # calls of 10, 12, 30 and 11 us; the 12 us call faulted 4 pages at 0.5 us each
    timing = Timing(seconds=(10e-6, 12e-6, 30e-6, 11e-6), faults=(0, 4, 0, 0))
    bench = Bench(torch.device("cpu"), Budget(1.0))
    bench.fault_us = 0.5
    assert bench.us_without_faults(timing) == pytest.approx(10.5)  # of 10, 10, 11, 30: the middle two's mean
    assert timing.best_without_faults_s(0.5e-6) == pytest.approx(10e-6)
    assert Timing(seconds=(0.2, 0.1), faults=(0, 0)).typical_without_faults_s(0.0) == pytest.approx(0.15)  # long
    assert Timing(seconds=(0.3, 0.1, 0.2), faults=(0, 0, 0)).typical_without_faults_s(0.0) == 0.2


# --- torch's convolution backend ---------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("batch", "cin", "cout", "kernel", "stride", "groups", "hw"), [
    (1, 64, 256, 1, 1, 1, 56), (8, 64, 256, 1, 1, 1, 56), (16, 64, 256, 1, 1, 1, 56), (1, 64, 128, 1, 2, 1, 56),
    (1, 64, 64, 3, 1, 1, 56), (1, 16, 16, 3, 1, 1, 5), (1, 16, 16, 5, 1, 1, 5), (1, 32, 32, 3, 1, 32, 28),
    (1, 16, 8, 1, 1, 1, 1), (2, 16, 16, 3, 1, 1, 5),
])
def test_conv_backend_matches_torch(threads, batch, cin, cout, kernel, stride, groups, hw):
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = torch.empty(batch, cin, hw, hw).contiguous(memory_format=torch.channels_last)
        w = torch.empty(cout, cin // groups, kernel, kernel)
        pad = kernel // 2
        torch_choice = torch._C._select_conv_backend(x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0],
                                                     groups)
    finally:
        torch.set_num_threads(previous)
    ours = conv_backend(cin, (kernel, kernel), (stride, stride), (1, 1), groups, batch, (hw, hw), threads)
    assert {"Mkldnn": "mkldnn", "Slow2d": "slow2d"}.get(str(torch_choice).split(".")[-1]) == ours


# --- predictions on a synthetic device -----------------------------------------------------------------------


def test_layers_include_the_sidecar_stages(profile, digits_cost):
    rows = predict_layers_ms(digits_cost, profile, 4)
    names = [layer.name for layer, _, _ in rows]
    assert names[0] == NORMALISE_LAYER and names[-2:] == [HEADS_LAYER, MODULES_LAYER]
    assert names[1:-2] == [layer.name for layer in digits_cost.layers]
    assert all(ms > 0 and bound in timemodel.BOUNDS for _, ms, bound in rows)
    assert predict_batch_ms(digits_cost, profile, 4) == pytest.approx(sum(ms for _, ms, _ in rows))
    assert predict_throughput(digits_cost, profile, 4) == pytest.approx(4e3 / predict_batch_ms(digits_cost,
                                                                                               profile, 4))


def test_conv_time_follows_the_calibrated_rate(profile):
    # A shape between grid points of a device that runs every convolution at 100 GFLOP/s: the interpolated
    # cost per FLOP is that rate, whatever the neighbours' shapes.
    cost = analyse(nn.Sequential(nn.Conv2d(128, 128, 3, padding=1, bias=False)), (128, 28, 28))
    conv = cost.layers[0]
    for batch in (1, 8, 32):
        rows = {layer.name: (ms, bound) for layer, ms, bound in predict_layers_ms(cost, profile, batch)}
        ms, bound = rows[conv.name]
        assert ms * 1e3 == pytest.approx(20.0 + conv.flops_at(batch) / (GFLOPS * 1e3), rel=0.02)
        assert bound == "compute"


def _conv_work_per_image_us(profile, cost, batch):
    (ms,) = [ms for layer, ms, _ in predict_layers_ms(cost, profile, batch) if layer.op == "conv2d"]
    return (ms * 1e3 - profile.conv_call_us) / batch


def test_large_batch_points_lower_the_per_image_conv_cost_above_8(profile):
    # A device whose small-output convolutions run 25% faster per image at LARGE_CONV_BATCH (a GEMM of
    # batch x 14 x 14 rows that fills with the batch). A calibrated shape reads its own points: batch 32 the
    # faster rate, 16 between 8 and 32 (interpolated in log2(batch)), 64 the batch-32 rate (inverse-distance
    # weighting holds the nearest value, it extrapolates no slope). Without those points it is flat above 8.
    faster = synthetic_profile(conv=synthetic_conv(large_batch_speedup=1.25))
    cost = analyse(nn.Sequential(nn.Conv2d(256, 256, 3, padding=1, bias=False)), (256, 14, 14))
    flops = cost.layers[0].flops
    flat = {b: _conv_work_per_image_us(profile, cost, b) for b in (8, 16, 32, 64)}
    assert all(us == pytest.approx(flops / (GFLOPS * 1e3), rel=0.01) for us in flat.values())
    work = {b: _conv_work_per_image_us(faster, cost, b) for b in (8, 16, 32, 64)}
    assert work[8] == pytest.approx(flat[8], rel=0.02)
    assert work[32] == pytest.approx(flat[32] / 1.25, rel=0.03)
    assert work[32] < 0.97 * work[16] and work[16] < 0.97 * work[8]
    assert work[64] == pytest.approx(work[32], rel=0.03)
    # a shape between grid points (128 channels, neighbours 64 and 256) gets part of their slope, never more
    between = analyse(nn.Sequential(nn.Conv2d(128, 128, 3, padding=1, bias=False)), (128, 14, 14))
    ratio = _conv_work_per_image_us(faster, between, 32) / _conv_work_per_image_us(faster, between, 8)
    assert 1 / 1.25 - 0.01 < ratio < 0.98


def test_small_output_and_grouped_convolutions_are_timed_at_the_large_batch():
    large = [shape for shape in CONV_GRID if convolutions._large_batch(*shape)]
    for cin, cout, kernel, stride, groups, in_hw in CONV_GRID:
        out_hw = (in_hw + 2 * (kernel // 2) - kernel) // stride + 1
        chosen = (cin, cout, kernel, stride, groups, in_hw) in large
        assert chosen == (groups > 1 or out_hw <= LARGE_CONV_MAX_OUT_HW)
    assert any(groups > 1 and in_hw >= 56 for *_, groups, in_hw in large)  # memory-bound ones leave the cache
    assert 40 <= len(large) <= 64  # the section's share is sized for about 61 of them (a full calibration kept all)
    kinds = {"grouped" if groups > 1 else "pointwise" if kernel == 1 else "kxk"
             for _, _, kernel, _, groups, _ in large[:10]}
    assert kinds == {"grouped", "pointwise", "kxk"}  # a prefix (a small budget) spans the kinds


def test_elementwise_layers_read_their_curve(profile):
    cost = analyse(nn.Sequential(nn.BatchNorm2d(16), nn.ReLU(inplace=True)), (16, 32, 32))
    rows = {layer.name: ms for layer, ms, _ in predict_layers_ms(cost, profile, 8)}
    nbytes = 16 * 32 * 32 * 4 * 8  # between two calibrated sizes: log-log interpolation of a line is close
    assert rows["0"] * 1e3 == pytest.approx(CALL_US + nbytes * US_PER_BYTE, rel=0.03)
    huge = 4096.0 * 4**7 * 8  # beyond the largest point: in proportion to the bytes
    model = timemodel._Model.of(profile)
    assert model.curve_us("relu", huge) == pytest.approx((CALL_US + 4096.0 * 4**7 * US_PER_BYTE) * 8)
    assert model.curve_us("relu", 1.0) == pytest.approx(CALL_US + 4096 * US_PER_BYTE)  # the overhead floor


def test_linear_interpolates_gemms(profile):
    cost = analyse(nn.Sequential(nn.Flatten(), nn.Linear(1024, 1000)), (1024,))
    linear = next(layer for layer in cost.layers if layer.op == "linear")
    rows = {layer.name: ms for layer, ms, _ in predict_layers_ms(cost, profile, 8)}
    assert rows[linear.name] * 1e3 == pytest.approx(2 * 8 * 1024 * 1000 / (GFLOPS * 1e3), rel=0.05)


def test_linear_at_2_and_4_rows_reads_those_gemms(profile):
    # A device whose 2- and 4-row GEMMs are slow (a large layer streams its weights for a few rows): batch 2
    # and 4 of a calibrated shape read them. With rows 1, 8 and 64 only, even a device that follows the law
    # exactly is mispredicted at 2 rows (the roofline-normalised cost bends between 1 and 8 rows).
    slow = synthetic_profile(gemm=synthetic_gemm({2: 2.0, 4: 1.5}))
    cost = analyse(nn.Sequential(nn.Flatten(), nn.Linear(4096, 4096)), (4096,))
    linear = next(layer for layer in cost.layers if layer.op == "linear")
    def ratio(p, batch):
        rows = {layer.name: ms for layer, ms, _ in predict_layers_ms(cost, p, batch)}
        return rows[linear.name] * 1e3 / (2 * batch * 4096 * 4096 / (GFLOPS * 1e3))
    assert ratio(slow, 2) > 1.8 and ratio(slow, 4) > 1.35
    assert ratio(slow, 8) < 1.1 and ratio(slow, 1) < 1.1
    assert ratio(profile, 2) == pytest.approx(1.0, rel=0.02) and ratio(profile, 4) == pytest.approx(1.0, rel=0.02)
    sparse = synthetic_profile(gemm=tuple(g for g in synthetic_gemm() if g["rows"] in (1, 8, 64)))
    assert abs(ratio(sparse, 2) - 1.0) > 0.1


def test_linear_on_tokens_reads_the_token_gemms_at_their_largest_row_count():
    # A linear layer over every pixel or token (convnext, vit, swin) runs tens of thousands of rows per batch.
    # A device whose 1,024-row GEMMs run faster than its 256-row ones: such a layer is priced at the 1,024-row
    # rate, not at a blend of 64, 256 and 1,024 rows that the distance in log2(rows) would make.
    token = tuple({"rows": r, "in_features": i, "out_features": o,
                   "us": 2 * r * i * o / (GFLOPS * 1e3) * {256: 0.8, 1024: 0.6}[r]}
                  for r in TOKEN_ROWS for i, o in ((96, 384), (384, 96), (768, 3072)))
    cost = analyse(nn.Sequential(nn.Linear(96, 384)), (3136, 96))  # 56 x 56 pixels of 96 channels
    linear = next(layer for layer in cost.layers if layer.op == "linear")
    def ratio(p, batch):
        rows = {layer.name: ms for layer, ms, _ in predict_layers_ms(cost, p, batch)}
        return rows[linear.name] * 1e3 / (2 * batch * 3136 * 96 * 384 / (GFLOPS * 1e3))
    with_tokens = synthetic_profile(gemm=synthetic_gemm() + token)
    assert ratio(with_tokens, 8) == pytest.approx(0.6, rel=0.03)
    assert ratio(with_tokens, 1) == pytest.approx(0.6, rel=0.03)
    assert ratio(synthetic_profile(), 8) > 0.8  # without them: read from the classifier shapes' 64 rows


class ShuffleThen(nn.Module):
    """shufflenet's pattern: a channel shuffle made contiguous leaves NCHW, and the convolution after it (its
    depthwise one, or the 1x1 of its branch) runs on that layout."""

    def __init__(self, conv: nn.Conv2d, shuffle: bool):
        super().__init__()
        self.shuffle = shuffle
        self.conv = conv

    def forward(self, x):
        if self.shuffle:
            n, c, h, w = x.shape
            x = x.view(n, 2, c // 2, h, w).transpose(1, 2).contiguous().view(n, c, h, w)
        return self.conv(x)


def _nchw_points(kernel: int, groups: int, batches: tuple[int, ...], slowdown: float) -> tuple[dict, ...]:
    """Calibration points of Conv2d(96, 96, kernel, groups=groups) on NCHW inputs at 14 and 56 pixels, whose
    work runs `slowdown` times the synthetic device's rate (oneDNN's fixed 20 us as ever)."""
    points = []
    for in_hw in (14, 56):
        for batch in batches:
            out_hw, us = conv_us(96, 96, kernel, 1, groups, in_hw, batch)
            points.append({"cin": 96, "cout": 96, "kernel": kernel, "stride": 1, "groups": groups, "in_hw": in_hw,
                           "out_hw": out_hw, "batch": batch, "backend": "mkldnn",
                           "us": 20.0 + slowdown * (us - 20.0), "faults": 0, "nchw": True})
    return tuple(points)


def test_a_depthwise_convolution_on_nchw_reads_its_own_points_by_hand():
    # The NCHW points (calibration's DEPTHWISE_NCHW_GRID) of a device where depthwise work on NCHW runs 3x
    # slower than on channels-last; both tables follow the law, so each prediction is countable by hand.
    nchw_points = _nchw_points(3, 96, (1, 8, LARGE_CONV_BATCH), 3.0)
    profile = synthetic_profile(conv=synthetic_conv() + nchw_points, conv_weight_us_per_mib=0.0)
    plain, shuffled = (analyse(ShuffleThen(nn.Conv2d(96, 96, 3, padding=1, groups=96, bias=False), shuffle),
                               (96, 28, 28)) for shuffle in (False, True))
    (cl_layer,) = [layer for layer in plain.layers if layer.op == "conv2d"]
    (nchw_layer,) = [layer for layer in shuffled.layers if layer.op == "conv2d"]
    assert "nchw" not in cl_layer.shape and nchw_layer.shape["nchw"] is True
    assert layer_kind(nchw_layer, 8, profile) == "conv:depthwise_nchw"
    assert layer_kind(cl_layer, 8, profile) == "conv:depthwise"

    def ms(cost, layer, p):
        return {lay.name: t for lay, t, _ in predict_layers_ms(cost, p, 8)}[layer.name]
    work_ms = 2 * 96 * 28 * 28 * 9 * 8 / (GFLOPS * 1e6)  # depthwise: 2 x channels x pixels x kernel, 8 images
    assert ms(plain, cl_layer, profile) == pytest.approx(0.020 + work_ms, rel=0.05)
    assert ms(shuffled, nchw_layer, profile) == pytest.approx(0.020 + 3 * work_ms, rel=0.05)
    # a profile without NCHW points (a small budget) reads the channels-last ones
    assert ms(shuffled, nchw_layer, synthetic_profile()) == pytest.approx(ms(plain, cl_layer, profile), rel=0.01)


def test_a_depthwise_convolution_reads_points_that_move_as_many_bytes_by_hand():
    # A memory-bound device: a depthwise call costs 1 ns a byte of activations (in and out) while its batch
    # moves under 8 MB, 3 ns beyond. Per FLOP, k5 points then look cheaper than k3 ones at the same bytes, and
    # small activations cheaper than large ones; the generated networks' 273 channels of 44 px at batch 8 (34 MB),
    # read over channels and size, took its price from k5 and in-cache points at half its time.
    def act_bytes(channels, in_hw, out_hw, batch):
        return batch * channels * (in_hw * in_hw + out_hw * out_hw) * 4

    def ns_per_byte(nbytes):
        return 1.0 if nbytes < 8e6 else 3.0

    points = []
    depthwise_grid = [(cin, kernel, stride, in_hw) for cin, _, kernel, stride, groups, in_hw in CONV_GRID
                      if groups == cin > 1]  # calibration's depthwise shapes, k3 and k5, strides 1 and 2
    for channels, kernel, stride, in_hw in depthwise_grid:
        out_hw = (in_hw + 2 * (kernel // 2) - kernel) // stride + 1
        for batch in (1, 8, LARGE_CONV_BATCH):
            nbytes = act_bytes(channels, in_hw, out_hw, batch)
            points.append({"cin": channels, "cout": channels, "kernel": kernel, "stride": stride, "groups": channels,
                           "in_hw": in_hw, "out_hw": out_hw, "batch": batch, "backend": "mkldnn", "faults": 0,
                           "us": 20.0 + nbytes * ns_per_byte(nbytes) / 1e3})
    plain = tuple(c for c in synthetic_conv() if c["groups"] != c["cin"] or c["groups"] == 1)
    profile = synthetic_profile(conv=plain + tuple(points), conv_weight_us_per_mib=0.0)
    for channels, in_hw, batch in ((272, 44, 8), (272, 14, 1)):
        cost = analyse(nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, groups=channels, bias=False)),
                       (channels, in_hw, in_hw))
        (layer,) = [layer for layer in cost.layers if layer.op == "conv2d"]
        assert layer_kind(layer, batch, profile) == "conv:depthwise"
        ms = {lay.name: t for lay, t, _ in predict_layers_ms(cost, profile, batch)}[layer.name]
        nbytes = act_bytes(channels, in_hw, in_hw, batch)  # 34 MB, then 0.4 MB
        assert ms == pytest.approx(0.020 + nbytes * ns_per_byte(nbytes) / 1e6, rel=0.05), (channels, in_hw, batch)


def test_a_pointwise_convolution_on_nchw_on_onednn_reads_its_own_points_by_hand():
    # The NCHW points (calibration's POINTWISE_NCHW_GRID, at batch 16 and 64) of a device where oneDNN's 1x1
    # work on NCHW runs twice as slow as on channels-last. Below batch 16 torch runs it as a GEMM per image,
    # which reads NCHW as it is: the GEMM's own points price it, whatever the layout.
    nchw_points = _nchw_points(1, 1, (POINTWISE_ONEDNN_BATCH, 64), 2.0)
    profile = synthetic_profile(conv=synthetic_conv() + nchw_points, conv_weight_us_per_mib=0.0)
    plain, shuffled = (analyse(ShuffleThen(nn.Conv2d(96, 96, 1, bias=False), shuffle), (96, 28, 28))
                       for shuffle in (False, True))
    (cl_layer,) = [layer for layer in plain.layers if layer.op == "conv2d"]
    (nchw_layer,) = [layer for layer in shuffled.layers if layer.op == "conv2d"]
    assert nchw_layer.shape["nchw"] is True and "nchw" not in cl_layer.shape
    assert layer_kind(nchw_layer, 32, profile) == "conv:pointwise_nchw"
    assert layer_kind(cl_layer, 32, profile) == "conv:pointwise"
    assert layer_kind(nchw_layer, 8, profile) == layer_kind(cl_layer, 8, profile) == "conv:pointwise_gemm"

    def ms(cost, layer, p, batch):
        return {lay.name: t for lay, t, _ in predict_layers_ms(cost, p, batch)}[layer.name]
    work_ms = 2 * 96 * 96 * 28 * 28 * 32 / (GFLOPS * 1e6)  # 32 images
    assert ms(plain, cl_layer, profile, 32) == pytest.approx(0.020 + work_ms, rel=0.05)
    assert ms(shuffled, nchw_layer, profile, 32) == pytest.approx(0.020 + 2 * work_ms, rel=0.05)
    assert ms(shuffled, nchw_layer, profile, 8) == pytest.approx(ms(plain, cl_layer, profile, 8), rel=1e-6)
    # a profile without NCHW points (one of an earlier grid, or a small budget) reads the channels-last ones
    assert ms(shuffled, nchw_layer, synthetic_profile(), 32) == pytest.approx(ms(plain, cl_layer, profile, 32),
                                                                              rel=0.01)


def test_the_grid_s_later_shapes_are_what_their_classes_need():
    # strided grouped at oneDNN's block of 16 channels per group; pointwise at the large batch at 28+ pixels
    assert all(stride == 2 and cin // groups == 16 for cin, _, _, stride, groups, _ in STRIDED_GROUPED)
    assert all(shape in CONV_GRID for shape in STRIDED_GROUPED + LARGE_POINTWISE_GRID + LARGE_DEPTHWISE_GRID)
    # depthwise at the batch whose activations reach the 70-150 MB that networks' k3 and k5 layers move at 64
    assert all(groups == cin for cin, _, _, _, groups, _ in LARGE_DEPTHWISE_GRID)
    assert {kernel for _, _, kernel, *_ in LARGE_DEPTHWISE_GRID} == {3, 5}
    assert all(70e6 <= LARGE_DEPTHWISE_BATCH * cin * (in_hw**2 + (in_hw // stride) ** 2) * 4 <= 160e6
               for cin, _, _, stride, _, in_hw in LARGE_DEPTHWISE_GRID)
    for grid in (LARGE_POINTWISE_GRID, POINTWISE_NCHW_GRID):
        assert all(kernel == 1 and stride == 1 and groups == 1 for _, _, kernel, stride, groups, _ in grid)
    assert all(in_hw >= 28 for *_, in_hw in LARGE_POINTWISE_GRID)
    # every NCHW pointwise point runs on oneDNN, the only backend whose class they make
    assert all(conv_backend(cin, (1, 1), (1, 1), (1, 1), 1, batch, (in_hw,) * 2, 1) == "mkldnn"
               for cin, _, _, _, _, in_hw in POINTWISE_NCHW_GRID for batch in POINTWISE_NCHW_BATCHES)


def test_a_convolution_run_as_a_gemm_pays_the_fixed_cost_of_its_own_backend_by_hand():
    # A device where a convolution run as a GEMM per image (1x1 below batch 16 on one thread: "slow2d")
    # costs 7 us a call and a oneDNN one 20: the GEMM's is the intercept of calibration's own slow2d points.
    gemm_fixed = 7.0
    points = tuple({**p, "us": p["us"] - 20.0 + gemm_fixed} if p["backend"] == "slow2d" else p
                   for p in synthetic_conv())
    profile = synthetic_profile(conv=points)
    assert timemodel._gemm_conv_call_us(profile) == pytest.approx(gemm_fixed)
    assert timemodel._gemm_conv_call_us(synthetic_profile()) == pytest.approx(20.0)  # the same as oneDNN's there
    pointwise = analyse(nn.Sequential(nn.Conv2d(64, 256, 1, bias=False)), (64, 14, 14))  # a grid shape
    dense = analyse(nn.Sequential(nn.Conv2d(64, 64, 3, padding=1, bias=False)), (64, 14, 14))
    backends = set()
    for batch in (1, 4, 8):  # 4: between the batches calibration timed, where the fixed cost no longer cancels
        (pw,) = predict_layers_ms(pointwise, profile, batch)[1:2]
        assert pw[0].op == "conv2d" and layer_kind(pw[0], batch, profile) == "conv:pointwise_gemm"
        assert pw[1] * 1e3 == pytest.approx(gemm_fixed + pw[0].flops_at(batch) / (GFLOPS * 1e3), rel=1e-3)
        (dn,) = predict_layers_ms(dense, profile, batch)[1:2]  # a 3x3 one pays its backend's
        fixed = gemm_fixed if timemodel._conv_shape(dn[0], batch, profile).backend == "slow2d" else 20.0
        assert dn[1] * 1e3 == pytest.approx(fixed + dn[0].flops_at(batch) / (GFLOPS * 1e3), rel=1e-3)
        backends.add(fixed)
    assert backends == {gemm_fixed, 20.0}  # both kinds of 3x3 convolution were priced
    # a pair that the noise reversed (slower at one image than at eight) is left out; no pairs, no GEMM price
    reversed_pair = tuple({**p, "us": 500.0 if p["batch"] == 1 else 100.0} if p["backend"] == "slow2d" else p
                          for p in synthetic_conv())
    assert timemodel._gemm_conv_call_us(synthetic_profile(conv=reversed_pair)) is None
    only_onednn = tuple(p for p in synthetic_conv() if p["backend"] != "slow2d")
    assert timemodel._gemm_conv_call_us(synthetic_profile(conv=only_onednn)) is None


def test_a_bias_costs_a_gemm_convolution_a_pass_over_each_image_s_output_by_hand(profile):
    # Calibration times convolutions without a bias; a folded BatchNorm leaves one. Run as a GEMM per image,
    # the bias is a fill of each image's output that the GEMM then adds into: the "add" curve at one image's
    # output less the curve's floor, per image. oneDNN fuses it: nothing.
    image_out = 256 * 16 * 16 * 4  # a calibrated curve size, where the curve is exact
    assert image_out in [size for size, _ in profile.curves["add"]]
    floor = profile.curves["add"][0][1]
    per_image_us = CALL_US + image_out * US_PER_BYTE - floor
    costs = {bias: analyse(nn.Sequential(nn.Conv2d(64, 256, 1, bias=bias)), (64, 16, 16)) for bias in (False, True)}
    for batch, backend in ((1, "slow2d"), (8, "slow2d"), (16, "mkldnn")):
        (plain,), (biased,) = (predict_layers_ms(costs[bias], profile, batch)[1:2] for bias in (False, True))
        assert timemodel._conv_shape(biased[0], batch, profile).backend == backend
        expected = batch * per_image_us if backend == "slow2d" else 0.0
        assert (biased[1] - plain[1]) * 1e3 == pytest.approx(expected, abs=1e-6)


def test_a_grouped_convolution_counts_whole_blocks_of_input_channels_by_hand():
    # A device where grouped work runs at GFLOPS on each group's input channels rounded up to oneDNN's block of
    # 16, as this CPU's did: 4 and 8 channels per group cost as 16, 24 as 32; 48 is three whole blocks.
    def grouped_point(cin, groups, in_hw, batch):
        block = -(-(cin // groups) // 16) * 16
        return {"cin": cin, "cout": cin, "kernel": 3, "stride": 1, "groups": groups, "in_hw": in_hw, "out_hw": in_hw,
                "batch": batch, "backend": "mkldnn", "faults": 0,
                "us": 20.0 + 2 * cin * block * 9 * in_hw * in_hw * batch / (GFLOPS * 1e3)}
    points = [grouped_point(cin, cin // width, in_hw, batch) for cin, width, in_hw in
              ((48, 8, 56), (128, 16, 28), (384, 48, 14)) for batch in (1, 8, LARGE_CONV_BATCH)]
    plain = tuple(c for c in synthetic_conv() if c["groups"] in (1, c["cin"]))
    profile = synthetic_profile(conv=plain + tuple(points), conv_weight_us_per_mib=0.0)
    for width, block in ((4, 16), (8, 16), (24, 32), (48, 48)):
        cost = analyse(nn.Sequential(nn.Conv2d(192, 192, 3, padding=1, groups=192 // width, bias=False)),
                       (192, 28, 28))
        (layer,) = [layer for layer in cost.layers if layer.op == "conv2d"]
        assert layer_kind(layer, 8, profile) == "conv:grouped"
        ms = {lay.name: t for lay, t, _ in predict_layers_ms(cost, profile, 8)}[layer.name]
        by_hand_ms = 0.020 + 2 * 192 * block * 9 * 28 * 28 * 8 / (GFLOPS * 1e6)  # padded FLOPs, 8 images
        assert ms == pytest.approx(by_hand_ms, rel=0.02), width


def test_an_ungrouped_convolution_pays_whole_blocks_of_output_channels_only_by_hand(profile):
    # The synthetic device runs every calibrated shape (all on multiples of 16 channels) at GFLOPS, so a
    # prediction is the 20 us call plus the FLOPs the model counts: output channels rounded up to oneDNN's
    # block of 16, input channels as they are (69 -> 64 costs 69/64 of 64 -> 64, 64 -> 69 as 64 -> 80).
    for cin, cout, counted_cout in ((69, 64, 64), (64, 69, 80), (69, 69, 80), (24, 24, 32)):
        cost = analyse(nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False)), (cin, 56, 56))
        (layer,) = [layer for layer in cost.layers if layer.op == "conv2d"]
        assert layer_kind(layer, 8, profile) == "conv:conv"
        ms = {lay.name: t for lay, t, _ in predict_layers_ms(cost, profile, 8)}[layer.name]
        by_hand_ms = 0.020 + 2 * counted_cout * cin * 9 * 56 * 56 * 8 / (GFLOPS * 1e6)
        assert ms == pytest.approx(by_hand_ms, rel=0.02), (cin, cout)


def test_time_grows_with_batch_and_threads_change_the_backend(profile, digits_cost):
    times = [predict_batch_ms(digits_cost, profile, b) for b in (1, 2, 8, 32)]
    assert times == sorted(times)
    per_image = [t / b for t, b in zip(times, (1, 2, 8, 32), strict=True)]
    assert per_image[0] > per_image[-1]  # fixed costs amortised


def test_container_calls_are_counted():
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(3, 3, 1), nn.ReLU())

        def forward(self, x):
            return self.body(x)

    cost = analyse(nn.Sequential(Block(), Block()), (3, 8, 8))
    modules = timemodel._modules_layer(cost)
    assert modules.shape["calls"] == 1 + 2 + 2  # the model; 0, 1; 0.body, 1.body


@pytest.mark.parametrize(("call", "match"), [
    (lambda c, p: predict_batch_ms(c, p, 0), "positive integer"),
    (lambda c, p: predict_batch_ms(c, p, 2, precision="bf16"), "precision"),
    (lambda c, p: predict_batch_ms(c, object(), 2), "DeviceProfile"),
])
def test_bad_arguments(call, match, profile, digits_cost):
    with pytest.raises(ConfigError, match=match):
        call(digits_cost, profile)


def test_peak_memory_adds_the_pixels(digits_cost):
    assert predict_peak_memory_bytes(digits_cost, 4) == digits_cost.peak_memory_bytes(4) + 4 * 3 * 32 * 32


# --- page faults: the allocator replay -----------------------------------------------------------------------


def test_heap_maps_large_chunks_and_reuses_freed_memory():
    heap = heap_replay.Heap(32 << 20, settled=False)
    big = heap.malloc(8 << 20)       # above the starting threshold: mapped, every page faults
    assert heap.faulted == 8 << 20
    heap.free(big)                   # ... and the threshold rises past it
    again = heap.malloc(8 << 20)     # now from the heap: grows into fresh pages once
    heap.free(again)
    heap.faulted = 0
    for _ in range(3):
        heap.free(heap.malloc(8 << 20))
    assert heap.faulted == 0         # reused, not trimmed (the free top is below twice the threshold)


def test_heap_trims_a_large_free_top_and_faults_again():
    heap = heap_replay.Heap(32 << 20)  # settled: mmap threshold 32 MiB, trim threshold 64 MiB
    chunks = [heap.malloc(24 << 20) for _ in range(3)]
    for chunk in chunks:
        heap.free(chunk)             # 72 MiB free on top: trimmed
    heap.faulted = 0
    heap.free(heap.malloc(24 << 20))
    assert heap.faulted == (24 << 20) - heap_replay.GLIBC_TOP_PAD  # all but the pad kept at the top
    huge = heap.malloc(100 << 20)    # beyond the mapped top and above the threshold: a fresh mapping
    assert heap.faulted == (124 << 20) - heap_replay.GLIBC_TOP_PAD
    heap.free(huge)


class ResidualSE(nn.Module):
    """A residual block with squeeze-excitation and a concatenation: the shapes the replay must connect."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(8, 8, 3, padding=1)
        self.b = nn.Conv2d(8, 8, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.gate = nn.Conv2d(8, 8, 1)
        self.c = nn.Conv2d(8, 4, 1)
        self.d = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        x = self.a(x)
        y = self.b(x)
        y = y * torch.sigmoid(self.gate(self.pool(y)))
        y = y + x
        return torch.cat([self.c(y), self.d(y)], 1)


def test_inputs_are_reconstructed_from_shapes():
    cost = analyse(ResidualSE(), (8, 6, 6))
    inputs, outputs = heap_replay.resolve_inputs(cost.layers)
    by_name = {layer.name: i for i, layer in enumerate(cost.layers)}
    produced_by = {id(t): cost.layers[i].name for i, t in enumerate(outputs) if t is not None}
    def names(layer):
        return sorted(produced_by.get(id(t), "?") for t in inputs[by_name[layer]])
    assert names("mul") == sorted(["b", "sigmoid"])   # the gate and the feature map it scales
    assert names("add") == sorted(["mul", "a"])       # the residual: the block's input, not a neighbour
    assert names("cat") == sorted(["c", "d"])         # the branches


def test_faults_appear_only_at_large_batches(digits_cost):
    profile = synthetic_profile(fault_us_per_page=1.0)
    layers = (timemodel._normalise_layer(digits_cost), *digits_cost.layers, timemodel._heads_layer(digits_cost))
    assert sum(timemodel._faulted_bytes(layers, 8, 1.0, profile)) == 0
    faulted = timemodel._faulted_bytes(layers, 4096, 1.0, profile)  # 16 MiB per conv output: heap and maps
    assert sum(faulted) > 0
    with_faults = predict_batch_ms(digits_cost, profile, 4096, allocator="glibc")  # glibc's defaults
    assert with_faults > predict_batch_ms(digits_cost, synthetic_profile(), 4096, allocator="glibc")
    assert with_faults - predict_batch_ms(digits_cost, synthetic_profile(), 4096) == pytest.approx(
        sum(faulted) / 4096 * 1.0 / 1e3, rel=1e-6)


# --- measuring -----------------------------------------------------------------------------------------------


def test_measure_batch_ms_times_the_sidecar_stage():
    model = DigitsCNN()
    ms, spread = measure_batch_ms(model, (3, 32, 32), 4, repeats=3, warmup=1)
    assert ms > 0 and spread >= 0
    with pytest.raises(ConfigError, match="RGB"):
        measure_batch_ms(model, (1, 32, 32), 4, repeats=1, warmup=0)
    with pytest.raises(ConfigError, match="ModelRunner"):
        measure_batch_ms(object(), (3, 32, 32), 4, repeats=1, warmup=0)


def test_measure_layers_ms_names_layers_as_analyse_does(digits_cost):
    measured = measure_layers_ms(DigitsCNN(), (3, 32, 32), 2, repeats=1)
    assert {layer.name for layer in digits_cost.layers} <= set(measured)
    assert {NORMALISE_LAYER, HEADS_LAYER} <= set(measured)
    assert all(ms >= 0 for ms in measured.values())


def test_validate_reports_errors_mape_and_repeatability(profile):
    result = validate("digits", [1, 8], profile, module=DigitsCNN(), input_shape=(3, 32, 32), repeats=2,
                      warmup=1, sweeps=2, layers_at=2)
    assert [p["batch_size"] for p in result["points"]] == [1, 8]
    for point in result["points"]:
        # rounded to 3 decimals in the report
        assert point["error"] == pytest.approx((point["predicted_ms"] - point["measured_ms"]) / point["measured_ms"],
                                               rel=0.01, abs=2e-3)
        assert len(point["sweeps_ms"]) == 2 and point["measured_ms"] == min(point["sweeps_ms"])
    errors = [abs(p["error"]) for p in result["points"]]
    assert result["mape"] == pytest.approx(100 * sum(errors) / 2, abs=0.02)
    assert result["mape_ge8"] == pytest.approx(100 * errors[1], abs=0.02)
    assert result["repeatability"]["sweeps"] == 2 and result["repeatability"]["mean_pct"] >= 0
    assert result["layers"] and {"name", "predicted_ms", "measured_ms", "bound"} <= set(result["layers"][0])
    assert math.isfinite(result["seconds"]) and len(result["load"]) == 2
    with pytest.raises(ConfigError, match="batch_sizes"):
        validate("digits", [0], profile, module=DigitsCNN(), input_shape=(3, 32, 32))


def test_layer_cost_helpers_for_pseudo_layers(digits_cost):
    normalise = timemodel._normalise_layer(digits_cost)
    assert isinstance(normalise, LayerCost) and normalise.input_bytes == 3 * 32 * 32
    assert timemodel._heads_layer(digits_cost).shape["numel"] == 10


# --- weights a large network pushes out of the cache ----------------------------------------------------------


def test_weights_a_large_network_pushed_out_of_the_cache_cost_the_probes_penalty_by_hand():
    # 144 MiB of weights in the first layer: a forward moves more than the probe's last point, so the second
    # layer (6 MiB of weights, less than what calibration wrote before timing it: 16 MiB, the probe's first
    # point less its own weights) pays the whole penalty; the first, whose own weights already overflowed
    # calibration's cache, pays nothing more.
    cost = analyse(nn.Sequential(nn.Linear(6144, 6144), nn.ReLU(), nn.Linear(6144, 256)), (6144,))
    small = 6144 * 256 * 4 + 256 * 4
    assert cost.layers[2].weight_bytes == small
    warm, cold = synthetic_profile(), synthetic_profile(weight_warmth=WARMTH)
    per_byte_at_64 = 800.0 / (8 * MIB)
    for batch, per_byte in ((1, 400.0 / (8 * MIB)), (8, 600.0 / (8 * MIB)), (64, per_byte_at_64),
                            (90, per_byte_at_64 * (1 - math.log2(90 / 64))), (128, 0.0), (256, 0.0)):
        before = predict_layers_ms(cost, warm, batch)
        after = predict_layers_ms(cost, cold, batch)
        extra_us = [(b[1] - a[1]) * 1e3 for a, b in zip(before, after, strict=True)]
        assert [row[0].name for row in after[1:4]] == [layer.name for layer in cost.layers]  # after <normalise>
        assert extra_us[3] == pytest.approx(small * per_byte, rel=1e-6, abs=1e-9)
        assert extra_us[1] == pytest.approx(0.0, abs=1e-9)  # the first linear layer
        assert sum(extra_us) == pytest.approx(extra_us[3], abs=1e-9)  # nothing else
    # on its own (6 MiB of weights and a few KiB moved per forward) the small layer keeps its calibrated time
    alone = analyse(nn.Sequential(nn.Linear(6144, 256)), (6144,))
    assert predict_batch_ms(alone, cold, 8) == pytest.approx(predict_batch_ms(alone, warm, 8))


def test_the_share_of_the_cold_penalty_follows_the_probes_curve_by_hand():
    warmth = timemodel._Warmth.of(WARMTH)
    assert warmth.pollution == pytest.approx(16 * MIB)
    assert warmth.share(10 * MIB) == 0.0 and warmth.share(40 * MIB) == 0.0
    assert warmth.share(56 * MIB) == pytest.approx(0.5 * math.log(56 / 40) / math.log(72 / 40))
    assert warmth.share(104 * MIB) == pytest.approx(0.5 + 0.5 * math.log(104 / 72) / math.log(136 / 72))
    assert warmth.share(1 << 40) == 1.0
    # a layer of 56 MiB at one row in a forward moving 136 MiB: calibration had put 16 + 56 = 72 MiB through
    # the cache, half the penalty; the other half is left
    assert warmth.extra_us(56 * MIB, 1, 136 * MIB) == pytest.approx(56 * MIB * 400.0 / (8 * MIB) * 0.5)
    # a noisy curve never goes back down; no probe, or one no slower when cold, prices nothing
    bumpy = {**WARMTH, "curve": ((24.0 * MIB, 1000.0), (40.0 * MIB, 900.0), (72.0 * MIB, 1500.0),
                                 (136.0 * MIB, 2000.0))}
    assert timemodel._Warmth.of(bumpy).share(40 * MIB) == 0.0
    assert timemodel._Warmth.of({}) is None
    assert timemodel._Warmth.of({**WARMTH, "curve": ((24.0 * MIB, 1000.0), (136.0 * MIB, 990.0))}) is None


def test_a_convolution_pays_the_one_row_penalty_once_per_call_whatever_the_batch():
    # 9 MiB of convolution weights behind 147 MiB of linear ones: a forward moves more than the probe's last
    # point, and calibration had put 16 + 9 MiB through the cache (no share of the curve), so the convolution
    # pays the whole penalty at one row, 400 us per 8 MiB, once per call: the same at batch 1 and batch 64
    cost = analyse(nn.Sequential(nn.Conv2d(512, 512, 3, padding=1, bias=False), nn.Flatten(),
                                 nn.Linear(512 * 49, 1536)), (512, 7, 7))
    warm, cold = synthetic_profile(), synthetic_profile(weight_warmth=WARMTH)
    weights = 512 * 512 * 9 * 4
    for batch in (1, 8, 64):
        before, after = predict_layers_ms(cost, warm, batch), predict_layers_ms(cost, cold, batch)
        (conv,) = [i for i, (layer, _, _) in enumerate(before) if layer.op == "conv2d"]
        assert (after[conv][1] - before[conv][1]) * 1e3 == pytest.approx(weights * 400.0 / (8 * MIB), rel=1e-6)
    # a small network's convolutions keep their calibrated time: its forward moves less than calibration did
    small = analyse(nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU()), (64, 14, 14))
    assert predict_batch_ms(small, cold, 8) == pytest.approx(predict_batch_ms(small, warm, 8))


def test_the_weight_warmth_probe_times_one_linear_layer_after_more_and_more_writing(monkeypatch):
    from spark_cnn.perf_tools.calibration import gemm_bench

    monkeypatch.setattr(gemm_bench, "WARMTH_STEPS", 2)
    monkeypatch.setattr(gemm_bench, "WARMTH_REPEATS", 1)
    monkeypatch.setattr(gemm_bench, "pollute_bytes", lambda: 1 << 20)
    with torch.inference_mode():
        warmth = gemm_bench.time_weight_warmth(Bench(torch.device("cpu"), Budget(60.0)))
    weights = (768 * 3072 + 3072) * 4
    assert warmth["weight_bytes"] == weights
    assert [b for b, _ in warmth["curve"]] == [weights + (1 << 20), weights + (2 << 20)]
    assert all(us > 0 for _, us in warmth["curve"])
    assert [rows for rows, _ in warmth["cold_extra"]] == list(gemm_bench.WARMTH_ROWS)
    profile = synthetic_profile(weight_warmth=warmth)
    assert DeviceProfile.from_json(profile.to_json()) == profile  # kept in the profile as measured


# --- warm calls (call_warmth_bench) --------------------------------------------------------------------------

def test_the_warm_share_follows_the_probes_curve_by_hand():
    warm = timemodel._CallWarmth.of(CALL_WARMTH)
    assert warm.share(0) == pytest.approx(0.45) and warm.share(100) == pytest.approx(0.45)
    assert warm.share(128 * KIB) == pytest.approx(0.45)  # never below a point before it
    assert warm.share(1 * MIB) == pytest.approx(0.5 + 0.3 * math.log(2) / math.log(4))
    assert warm.share(8 * MIB) == 1.0 and warm.share(1 << 40) == 1.0  # never above calibration
    assert timemodel._CallWarmth.of({}) is None
    assert timemodel._CallWarmth.of({**CALL_WARMTH, "cold_us": 0.0}) is None


def test_calls_bound_by_their_overhead_take_the_share_of_what_the_layer_before_moved_by_hand():
    # 16 channels of 14 x 14: every layer is bound by its call overhead on the synthetic device
    cost = analyse(nn.Sequential(nn.Conv2d(16, 16, 1), nn.ReLU(inplace=True), nn.BatchNorm2d(16)), (16, 14, 14))
    cold, warm = synthetic_profile(), synthetic_profile(call_warmth=CALL_WARMTH)
    probe = timemodel._CallWarmth.of(CALL_WARMTH)
    assert cost.dtype_bytes == 4
    for batch in (1, 8, 64):
        before, after = predict_layers_ms(cost, cold, batch), predict_layers_ms(cost, warm, batch)
        moved = 0.0  # the first call follows nothing the model counts
        for (layer, cold_ms, bound), (same, warm_ms, _) in zip(before, after, strict=True):
            assert same.name == layer.name
            share = probe.share(moved) if bound == "overhead" else 1.0
            assert warm_ms == pytest.approx(cold_ms * share, rel=1e-9)
            moved = layer.weight_bytes + batch * (layer.input_bytes + layer.output_bytes)  # fp32: as counted
        assert sum(ms for _, ms, _ in after) < sum(ms for _, ms, _ in before)
    # one image moves 12.5 KiB per layer: all at the chain's warmest share
    rows = predict_layers_ms(cost, warm, 1)
    base = predict_layers_ms(cost, cold, 1)
    assert [b for _, _, b in rows].count("overhead") == len(rows)
    assert [w / c for (_, w, _), (_, c, _) in zip(rows[1:], base[1:], strict=True)] == pytest.approx([0.45] * 5)


def test_calls_after_a_layer_that_moved_more_than_the_probe_cost_as_calibrated():
    # 64 channels of 112 x 112 at batch 8: 25 MiB per layer, beyond the probe's last point; the convolution,
    # bound by its work, is never scaled
    cost = analyse(nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(inplace=True)), (64, 112, 112))
    cold, warm = synthetic_profile(), synthetic_profile(call_warmth=CALL_WARMTH)
    assert predict_layers_ms(cost, warm, 8)[2][1] == pytest.approx(predict_layers_ms(cost, cold, 8)[2][1])
    assert predict_layers_ms(cost, warm, 8)[1][1] == pytest.approx(predict_layers_ms(cost, cold, 8)[1][1])


def test_the_call_warmth_probe_times_its_chain_as_calibration_and_running(monkeypatch):
    from spark_cnn.perf_tools.calibration import call_warmth_bench

    monkeypatch.setattr(call_warmth_bench, "CALL_WARMTH_TRAFFIC", (0, 1 << 20))
    monkeypatch.setattr(call_warmth_bench, "CALL_WARMTH_REPEATS", 1)
    bench = Bench(torch.device("cpu"), Budget(60.0))
    with torch.inference_mode():
        warmth = call_warmth_bench.time_call_warmth(bench)
    assert warmth["layers"] == len(call_warmth_bench.call_warmth_chain(bench)) == 6 * len(
        call_warmth_bench.CALL_WARMTH_WIDTHS)
    assert warmth["cold_us"] > 0
    assert [b for b, _ in warmth["curve"]] == [0.0, float(1 << 20)] and all(us > 0 for _, us in warmth["curve"])
    profile = synthetic_profile(call_warmth=warmth)
    assert DeviceProfile.from_json(profile.to_json()) == profile  # kept in the profile as measured
    assert timemodel._CallWarmth.of(profile.call_warmth) is not None
