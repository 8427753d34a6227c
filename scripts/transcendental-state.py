"""Is this CPU in the state where isolated transcendental operators run slow, and does a GEMM before each call
bring them back? (docs/perf-model.md, "Transcendental kinds after heavy work")

Every ~2 s for --seconds, in one process on one thread: sigmoid on 32K floats (its best of 50: ~11 us on the
project's Xeon guest when fast, ~40 when slow), then silu, sigmoid and gelu against relu on a (1, 64, 56, 56)
channels-last tensor as calibration times them (cache written over, inputs made fresh, median of 40): once
isolated, as calibration did before commit 5629aff, and once with a small GEMM before each call, as
curve_bench does now.

    .venv/bin/python scripts/transcendental-state.py --seconds 20
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn


def _best_us(fn, calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to sample (default 20)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    with torch.inference_mode():
        probe, probe_out = torch.rand(32768) - 0.5, torch.empty(32768)
        scratch = torch.empty(4 << 20).fill_(1.0)  # 16 MB written over before each call
        gemm, rows = nn.Linear(256, 256).eval(), torch.rand(16, 256)
        source = torch.rand(1, 64, 56, 56).contiguous(memory_format=torch.channels_last) - 0.5
        kinds = {"relu": nn.ReLU(inplace=True), "silu": nn.SiLU(inplace=True), "sigmoid": nn.Sigmoid(),
                 "gelu": nn.GELU()}

        def median_us(module: nn.Module, after_gemm: bool) -> float:
            times = []
            for _ in range(40):
                scratch.mul_(1.0)
                if after_gemm:
                    gemm(rows)
                x = source * 1.0
                start = time.perf_counter()
                module(x)
                times.append(time.perf_counter() - start)
            return statistics.median(times) * 1e6

        end = time.perf_counter() + args.seconds
        while time.perf_counter() < end:
            state = _best_us(lambda: torch.sigmoid(probe, out=probe_out), 50)
            row = [f"sigmoid 32K {state:5.1f} us"]
            for after_gemm in (False, True):
                us = {kind: median_us(module, after_gemm) for kind, module in kinds.items()}
                ratios = ", ".join(f"{kind} {us[kind] / us['relu']:.1f}x" for kind in ("silu", "sigmoid", "gelu"))
                row.append(f"{'after a GEMM' if after_gemm else 'isolated'}: relu {us['relu']:.0f} us, {ratios}")
            print(" | ".join(row), flush=True)
            time.sleep(max(0.0, min(2.0, end - time.perf_counter())))


if __name__ == "__main__":
    main()
