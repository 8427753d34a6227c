"""A synthetic device profile whose every measurement follows a simple law (every convolution and GEMM at 100
GFLOP/s, curves at 10 GB/s + 5 us per call), and probe tables for it, so the time model's predictions can be
checked by hand. Shared by the perf, sidecar and CLI tests."""

from __future__ import annotations

import torch

from spark_cnn.perf.profile import DeviceProfile, conv_backend
from spark_cnn.perf_tools.calibration import conv_bench as convolutions
from spark_cnn.perf_tools.calibration.conv_bench import CONV_BATCHES, LARGE_CONV_BATCH, POINTWISE_ONEDNN_BATCH
from spark_cnn.perf_tools.calibration.gemm_bench import GEMM_ROWS

GFLOPS = 100.0          # the synthetic device: 100 GFLOP/s in every convolution and GEMM
US_PER_BYTE = 1e-4      # elementwise curves: 10 GB/s
CALL_US = 5.0           # and 5 us per call
CURVE_KINDS = ("relu", "hardswish", "batch_norm", "add", "add_out", "max_pool2d_k3s2", "max_pool2d_k3s1",
               "max_pool2d_k2s2", "relu6", "silu", "hardsigmoid", "sigmoid", "gelu", "mul", "cat", "copy",
               "adaptive_avg_pool2d", "mean", "relu_out", "normalise", "heads")


def conv_us(cin, cout, kernel, stride, groups, in_hw, batch):
    """(output size, us) of one convolution on the synthetic device: a 20 us call plus its FLOPs at GFLOPS."""
    out_hw = (in_hw + 2 * (kernel // 2) - kernel) // stride + 1
    flops = 2 * cout * (cin // groups) * kernel * kernel * out_hw * out_hw * batch
    return out_hw, 20.0 + flops / (GFLOPS * 1e3)


def synthetic_conv(large_batch_speedup: float = 1.0) -> tuple[dict, ...]:
    """Convolutions at the batches calibration times them at (CONV_BATCHES; stride-1 pointwise also at
    POINTWISE_ONEDNN_BATCH; small outputs also at LARGE_CONV_BATCH), all at GFLOPS except the
    LARGE_CONV_BATCH points, whose work runs `large_batch_speedup` times faster."""
    conv = []
    for cin, cout, kernel, stride, groups in [(16, 16, 3, 1, 1), (64, 64, 3, 1, 1), (256, 256, 3, 1, 1),
                                              (64, 128, 3, 2, 1), (64, 256, 1, 1, 1), (256, 64, 1, 1, 1),
                                              (96, 96, 3, 1, 96), (3, 64, 7, 2, 1), (48, 48, 3, 1, 6)]:
        for in_hw in (14, 56):
            shape = (cin, cout, kernel, stride, groups, in_hw)
            batches = list(CONV_BATCHES)
            if kernel == 1 and groups == 1 and stride == 1:
                batches.append(POINTWISE_ONEDNN_BATCH)
            if convolutions._large_batch(*shape):
                batches.append(LARGE_CONV_BATCH)
            for batch in batches:
                out_hw, us = conv_us(*shape, batch)
                if batch == LARGE_CONV_BATCH:
                    us = 20.0 + (us - 20.0) / large_batch_speedup
                backend = conv_backend(cin, (kernel,) * 2, (stride,) * 2, (1, 1), groups, batch, (in_hw,) * 2, 1)
                conv.append({"cin": cin, "cout": cout, "kernel": kernel, "stride": stride, "groups": groups,
                             "in_hw": in_hw, "out_hw": out_hw, "batch": batch, "backend": backend, "us": us,
                             "faults": 0})
    return tuple(conv)


def synthetic_gemm(slow_rows: dict[int, float] | None = None) -> tuple[dict, ...]:
    """nn.Linear at every GEMM_ROWS count, at GFLOPS; `slow_rows`: rows -> how many times slower."""
    slow_rows = slow_rows or {}
    return tuple({"rows": r, "in_features": i, "out_features": o,
                  "us": 2 * r * i * o / (GFLOPS * 1e3) * slow_rows.get(r, 1.0)}
                 for r in GEMM_ROWS for i, o in ((256, 1000), (1024, 1000), (4096, 4096)))


def synthetic_profile(**changes) -> DeviceProfile:
    """A device where every measurement follows a simple law, so predictions can be checked by hand."""
    sizes = [4096.0 * 4**i for i in range(8)]
    curves = {kind: tuple((s, CALL_US + s * US_PER_BYTE) for s in sizes) for kind in CURVE_KINDS}
    conv = synthetic_conv()
    gemm = synthetic_gemm()
    fields = dict(key="synthetic", device="cpu", threads=1, created="2026-01-01T00:00:00+00:00",
                  device_name="synthetic", torch_version=torch.__version__, calibration_s=0.0, budget_s=0.0,
                  fault_us_per_page=0.0, mmap_threshold_bytes=32 << 20,
                  call_us={"module": 2.0, "function": 1.0, "container": 1.5}, curves=curves, conv=tuple(conv),
                  conv_call_us=20.0, conv_weight_us_per_mib=0.0, gemm=tuple(gemm), decode_ms=2.0)
    fields.update(changes)
    return DeviceProfile(**fields)


MIB = 1 << 20
# A probe of 8 MiB of weights no slower with up to 32 MiB of other data through the cache, half its penalty
# more at 64, all of it from 128 on; the whole penalty is 400 us at one row and 800 at 64.
WARMTH = {"weight_bytes": 8 * MIB,
          "curve": ((24.0 * MIB, 1000.0), (40.0 * MIB, 1000.0), (72.0 * MIB, 1500.0), (136.0 * MIB, 2000.0)),
          "cold_extra": ((1, 400.0), (64, 800.0))}

KIB = 1 << 10
# Calls that took 1000 us as calibration times them ran in 450 us in the chain with nothing written between
# them (400 with 128 KiB: noise, read as 450), 500 with 512 KiB, 800 with 2 MiB, slower than calibration with
# 8 MiB (read as calibrated: the harness gives every input fresh, the chain's had been written over).
CALL_WARMTH = {"layers": 48, "cold_us": 1000.0,
               "curve": ((0.0, 450.0), (128.0 * KIB, 400.0), (512.0 * KIB, 500.0), (2.0 * MIB, 800.0),
                         (8.0 * MIB, 1250.0))}
