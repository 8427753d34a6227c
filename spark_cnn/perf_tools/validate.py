"""Measure a model's real per-batch latency and compare it with the time model: per-point error, MAPE, the
measurement's own repeatability, and a per-layer report of where the prediction is wrong.

What is timed is what the time model predicts: the sidecar's compute stage for one batch (normalise uint8
NHWC pixels, the model, softmax and top-k), with the profile's thread count, under `torch.inference_mode`,
after warm-up, keeping the minimum of repeated calls (spark_cnn.models.timing), each batch size in a fresh
process (`python -m spark_cnn.sidecar.measure`, see validate()) that runs the sidecar's own ModelRunner in a
service thread, started with the sidecar's malloc settings (spark_cnn.task.sidecar_env): the layout, allocator
and thread the sidecar really uses.
Each batch size is measured in `sweeps` separate passes over all sizes; the point's measurement is the best
of them, and how much the sweeps disagree is the repeatability reported beside the MAPE. Models are built
with random weights (no downloads); time does not depend on the weights' values.

    spark-cnn validate --models resnet18,mobilenet_v3_small --batch-sizes 1,2,4,8,16,32,64

Beside the error it checks the tuner: the batch size the tuner picks from the predicted curve, and the
fraction of the best measured throughput of the sweep that it reaches (target >= PICK_TARGET).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from spark_cnn import errors
from spark_cnn.errors import ConfigError
from spark_cnn.models.heads import Predictor
from spark_cnn.models.spec import DEFAULT_TOP_K
from spark_cnn.models.tensors import flush_denormals, normalise
from spark_cnn.models.timing import (
    CLOCKS,
    DEFAULT_BATCH_SIZES,
    DEFAULT_POINT_BUDGET_S,
    DEFAULT_REPEATS,
    DEFAULT_SWEEPS,
    DEFAULT_WARMUP,
    check_options,
    preprocessing_for,
    random_pixels,
    settle_allocator,
    time_batches,
    timed,
)
from spark_cnn.models.vector_math_guard import guard_vector_math
from spark_cnn.perf.layers import DEFAULT_INPUT_SHAPE, ModelCost, analyse
from spark_cnn.perf.profile import DeviceProfile
from spark_cnn.perf.timemodel import HEADS_LAYER, NORMALISE_LAYER, predict_batch_ms, predict_layers_ms
from spark_cnn.perf.tuner import CurvePoint, choose_batch_size
from spark_cnn.perf_tools.calibration import calibrate
from spark_cnn.perf_tools.child_env import sidecar_child_env
from spark_cnn.task.sidecar_env import allocator_of, sidecar_environment

__all__ = ["DEFAULT_BATCH_SIZES", "LARGE_BATCH", "PICK_TARGET", "compare", "layer_report", "measure_batch_ms",
           "measure_isolated", "measure_layers_ms", "settle_allocator", "validate"]

# The targets docs/perf-model.md reports against: MAPE over batch >= 8 and over every size; the tuner's pick
# within 5% of the best measured throughput.
LARGE_BATCH = 8
PICK_TARGET = 0.95


def measure_batch_ms(module: nn.Module, input_shape: Sequence[int], batch: int, *,
                     repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP,
                     point_budget_s: float | None = DEFAULT_POINT_BUDGET_S, clock: str = "wall") -> tuple[float, float]:
    """(minimum ms, spread) of the sidecar's compute stage (normalise + module + heads, as ModelRunner.forward)
    on `batch` images of `input_shape` (3, H, W), in this process and thread. `spread` is (median - min) / min
    over the timed calls. At most `point_budget_s` of timed calls, at least MIN_REPEATS (or `repeats`, if
    fewer). `clock` as in spark_cnn.models.timing.CLOCKS ("cpu": this thread's CPU time). The sidecar's own
    ModelRunner is timed in a process of its own (validate(), `python -m spark_cnn.sidecar.measure`).

    >>> ms, spread = measure_batch_ms(nn.Sequential(nn.Conv2d(3, 8, 3), nn.Flatten()), (3, 32, 32), 2,
    ...                               repeats=3, warmup=1)
    >>> ms > 0 and spread >= 0
    True
    """
    check_options(repeats=repeats, warmup=warmup, clock=clock)
    if not isinstance(module, nn.Module):
        raise ConfigError(f"expected an nn.Module, got {type(module).__name__}; the sidecar's ModelRunner is "
                          "measured in its own process: validate(..., isolate=True) or "
                          "python -m spark_cnn.sidecar.measure")
    settle_allocator()
    staged = torch.from_numpy(random_pixels(input_shape, batch))
    prep = preprocessing_for(input_shape)
    guard_vector_math(module)  # as the sidecar's runner runs a CPU model
    predictor = Predictor(module.eval(), top_k=DEFAULT_TOP_K)

    def run() -> Any:
        with torch.inference_mode():
            return predictor.predict(normalise(staged, prep))
    return time_batches(run, repeats=repeats, warmup=warmup, point_budget_s=point_budget_s, clock=clock)


def measure_layers_ms(module: nn.Module, input_shape: Sequence[int], batch: int, *,
                      repeats: int = DEFAULT_REPEATS, clock: str = "wall") -> dict[str, float]:
    """Milliseconds per layer (minimum over `repeats` forwards, after two warm-up ones), named as
    `spark_cnn.perf.layers.analyse` names fx layers, plus NORMALISE_LAYER and HEADS_LAYER. `clock` as in
    spark_cnn.models.timing.CLOCKS.

    The module runs as its torch.fx graph, node by node, each node timed where it runs in the sequence (its
    input fresh from the layer before, as in a real forward). The graph runs the functional form of what it
    traced: `x += y` is an out-of-place add there.
    """
    check_options(repeats=max(repeats, 1), warmup=0, clock=clock)
    read = CLOCKS[clock]
    guard_vector_math(module)  # as the sidecar's runner runs a CPU model; the graph calls the same modules
    graph = torch.fx.symbolic_trace(module.eval())
    settle_allocator()
    pixels = torch.from_numpy(random_pixels(input_shape, batch))
    prep = preprocessing_for(input_shape)
    heads = Predictor(nn.Identity(), top_k=DEFAULT_TOP_K)
    best: dict[str, float] = {}

    class Timed(torch.fx.Interpreter):
        def run_node(self, node: torch.fx.Node) -> Any:
            if node.op not in ("call_module", "call_function", "call_method"):
                return super().run_node(node)
            start = read()
            result = super().run_node(node)
            elapsed = read() - start
            name = node.target if node.op == "call_module" else node.name
            while name in self.seen:  # a module called twice: analyse names the second call name_1
                self.count[name] = self.count.get(name, 0) + 1
                name = f"{name}_{self.count[name]}"
            self.seen.add(name)
            self.times[name] = elapsed
            return result

    def one_pass() -> dict[str, float]:
        flush_denormals()  # as the sidecar's runner computes
        interpreter = Timed(graph)
        interpreter.times, interpreter.seen, interpreter.count = {}, set(), {}
        with torch.inference_mode():
            start = read()
            images = normalise(pixels, prep)
            interpreter.times[NORMALISE_LAYER] = read() - start
            logits = interpreter.run(images)
            start = read()
            heads.predict(logits if isinstance(logits, torch.Tensor) else logits[0])
            interpreter.times[HEADS_LAYER] = read() - start
        return interpreter.times

    one_pass()
    one_pass()  # warm-up: kernels for these shapes, the allocator at this batch size
    for _ in range(max(repeats, 1)):
        for name, seconds in one_pass().items():
            best[name] = min(best.get(name, math.inf), seconds * 1e3)
    overhead = _interpreter_overhead_ms(Timed, read)
    return {name: max(ms - overhead, 0.0) if name not in (NORMALISE_LAYER, HEADS_LAYER) else ms
            for name, ms in best.items()}


def _interpreter_overhead_ms(interpreter: type, read: Any, nodes: int = 50, repeats: int = 5) -> float:
    """What running a node through the timing interpreter adds to the node (a few microseconds): a chain of
    in-place ReLUs on one element, through the interpreter and called directly."""
    chain = nn.Sequential(*[nn.ReLU(inplace=True) for _ in range(nodes)])
    graph = torch.fx.symbolic_trace(chain)
    x = torch.zeros(1)
    with torch.inference_mode():
        direct = min(timed(lambda: chain(x), read) for _ in range(repeats)) / nodes
        per_node = []
        for _ in range(repeats):
            probe = interpreter(graph)
            probe.times, probe.seen, probe.count = {}, set(), {}
            probe.run(x)
            per_node.append(sorted(probe.times.values())[nodes // 2])
    return max(min(per_node) - direct, 0.0) * 1e3


def layer_report(module: nn.Module, profile: DeviceProfile, batch: int, *, cost: ModelCost | None = None,
                 input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE, repeats: int = DEFAULT_REPEATS,
                 threads: int | None = None, clock: str = "wall") -> list[dict[str, Any]]:
    """Predicted against measured time per layer at `batch`, the largest absolute differences first: name,
    op, predicted_ms, measured_ms, error (relative), diff_ms, bound."""
    cost = cost or analyse(module, tuple(input_shape))
    with _threads(threads or profile.threads):
        measured = measure_layers_ms(module, input_shape, batch, repeats=repeats, clock=clock)
    rows = []
    for layer, ms, bound in predict_layers_ms(cost, profile, batch, allocator=allocator_of()):
        got = measured.get(layer.name)
        if got is None:
            continue
        rows.append({"name": layer.name, "op": layer.op, "predicted_ms": round(ms, 4), "measured_ms": round(got, 4),
                     "error": round((ms - got) / got, 4) if got > 0 else None, "diff_ms": round(ms - got, 4),
                     "bound": bound})
    rows.sort(key=lambda r: -abs(r["diff_ms"]))
    return rows


class _threads:
    """Run a block with `n` torch threads, restoring the previous count after."""

    def __init__(self, n: int):
        self.n = n

    def __enter__(self):
        self.previous = torch.get_num_threads()
        torch.set_num_threads(self.n)

    def __exit__(self, *exc):
        torch.set_num_threads(self.previous)


def _mape(relative: list[float]) -> float | None:
    return round(100 * sum(abs(e) for e in relative) / len(relative), 2) if relative else None


def validate(model_name: str, batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
             profile: DeviceProfile | None = None, *, input_shape: Sequence[int] = DEFAULT_INPUT_SHAPE,
             repeats: int = DEFAULT_REPEATS, warmup: int = DEFAULT_WARMUP, sweeps: int = DEFAULT_SWEEPS,
             point_budget_s: float | None = DEFAULT_POINT_BUDGET_S, module: nn.Module | None = None,
             layers_at: int | None = None, isolate: bool | None = None, clock: str = "wall") -> dict[str, Any]:
    """Predict and measure `model_name` (built as the sidecar builds it, random weights) at `batch_sizes`.

    With `isolate` (the default when the model is given by name), every point is measured in a new Python
    process that builds the model and runs only that batch size: a sidecar serving one batch size from its
    own process, started with the sidecar's environment (its malloc settings), running the sidecar's
    ModelRunner in a thread (`python -m spark_cnn.sidecar.measure`). In one process, what ran before (smaller
    batches, other models) changes how glibc's default allocator faults (docs/perf-model.md, "Validation").
    The prediction assumes the allocator of the process that measured (see allocator_of).
    `clock` "cpu" times the computing thread's CPU time instead of wall time: on a busy host, what an idle
    one would measure (give it a profile calibrated with the same clock).

    Returns {"model", "device", "threads", "points": [{batch_size, predicted_ms, measured_ms, error,
    sweeps_ms, spread}], "mape", "mape_ge8" (percent), "repeatability" (per-point spread between sweeps,
    percent: mean and max), "pick" (the tuner's batch size from the predicted curve and the fraction of the
    best measured throughput it reaches, overall and per sweep), "allocator", "load" (1-minute load average
    before and after), "seconds", "protocol"}; with `layers_at`, also "layers": the per-layer report at
    that batch size.
    """
    if not batch_sizes or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in batch_sizes):
        raise ConfigError(f"batch_sizes must be positive integers, got {batch_sizes!r}")
    if sweeps < 1:
        raise ConfigError(f"sweeps must be >= 1, got {sweeps}")
    profile = profile or calibrate("cpu")
    if clock == "cpu" and profile.threads != 1:
        raise ConfigError(f"clock 'cpu' times the calling thread: it needs one torch thread, not {profile.threads}")
    isolate = module is None if isolate is None else isolate
    if module is None:
        from spark_cnn.models.loader import build_module
        module = build_module(model_name)
    cost = analyse(module, tuple(input_shape))
    allocator = allocator_of(sidecar_environment()) if isolate else allocator_of()
    start, load_before = time.perf_counter(), os.getloadavg()[0]
    runs: dict[int, list[float]] = {b: [] for b in batch_sizes}
    spreads: dict[int, list[float]] = {b: [] for b in batch_sizes}
    options = {"repeats": repeats, "warmup": warmup, "point_budget_s": point_budget_s, "clock": clock}
    for _ in range(sweeps):
        for b in batch_sizes:
            if isolate:
                ms, spread, measured_with = measure_isolated(model_name, tuple(input_shape), b, profile.threads,
                                                             options)
                if measured_with != allocator:
                    raise RuntimeError(f"the measuring process ran with the {measured_with} allocator, "
                                       f"the prediction assumes {allocator}")
            else:
                with _threads(profile.threads):
                    ms, spread = measure_batch_ms(module, input_shape, b, **options)
            runs[b].append(ms)
            spreads[b].append(spread)
    result = {**compare(model_name, cost, profile, runs, spreads, allocator),
              "load": [round(load_before, 2), round(os.getloadavg()[0], 2)],
              "seconds": round(time.perf_counter() - start, 1),
              "protocol": {**options, "isolated": isolate, "measured": "min over sweeps of min over calls"}}
    if layers_at is not None:
        result["layers"] = layer_report(module, profile, layers_at, cost=cost, input_shape=input_shape,
                                        threads=profile.threads, clock=clock)
    return result


def compare(model_name: str, cost: ModelCost, profile: DeviceProfile, runs: dict[int, list[float]],
            spreads: dict[int, list[float]], allocator: str) -> dict[str, Any]:
    """Measured `runs` (batch size -> ms of each sweep) and their `spreads` against the prediction from
    `profile` for a process with `allocator`: validate()'s result without its load, seconds and protocol.
    Measurements do not depend on the profile, so a stored sweep can be judged again by a newer one."""
    batch_sizes = list(runs)
    points = []
    for b in batch_sizes:
        measured = min(runs[b])
        predicted = predict_batch_ms(cost, profile, b, allocator=allocator)
        points.append({"batch_size": b, "predicted_ms": round(predicted, 3), "measured_ms": round(measured, 3),
                       "error": round((predicted - measured) / measured, 4),
                       "sweeps_ms": [round(ms, 3) for ms in runs[b]], "spread": round(max(spreads[b]), 4)})
    sweeps = min(len(times) for times in runs.values())
    between = [(max(runs[b]) - min(runs[b])) / min(runs[b]) for b in batch_sizes] if sweeps > 1 else []
    return {"model": model_name, "device": profile.key, "threads": profile.threads,
            "points": points, "mape": _mape([p["error"] for p in points]),
            "mape_ge8": _mape([p["error"] for p in points if p["batch_size"] >= LARGE_BATCH]),
            "repeatability": {"mean_pct": _mape(between), "max_pct": round(100 * max(between), 2) if between
                              else None, "sweeps": sweeps},
            "pick": _pick(points, runs), "allocator": allocator}


def _pick(points: list[dict[str, Any]], runs: dict[int, list[float]]) -> dict[str, Any]:
    """The tuner's choice from the predicted curve (performance mode, as the sidecar starts) against the
    measured curve: the fraction of the best measured throughput it reaches, from the best of the sweeps and
    within each sweep on its own."""
    choice = choose_batch_size([CurvePoint(p["batch_size"], p["predicted_ms"]) for p in points])
    measured = {p["batch_size"]: p["batch_size"] / p["measured_ms"] for p in points}
    best = max(measured, key=measured.get)
    fraction = measured[choice.batch_size] / measured[best]
    per_sweep = []
    for sweep in range(min(len(times) for times in runs.values())):
        rate = {b: b / times[sweep] for b, times in runs.items()}
        per_sweep.append(round(rate[choice.batch_size] / max(rate.values()), 3))
    return {"batch_size": choice.batch_size, "measured_best_batch_size": best,
            "fraction_of_best": round(fraction, 3), "fraction_by_sweep": per_sweep, "target": PICK_TARGET,
            "meets": fraction >= PICK_TARGET}


def measure_isolated(model_name: str, input_shape: tuple, batch: int, threads: int,
                     options: dict) -> tuple[float, float, str]:
    """(ms, spread, allocator) of one point, measured by `python -m spark_cnn.sidecar.measure` in a new process
    started with the sidecar's environment (glibc reads its malloc settings when a process starts).
    `options`: repeats, warmup, point_budget_s and clock, as validate() takes them."""
    budget = options["point_budget_s"]
    argv = [sys.executable, "-m", "spark_cnn.sidecar.measure", "--model", model_name,
            "--input-shape", ",".join(map(str, input_shape)), "--batch", str(batch), "--threads", str(threads),
            "--repeats", str(options["repeats"]), "--warmup", str(options["warmup"]),
            "--point-budget-s", "none" if budget is None else repr(float(budget)), "--clock", options["clock"]]
    done = subprocess.run(argv, env=sidecar_child_env(), capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    try:
        reply = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"the measuring process for {model_name} at batch {batch} failed (exit status "
                           f"{done.returncode}: {tail[0]}); run {' '.join(argv[1:])} to see the whole error") from None
    if "error" in reply:
        kind = getattr(errors, reply["error"], None)
        kind = kind if isinstance(kind, type) and issubclass(kind, errors.SparkCnnError) else errors.SparkCnnError
        raise kind(reply["message"])
    return reply["ms"], reply["spread"], reply["allocator"]


def result_table(result: dict[str, Any]) -> str:
    lines = [f"{result['model']}: MAPE {result['mape']}% (batch >= {LARGE_BATCH}: {result['mape_ge8']}%), "
             f"sweeps differ by {result['repeatability']['mean_pct']}% on average "
             f"(max {result['repeatability']['max_pct']}%), load {result['load']}, {result['seconds']} s, "
             f"{result['allocator']} allocator",
             f"tuner pick: batch {result['pick']['batch_size']}, {100 * result['pick']['fraction_of_best']:.1f}% of "
             f"the best measured throughput (batch {result['pick']['measured_best_batch_size']}; per sweep "
             f"{result['pick']['fraction_by_sweep']}), target >= {100 * PICK_TARGET:.0f}%",
             f"{'batch':>6} {'predicted ms':>13} {'measured ms':>12} {'error':>8}  sweeps ms"]
    for p in result["points"]:
        lines.append(f"{p['batch_size']:>6} {p['predicted_ms']:>13.2f} {p['measured_ms']:>12.2f} "
                     f"{100 * p['error']:>7.1f}%  {p['sweeps_ms']}")
    for row in result.get("layers", [])[:12]:
        lines.append(f"    {row['name']:<32} {row['op']:<20} pred {row['predicted_ms']:9.3f} ms  "
                     f"meas {row['measured_ms']:9.3f} ms  diff {row['diff_ms']:+8.3f} ms  ({row['bound']})")
    return "\n".join(lines)


def summary_table(results: list[dict[str, Any]], seconds: float) -> str:
    """One Markdown row per model: the figures docs/perf-model.md reports."""
    lines = [f"all models: {seconds / 60:.1f} min",
             "| model | MAPE batch >= 8 | MAPE 1..64 | sweeps differ (mean / max) | worst point | tuner pick "
             "(% of best measured) | load |",
             "| --- | ---: | ---: | --- | --- | --- | --- |"]
    for r in results:
        worst = max(r["points"], key=lambda p: abs(p["error"]))
        pick = r["pick"]
        lines.append(f"| {r['model']} | {r['mape_ge8']}% | {r['mape']}% | {r['repeatability']['mean_pct']}% / "
                     f"{r['repeatability']['max_pct']}% | batch {worst['batch_size']}: {100 * worst['error']:+.1f}% | "
                     f"batch {pick['batch_size']}: {100 * pick['fraction_of_best']:.1f}% (best batch "
                     f"{pick['measured_best_batch_size']}) | {r['load'][0]} -> {r['load'][1]} |")
    return "\n".join(lines)
