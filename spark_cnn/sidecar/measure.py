"""`python -m spark_cnn.sidecar.measure`: time the sidecar's compute stage for one model at one batch size, in
this process, and print the result as one JSON line.

Validation (`spark_cnn.perf_tools.validate`) starts it once per point with the sidecar's environment
(`spark_cnn.task.sidecar_env.sidecar_environment`), so what is timed is what a sidecar serving that batch size
runs: the sidecar's own ModelRunner (layout, heads and all, random weights), its `forward` called from a
service thread, with the sidecar's malloc settings and thread count. Timing follows
`spark_cnn.models.timing.time_batches`.

    python -m spark_cnn.sidecar.measure --model resnet18 --batch 8 --threads 1
    {"ms": 266.1, "spread": 0.004, "allocator": "retained"}

A SparkCnnError ends it with exit status 2 and {"error": <class name>, "message": ...} on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from spark_cnn.errors import SparkCnnError
from spark_cnn.models import timing
from spark_cnn.models.spec import DEFAULT_TOP_K, Endpoint
from spark_cnn.sidecar.runner import ModelRunner
from spark_cnn.task.sidecar_env import allocator_of

__all__ = ["measure_model", "measure_runner_ms", "main"]

EXIT_ERROR = 2


def measure_runner_ms(runner: ModelRunner, input_shape: Sequence[int], batch: int, *,
                      repeats: int = timing.DEFAULT_REPEATS, warmup: int = timing.DEFAULT_WARMUP,
                      point_budget_s: float | None = timing.DEFAULT_POINT_BUDGET_S,
                      clock: str = "wall") -> tuple[float, float]:
    """(minimum ms, spread) of `runner.forward` on a staged batch of `batch` random images of `input_shape`
    (3, H, W), in the calling thread; on CUDA each call waits for the device."""
    timing.check_options(repeats=repeats, warmup=warmup, clock=clock)
    timing.settle_allocator()
    staged = runner.upload(timing.random_pixels(input_shape, batch))

    def run() -> Any:
        pending = runner.forward(staged)
        if runner.cuda:
            torch.cuda.synchronize(runner.device)
        return pending
    return timing.time_batches(run, repeats=repeats, warmup=warmup, point_budget_s=point_budget_s, clock=clock)


def measure_model(model: str, input_shape: Sequence[int], batch: int, *, threads: int,
                  **options: Any) -> dict[str, Any]:
    """{"ms", "spread", "allocator"}: the sidecar's ModelRunner for `model` (random weights) on the CPU with
    `threads` torch threads, timed in a service thread as the sidecar computes (`options`: measure_runner_ms's)."""
    torch.set_num_threads(threads)
    endpoint = Endpoint(source=model, weights=None, preprocessing=timing.preprocessing_for(input_shape),
                        top_k=DEFAULT_TOP_K)
    runner = ModelRunner(endpoint, torch.device("cpu"))
    ms, spread = _in_thread(lambda: measure_runner_ms(runner, input_shape, batch, **options))
    return {"ms": ms, "spread": spread, "allocator": allocator_of()}


def _in_thread(work: Callable[[], Any]) -> Any:
    """`work()` in a thread of its own, as the sidecar's service runs forwards; its error re-raised here."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = work()
        except BaseException as e:  # re-raised in the caller's thread
            outcome["error"] = e

    thread = threading.Thread(target=target, name="measure-compute")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


def _shape(text: str) -> tuple[int, ...]:
    return tuple(int(d) for d in text.split(","))


def _budget(text: str) -> float | None:
    return None if text == "none" else float(text)


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m spark_cnn.sidecar.measure",
                                     description="Time the sidecar's compute stage for one model and batch size.")
    parser.add_argument("--model", required=True, help="torchvision model name, TorchScript file, or module:factory")
    parser.add_argument("--input-shape", type=_shape, default=(3, 224, 224), help="one image, C,H,W")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", type=int, required=True, help="torch threads")
    parser.add_argument("--repeats", type=int, default=timing.DEFAULT_REPEATS)
    parser.add_argument("--warmup", type=int, default=timing.DEFAULT_WARMUP)
    parser.add_argument("--point-budget-s", type=_budget, default=timing.DEFAULT_POINT_BUDGET_S,
                        help="seconds of timed calls at most, or 'none'")
    parser.add_argument("--clock", choices=sorted(timing.CLOCKS), default="wall")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        result = measure_model(args.model, args.input_shape, args.batch, threads=args.threads, repeats=args.repeats,
                               warmup=args.warmup, point_budget_s=args.point_budget_s, clock=args.clock)
    except SparkCnnError as e:
        print(json.dumps({"error": type(e).__name__, "message": str(e)}), flush=True)
        return EXIT_ERROR
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
