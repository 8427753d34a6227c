"""The time model judged on the whole torchvision classification zoo under a FLOP budget, not on a chosen few.

    python -m spark_cnn.perf_tools.validate_command --zoo --batch-sizes 1,8,32 --sweeps 1 --clock cpu \\
        --json zoo.json --markdown zoo.md

Every classification model torchvision lists whose FLOPs per 224 px image fit `max_gflops` (twice the
multiply-adds torchvision publishes for its weights, scaled from their crop to 224 px: no model is built to
choose) is measured at 224 px as `validate` measures (each point in a fresh process running the sidecar's
ModelRunner, spark_cnn.perf_tools.validate.measure_isolated), cheapest first. At `attribute_at` images each layer
is also timed in a fresh process (fx interpreter, spark_cnn.perf_tools.validate.measure_layers_ms), so the report
can say which operator kinds the model misprices, measured rather than guessed.

The JSON file holds measurements only, per model, batch size and sweep, and is rewritten after every point:
a sweep killed midway resumes where it stopped, and a run with more batch sizes measures only the new ones.
Predictions are made when the report is written, from the profile at hand, so a profile calibrated again
judges the same measurements without measuring them again.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from spark_cnn.errors import ConfigError

__all__ = ["DEFAULT_ATTRIBUTE_AT", "DEFAULT_MAX_GFLOPS", "HELDOUT", "ZOO_INPUT_SHAPE", "attribute", "catalogue",
           "cause", "heldout_catalogue", "judge", "load_state", "markdown", "own_profiles", "percentile",
           "profiles_dir", "select", "summarise", "sweep"]

# 2 x the multiply-adds at 224 px: 43 networks, up to resnet50, convnext_tiny and swin_t, whose batch of 32
# still runs in a few seconds on one core of the development host.
DEFAULT_MAX_GFLOPS = 9.5
ZOO_INPUT_SHAPE = (3, 224, 224)
# Networks never used to develop the time model (none is in torchvision), chosen for kinds the zoo has little
# of: LCNet, MixNet's mixed kernels, GhostNet, ReXNet, ConvNeXt-atto, LeViT, DeiT-tiny, HRNet, ResNet-D, DLA,
# CSPResNet, RepVGG (docs/perf-model.md, "Networks the model was not built on"). Cheapest first.
HELDOUT = ("timm:lcnet_100", "timm:mixnet_s", "timm:ghostnet_100", "timm:rexnet_100", "timm:convnext_atto",
           "timm:levit_128", "timm:deit_tiny_patch16_224", "timm:hrnet_w18_small", "timm:resnet26d", "timm:dla34",
           "timm:cspresnet50", "timm:repvgg_a2")
# Where layers are timed for the attribution: the smallest batch the MAPE target counts.
DEFAULT_ATTRIBUTE_AT = 8
# Forwards timed per layer in the attribution (the minimum kept), after two warm-ups.
LAYER_REPEATS = 3
STATE_VERSION = 1
# The time model's targets on the CPU: MAPE at batch >= 8 (median, 90th percentile), over every size (90th
# percentile), the share of networks whose tuner pick reaches PICK_TARGET of the best measured throughput.
TARGET_MEDIAN_MAPE_GE8 = 5.0
TARGET_P90_MAPE_GE8 = 10.0
TARGET_P90_MAPE = 12.0
TARGET_PICK_SHARE = 0.90
# Kinds named as a network's cause: the largest differences, while each is at least this share of its time.
CAUSE_KINDS = 3
CAUSE_MIN_SHARE = 0.01
WORST = 5
# Settings a resumed sweep must share with the stored one (its batch sizes and sweeps may grow).
_SETTINGS = ("input_shape", "clock", "threads", "repeats", "warmup", "point_budget_s", "attribute_at")


def catalogue() -> dict[str, float | None]:
    """Every torchvision classification model -> its GFLOPs per 224 px image (2 x torchvision's published
    multiply-adds for its default weights, scaled by pixels from their crop), None when torchvision gives
    no count."""
    import torchvision
    from torchvision.models import get_model_weights, list_models

    flops: dict[str, float | None] = {}
    for name in list_models(module=torchvision.models):
        weights = get_model_weights(name).DEFAULT
        ops = weights.meta.get("_ops")
        crop = _crop_of(weights)
        flops[name] = None if ops is None else 2 * ops * (ZOO_INPUT_SHAPE[1] / crop) ** 2
    return flops


def heldout_catalogue(models: Sequence[str] = HELDOUT) -> dict[str, float | None]:
    """The held-out networks -> GFLOPs per 224 px image as the time model counts them (timm publishes no
    count); needs the timm extra."""
    from spark_cnn.models.loader import build_module
    from spark_cnn.perf.layers import analyse

    return {name: analyse(build_module(name), ZOO_INPUT_SHAPE).flops() / 1e9 for name in models}


def _crop_of(weights: Any) -> int:
    crop = getattr(weights.transforms, "keywords", {}).get("crop_size", ZOO_INPUT_SHAPE[1])
    return int(crop[0] if isinstance(crop, (list, tuple)) else crop)


def select(flops: dict[str, float | None], max_gflops: float) -> tuple[list[str], dict[str, str]]:
    """(models within `max_gflops`, cheapest first; the others -> why not). Ties keep name order.

    >>> select({"a": 1.0, "b": 0.5, "c": 20.0, "d": None}, 10)
    (['b', 'a'], {'c': '20.0 GFLOPs > 10', 'd': 'no FLOP count'})
    """
    if not max_gflops > 0:
        raise ConfigError(f"max_gflops must be positive, got {max_gflops!r}")
    chosen = sorted((g, name) for name, g in flops.items() if g is not None and g <= max_gflops)
    excluded = {name: ("no FLOP count" if g is None else f"{g:.1f} GFLOPs > {max_gflops:g}")
                for name, g in sorted(flops.items()) if g is None or g > max_gflops}
    return [name for _, name in chosen], excluded


# --- the stored sweep --------------------------------------------------------------------------------------------


def load_state(path: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The sweep stored at `path` (a new one when there is none); ConfigError when it was measured with
    other `settings` (a sweep must not mix protocols)."""
    if not os.path.exists(path):
        return {"version": STATE_VERSION, "settings": dict(settings), "models": {}, "failed": {}}
    try:
        with open(path) as f:
            state = json.load(f)
    except ValueError as e:
        raise ConfigError(f"{path} is not a zoo sweep ({e}); give another --json") from e
    if state.get("version") != STATE_VERSION:
        raise ConfigError(f"{path} holds a zoo sweep of version {state.get('version')!r}, not {STATE_VERSION}; "
                          "give another --json")
    for key in _SETTINGS:
        stored, given = state["settings"].get(key), settings.get(key)
        if _plain(stored) != _plain(given):
            raise ConfigError(f"{path} was measured with {key}={stored!r}, not {given!r}: give the same "
                              "settings to resume it, or another --json")
    return state


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def save_state(path: str, state: dict[str, Any]) -> None:
    """Write `state` whole or not at all (a sweep killed while writing keeps the previous file)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    partial = f"{path}.partial"
    with open(partial, "w") as f:
        json.dump(state, f, indent=1)
    os.replace(partial, path)


def pending(state: dict[str, Any], models: Sequence[str], batch_sizes: Sequence[int],
            sweeps: int) -> list[tuple[str, int, int]]:
    """(model, sweep, batch size) still to measure, in the order a sweep takes them: model by model, each
    sweep over all sizes. Failed models are not retried (delete their entry in "failed" to retry)."""
    todo = []
    for name in models:
        if name in state["failed"]:
            continue
        runs = state["models"].get(name, {}).get("runs", {})
        for sweep in range(sweeps):
            todo.extend((name, sweep, b) for b in batch_sizes if len(runs.get(str(b), [])) <= sweep)
    return todo


def profiles_dir(path: str) -> str:
    """Where a sweep at `path` keeps the calibrations made before each network (`sweep(calibrate=...)`)."""
    return f"{os.path.splitext(path)[0]}-profiles"


def own_profiles(path: str, state: dict[str, Any]) -> Callable[[str], Any]:
    """name -> the profile calibrated just before that network was measured, or None where the sweep made
    none (a network measured without --calibrate-each)."""
    from spark_cnn.perf.profile import read_profile_text

    folder = profiles_dir(path)

    def own(name: str) -> Any:
        stored = state["models"].get(name, {}).get("profile")
        if not stored:
            return None
        where = os.path.join(folder, stored["file"])
        again = f"measure {name} again (delete its entry in the sweep)"
        try:
            with open(where) as f:
                text = f.read()
        except OSError as e:
            raise ConfigError(f"{name}'s calibration {where}: cannot read it ({e.strerror or e}); {again}") from None
        try:
            return read_profile_text(text, source=f"{name}'s calibration {where}")
        except ConfigError as e:  # its hint is about exported files; here the cure is a new measurement
            raise ConfigError(f"{str(e).split('; ')[0]}; {again}") from None
    return own


def _calibrated_before(path: str, name: str, entry: dict[str, Any], calibrate: Callable[[], Any]) -> str:
    """Calibrate now, keep the profile beside the sweep and name it in `entry`; a line for the log."""
    profile = calibrate()
    folder = profiles_dir(path)
    os.makedirs(folder, exist_ok=True)
    from spark_cnn.perf.profile import file_slug

    file = file_slug(name) + ".json"  # timm:x -> timm_x.json
    partial = os.path.join(folder, f"{file}.partial")
    with open(partial, "w") as f:
        f.write(profile.to_json())
    os.replace(partial, os.path.join(folder, file))
    entry["profile"] = {"file": file, "key": profile.key, "created": profile.created,
                        "calibration_s": profile.calibration_s, "load": _plain_dict(profile.load),
                        "repeatability": _plain_dict(profile.repeatability), "notes": list(profile.notes)}
    return (f"{name}: calibrated in {profile.calibration_s} s "
            f"(repeatability {_plain_dict(profile.repeatability).get('median_pct', '?')}%)")


def _plain_dict(value: Any) -> Any:
    return json.loads(json.dumps(value, default=list))


def _entry(state: dict[str, Any], name: str, gflops: dict[str, float | None]) -> dict[str, Any]:
    """`name`'s stored measurements, made empty on first use."""
    return state["models"].setdefault(name, {"gflops": gflops.get(name), "runs": {}, "spreads": {}, "load": [],
                                             "allocator": None})


def sweep(path: str, models: Sequence[str], batch_sizes: Sequence[int], *, settings: dict[str, Any], sweeps: int,
          gflops: dict[str, float | None], log: Callable[[str], None] = print,
          measure: Callable[..., tuple[float, float, str]] | None = None,
          measure_layers: Callable[..., dict[str, Any]] | None = None,
          calibrate: Callable[[], Any] | None = None,
          input_shape_of: Callable[[str], tuple[int, ...]] | None = None) -> dict[str, Any]:
    """Measure what `path` does not hold yet of `models` x `batch_sizes` x `sweeps` (and each model's layers
    at settings["attribute_at"], unless 0), saving after every point; returns the state. `measure` and
    `measure_layers` default to the isolated runners. With `calibrate`, the device is calibrated again
    before each network that has points to measure, and that network is judged against its own profile
    (`own_profiles`): the host's speed drifts by 10-30% within hours (docs/perf-model.md), so one
    calibration judges only the measurements of its own hour. `input_shape_of(name)`: a network's own image
    shape (default: settings["input_shape"] for all)."""
    from spark_cnn.perf_tools.validate import measure_isolated

    measure = measure or measure_isolated
    measure_layers = measure_layers or measure_layers_isolated
    state = load_state(path, settings)
    options = {k: settings[k] for k in ("repeats", "warmup", "point_budget_s", "clock")}
    shape_of = input_shape_of or (lambda name, shape=tuple(settings["input_shape"]): shape)
    todo = pending(state, models, batch_sizes, sweeps)
    layers_todo = [name for name in models if settings["attribute_at"] and name not in state["failed"]
                   and "layers" not in state["models"].get(name, {})]
    log(f"zoo: {len(models)} networks, {len(todo)} points and {len(layers_todo)} per-layer timings to measure "
        f"({path})")
    for name in models:
        if calibrate is not None and any(t[0] == name for t in todo):
            entry = _entry(state, name, gflops)
            log(_calibrated_before(path, name, entry, calibrate))
            save_state(path, state)
        for model, sweep_index, b in (t for t in todo if t[0] == name):
            entry = _entry(state, name, gflops)
            load = os.getloadavg()[0]
            started = time.perf_counter()
            try:
                ms, spread, allocator = measure(model, shape_of(model), b, settings["threads"], options)
            except Exception as e:  # a model the runner cannot run: recorded, the sweep goes on
                state["failed"][name] = f"batch {b}: {type(e).__name__}: {e}"
                save_state(path, state)
                log(f"{name}: failed at batch {b}: {e}")
                break
            entry["runs"].setdefault(str(b), []).append(round(ms, 4))
            entry["spreads"].setdefault(str(b), []).append(round(spread, 4))
            entry["load"].append([b, round(load, 2), round(os.getloadavg()[0], 2)])
            entry["allocator"] = allocator
            save_state(path, state)
            log(f"{name} batch {b} sweep {sweep_index + 1}: {ms:.2f} ms (load {load:.2f}, "
                f"{time.perf_counter() - started:.1f} s)")
        if name in layers_todo and name not in state["failed"]:
            entry = _entry(state, name, gflops)
            entry["layers"] = measure_layers(name, shape_of(name), settings["attribute_at"], settings["threads"],
                                             settings["clock"])
            save_state(path, state)
            log(f"{name}: layers at batch {settings['attribute_at']}: "
                f"{entry['layers'].get('error') or str(len(entry['layers']['ms'])) + ' timed'}")
    return state


def measure_layers_isolated(model_name: str, input_shape: Sequence[int], batch: int, threads: int,
                            clock: str) -> dict[str, Any]:
    """{"ms": layer name -> ms, "allocator"} from `python -m spark_cnn.perf_tools.zoo` in a fresh process with the
    sidecar's environment, or {"error": why} (a model torch.fx cannot trace has no per-layer timing)."""
    from spark_cnn.perf_tools.child_env import sidecar_child_env

    argv = [sys.executable, "-m", "spark_cnn.perf_tools.zoo", "--model", model_name, "--input-shape",
            ",".join(map(str, input_shape)), "--batch", str(batch), "--threads", str(threads), "--clock", clock]
    done = subprocess.run(argv, env=sidecar_child_env(), capture_output=True, text=True)
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        return {"error": f"exit status {done.returncode}: {tail[0]}"}


def _layers_main(argv: Sequence[str] | None = None) -> int:
    """The per-layer timing of one model at one batch size, printed as one JSON line."""
    import argparse

    import torch

    from spark_cnn.models.loader import build_module
    from spark_cnn.perf_tools.validate import measure_layers_ms
    from spark_cnn.task.sidecar_env import allocator_of

    parser = argparse.ArgumentParser(prog="python -m spark_cnn.perf_tools.zoo",
                                     description="Time one model's layers (the zoo's attribution).")
    parser.add_argument("--model", required=True)
    parser.add_argument("--input-shape", default=",".join(map(str, ZOO_INPUT_SHAPE)))
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", default="wall")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    try:
        module = build_module(args.model)
        shape = tuple(int(d) for d in args.input_shape.split(","))
        ms = measure_layers_ms(module, shape, args.batch, repeats=LAYER_REPEATS, clock=args.clock)
        reply: dict[str, Any] = {"ms": {name: round(v, 5) for name, v in ms.items()}, "allocator": allocator_of()}
    except Exception as e:  # reported to the sweep, which goes on without this model's attribution
        reply = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"[:300]}
    print(json.dumps(reply), flush=True)
    return 0


# --- judging: prediction against the stored measurements -----------------------------------------------------


def attribute(predicted: Iterable[tuple[Any, float]], measured_ms: dict[str, float],
              kind_of: Callable[[Any], str]) -> dict[str, Any]:
    """Predicted against measured time per operator kind, from (layer, predicted ms) and measured ms by layer
    name: {"kinds": [{kind, layers, predicted_ms, measured_ms, error, share}], largest |difference| first,
    "measured_ms" (all matched layers), "unmatched_ms" (predicted, never measured: non-leaf module calls)}.
    `share` is the kind's part of the measured time.

    >>> class L:
    ...     def __init__(self, name, kind): self.name, self.kind = name, kind
    >>> rows = attribute([(L("a", "relu"), 2.0), (L("b", "relu"), 1.0), (L("c", "conv"), 6.0), (L("<m>", "x"), 1.0)],
    ...                  {"a": 1.0, "b": 1.0, "c": 6.0}, lambda layer: layer.kind)
    >>> [(k["kind"], k["error"], k["share"]) for k in rows["kinds"]], rows["unmatched_ms"]
    ([('relu', 0.5, 0.25), ('conv', 0.0, 0.75)], 1.0)
    """
    kinds: dict[str, dict[str, Any]] = {}
    unmatched = 0.0
    for layer, ms in predicted:
        got = measured_ms.get(layer.name)
        if got is None:
            unmatched += ms
            continue
        row = kinds.setdefault(kind_of(layer), {"layers": 0, "predicted_ms": 0.0, "measured_ms": 0.0})
        row["layers"] += 1
        row["predicted_ms"] += ms
        row["measured_ms"] += got
    total = sum(row["measured_ms"] for row in kinds.values())
    rows = [{"kind": kind, "layers": row["layers"], "predicted_ms": round(row["predicted_ms"], 4),
             "measured_ms": round(row["measured_ms"], 4),
             "error": round(row["predicted_ms"] / row["measured_ms"] - 1, 4) if row["measured_ms"] > 0 else None,
             "share": round(row["measured_ms"] / total, 4) if total > 0 else 0.0}
            for kind, row in kinds.items()]
    rows.sort(key=lambda r: -abs(r["predicted_ms"] - r["measured_ms"]))
    return {"kinds": rows, "measured_ms": round(total, 4), "unmatched_ms": round(unmatched, 4)}


def cause(kinds: Sequence[dict[str, Any]], n: int = CAUSE_KINDS) -> str:
    """The kinds that account for most of a network's error, as text: "conv:depthwise -31% (42% of the time)".

    >>> cause([{"kind": "conv:depthwise", "error": -0.31, "share": 0.42}, {"kind": "relu", "error": 0.5,
    ...        "share": 0.001}])
    'conv:depthwise -31% (42% of the time)'
    """
    named = [f"{k['kind']} {100 * k['error']:+.0f}% ({100 * k['share']:.0f}% of the time)"
             for k in kinds if k["error"] is not None and k["share"] >= CAUSE_MIN_SHARE][:n]
    return "; ".join(named) or "no kind stands out"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile (0..100), linear between the closest ranks (numpy's default); None if empty.

    >>> percentile([1, 2, 3, 4], 50), percentile([1, 2, 3, 4], 90), percentile([5], 90)
    (2.5, 3.7, 5.0)
    """
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return None
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within 0..100, got {q}")
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return round(ordered[low] + (ordered[high] - ordered[low]) * (position - low), 4)


def summarise(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Median and 90th percentile of MAPE at batch >= 8 and over every size, the pick's 10th percentile and
    the share of networks whose pick meets its target, and which of the targets are met."""
    ge8 = [r["mape_ge8"] for r in results if r["mape_ge8"] is not None]
    every = [r["mape"] for r in results if r["mape"] is not None]
    picks = [r["pick"]["fraction_of_best"] for r in results]
    meeting = sum(1 for r in results if r["pick"]["meets"])
    out = {"networks": len(results),
           "mape_ge8": {"median": percentile(ge8, 50), "p90": percentile(ge8, 90)},
           "mape": {"median": percentile(every, 50), "p90": percentile(every, 90)},
           "pick": {"median": percentile(picks, 50), "p10": percentile(picks, 10),
                    "share_meeting": round(meeting / len(results), 3) if results else None}}
    out["targets"] = {
        f"median MAPE at batch >= 8 <= {TARGET_MEDIAN_MAPE_GE8:g}%": _at_most(out["mape_ge8"]["median"],
                                                                        TARGET_MEDIAN_MAPE_GE8),
        f"90th percentile MAPE at batch >= 8 <= {TARGET_P90_MAPE_GE8:g}%": _at_most(out["mape_ge8"]["p90"],
                                                                             TARGET_P90_MAPE_GE8),
        f"MAPE over every size <= {TARGET_P90_MAPE:g}% for 90% of networks": _at_most(out["mape"]["p90"],
                                                                                  TARGET_P90_MAPE),
        f"pick >= 95% of the best for {100 * TARGET_PICK_SHARE:.0f}% of networks":
            out["pick"]["share_meeting"] is not None and out["pick"]["share_meeting"] >= TARGET_PICK_SHARE}
    return out


def _at_most(value: float | None, target: float) -> bool:
    return value is not None and value <= target


def kinds_over_zoo(results: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per operator kind over every attributed network: networks, total predicted and measured ms, the
    relative error of the totals, the median of the per-network errors, its share of all measured time."""
    by_kind: dict[str, dict[str, Any]] = {}
    for r in results:
        for k in r.get("attribution", {}).get("kinds", []):
            row = by_kind.setdefault(k["kind"], {"networks": 0, "predicted_ms": 0.0, "measured_ms": 0.0,
                                                 "errors": []})
            row["networks"] += 1
            row["predicted_ms"] += k["predicted_ms"]
            row["measured_ms"] += k["measured_ms"]
            if k["error"] is not None:
                row["errors"].append(k["error"])
    total = sum(row["measured_ms"] for row in by_kind.values()) or 1.0
    rows = [{"kind": kind, "networks": row["networks"], "predicted_ms": round(row["predicted_ms"], 3),
             "measured_ms": round(row["measured_ms"], 3),
             "error": round(row["predicted_ms"] / row["measured_ms"] - 1, 4) if row["measured_ms"] else None,
             "median_error": percentile(row["errors"], 50), "share": round(row["measured_ms"] / total, 4)}
            for kind, row in by_kind.items()]
    rows.sort(key=lambda r: -abs(r["predicted_ms"] - r["measured_ms"]))
    return rows


def judge(state: dict[str, Any], profile: Any, *, cost_of: Callable[[str], Any] | None = None,
          own_profile: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Every stored model's measurements against the prediction (validate.compare) of its own profile
    (`own_profile(name)`, see `own_profiles`) or else of `profile`, with its attribution by operator kind
    where its layers were timed; the summary over the zoo."""
    from spark_cnn.perf.timemodel import layer_kind, predict_layers_ms
    from spark_cnn.perf_tools.pooled_profile import pooled_runs
    from spark_cnn.perf_tools.validate import compare

    cost_of = cost_of or _cost_of(tuple(state["settings"]["input_shape"]))
    batch = state["settings"]["attribute_at"]
    common = profile
    results = []
    for name, entry in state["models"].items():
        if name in state["failed"] or not entry["runs"]:
            continue
        profile = (own_profile(name) if own_profile is not None else None) or common

        def kind_of(layer: Any, profile: Any = profile) -> str:
            return layer_kind(layer, batch, profile)
        runs = {int(b): entry["runs"][b] for b in sorted(entry["runs"], key=int)}
        spreads = {int(b): entry["spreads"][b] for b in sorted(entry["spreads"], key=int)}
        cost = cost_of(name)
        result = compare(name, cost, profile, runs, spreads, entry["allocator"])
        loads = [x for point in entry["load"] for x in point[1:]]
        result.update(gflops=entry.get("gflops"), load=[min(loads), max(loads)] if loads else None,
                      own_profile=profile is not common, pooled_runs=pooled_runs(profile))
        layers = entry.get("layers")
        if layers and "ms" in layers:
            rows = [(layer, ms) for layer, ms, _ in predict_layers_ms(cost, profile, batch,
                                                                       allocator=layers["allocator"])]
            result["attribution"] = {"batch_size": batch,
                                     **attribute(rows, layers["ms"], kind_of)}
        elif layers:
            result["attribution_error"] = layers.get("error")
        results.append(result)
    return {"results": results, "summary": summarise(results), "kinds": kinds_over_zoo(results),
            "failed": dict(state["failed"]), "profile": common.key,
            "own_profiles": sum(1 for r in results if r["own_profile"]),
            "pooled_runs": sorted({r["pooled_runs"] for r in results if r["own_profile"]})}


def _cost_of(input_shape: tuple[int, ...]) -> Callable[[str], Any]:
    def cost(name: str) -> Any:
        from spark_cnn.models.loader import build_module
        from spark_cnn.perf.layers import analyse
        return analyse(build_module(name), input_shape)
    return cost


def _pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}%"


def markdown(judged: dict[str, Any], *, max_gflops: float, batch_sizes: Sequence[int], clock: str,
             header: str = "", networks: str = "") -> str:
    """The zoo's tables in Markdown: per network, the summary against the targets, the worst five with their
    cause, and the error per operator kind over the zoo. `networks` says which networks these are (default:
    the catalogue under `max_gflops`)."""
    results = sorted(judged["results"], key=lambda r: (r["mape_ge8"] is None, r["mape_ge8"] or 0.0))
    s = judged["summary"]
    sizes = ",".join(map(str, batch_sizes))
    lines = [header] if header else []
    own = judged.get("own_profiles", 0)
    against = (f"each network against the calibration made just before it ({own} of {s['networks']}; the rest "
               f"against the common one)" if 0 < own < s["networks"] else
               "each network against the calibration made just before it" if own else "one calibration")
    pooled = judged.get("pooled_runs") or [1]
    if own and pooled[-1] > 1:
        counts = str(pooled[0]) if len(pooled) == 1 else f"{pooled[0]}-{pooled[-1]}"
        against += f", as the device's cached profile pooled it (each point the median of its latest {counts} runs)"
    networks = networks or f"{s['networks']} networks under {max_gflops:g} GFLOPs per 224 px image"
    lines += [f"{networks}, batch sizes {sizes}, {clock} clock, profile {judged['profile']}, {against}.", "",
              f"| model | GFLOPs | MAPE batch >= 8 | MAPE {sizes} | worst point | tuner pick: % of best measured "
              "| mispriced kinds (batch " + str(_attributed_at(results)) + ") | load |",
              "| --- | ---: | ---: | ---: | --- | --- | --- | --- |"]
    for r in results:
        worst = max(r["points"], key=lambda p: abs(p["error"]))
        pick = r["pick"]
        kinds = cause(r["attribution"]["kinds"], 2) if "attribution" in r else r.get("attribution_error") or "-"
        load = "-" if not r.get("load") else f"{r['load'][0]:.1f}-{r['load'][1]:.1f}"
        lines.append(f"| {r['model']} | {r['gflops']:.2f} | {_pct(r['mape_ge8'])} | {_pct(r['mape'])} | "
                     f"batch {worst['batch_size']}: {100 * worst['error']:+.1f}% | batch {pick['batch_size']}: "
                     f"{100 * pick['fraction_of_best']:.1f}% (best {pick['measured_best_batch_size']}) | "
                     f"{kinds} | {load} |")
    lines += ["", "| over the zoo | median | 90th percentile |", "| --- | ---: | ---: |",
              f"| MAPE batch >= 8 | {_pct(s['mape_ge8']['median'])} | {_pct(s['mape_ge8']['p90'])} |",
              f"| MAPE {sizes} | {_pct(s['mape']['median'])} | {_pct(s['mape']['p90'])} |",
              f"| tuner pick, % of best measured | {_pct(_times100(s['pick']['median']))} | "
              f"{_pct(_times100(s['pick']['p10']))} (10th percentile) |", "",
              "Targets: " + "; ".join(f"{name}: {'met' if met else '**not met**'}"
                                      for name, met in s["targets"].items()) +
              f" ({_pct(_times100(s['pick']['share_meeting']), 0)} of networks reach 95%).", "",
              f"Worst {WORST} at batch >= 8, and why (predicted against measured time per operator kind):", ""]
    for r in list(reversed(results))[:WORST]:
        why = cause(r["attribution"]["kinds"]) if "attribution" in r else (
            f"no per-layer timing ({r.get('attribution_error') or 'not measured'})")
        lines.append(f"- **{r['model']}** {_pct(r['mape_ge8'])} (over {sizes}: {_pct(r['mape'])}): {why}")
    lines += ["", "Per operator kind over the zoo (time at the attribution's batch size; error of the totals, "
              "and the median of the per-network errors):", "",
              "| kind | networks | share of time | predicted / measured | median per network |",
              "| --- | ---: | ---: | ---: | ---: |"]
    for k in judged["kinds"]:  # every kind: a short list, and a reader looks for the one they care about
        lines.append(f"| {k['kind']} | {k['networks']} | {100 * k['share']:.1f}% | {_signed(k['error'])} | "
                     f"{_signed(k['median_error'])} |")
    if judged["failed"]:
        lines += ["", "Not measured: " + "; ".join(f"{n} ({why})" for n, why in judged["failed"].items())]
    return "\n".join(lines) + "\n"


def _signed(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:+.1f}%"


def _times100(value: float | None) -> float | None:
    return None if value is None else 100 * value


def _attributed_at(results: Sequence[dict[str, Any]]) -> Any:
    return next((r["attribution"]["batch_size"] for r in results if "attribution" in r), "-")


if __name__ == "__main__":
    sys.exit(_layers_main())
