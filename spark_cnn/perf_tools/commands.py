"""`spark-cnn profile` and `spark-cnn plan`: the analytical model as a person uses it.

profile: the per-layer costs of a model, its predicted per-batch latency curve on a calibrated device, the
batch size the tuner picks from it, and with `validate` the measured curve beside it (error per point, MAPE,
the measurement's repeatability). plan: the predicted wall time of a cluster job and the stage that bounds it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from spark_cnn.errors import ConfigError, missing_extra
from spark_cnn.models.spec import ModelSpec
from spark_cnn.models.timing import DEFAULT_BATCH_SIZES
from spark_cnn.perf.tuner import CurvePoint, choose_batch_size

TOP_LAYERS = 15
MIB = 1 << 20


def _model_and_cost(spec: ModelSpec):
    from spark_cnn.imaging.preprocess import Preprocessing
    from spark_cnn.models.loader import build_module, declared_preprocessing
    from spark_cnn.models.resolve import resolve_weights
    from spark_cnn.perf.layers import analyse

    weights = resolve_weights(spec)
    module = build_module(spec.source, weights.file, weights.enum, kind=spec.kind)
    own = Preprocessing.from_dict(weights.preprocessing) if weights.preprocessing else None
    prep = spec.preprocessing_over(own or declared_preprocessing(module) or Preprocessing())
    shape = (3, prep.crop, prep.crop)
    return module, shape, analyse(module, shape), weights.label


def profile_model(spec: ModelSpec, *, device: str = "cpu", batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
                  validate: bool = False, threads: int | None = None, tuning: str = "performance",
                  memory_budget_bytes: int | None = None, refresh: bool = False,
                  calibration_s: float | None = None, strict: bool = False, pool: int | None = None) -> dict:
    """The profile JSON: {"model", "device", "points": [{batch_size, predicted_ms, predicted_ms_low,
    predicted_ms_high, measured_ms?}], "mape", "chosen_batch_size"}, plus the per-layer table, the tuner's
    reasoning and, with `validate`, the measured best batch and how close the pick came to it. The interval
    low-high is the calibration's spread around the prediction."""
    from spark_cnn.perf.timemodel import predict_batch_ms, predict_layers_ms, predict_peak_memory_bytes
    from spark_cnn.perf_tools.calibration import calibrate

    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise ConfigError(f"--batch-sizes {batch_sizes}: expected positive integers")
    module, shape, cost, weights = _model_and_cost(spec)
    profile = calibrate(device, threads=threads, refresh=refresh, strict=strict, **_budget(calibration_s, pool))
    curve = [CurvePoint(b, predict_batch_ms(cost, profile, b), predict_peak_memory_bytes(cost, b))
             for b in sorted(set(batch_sizes))]
    choice = choose_batch_size(curve, mode=tuning, memory_budget_bytes=memory_budget_bytes)
    layers = sorted(predict_layers_ms(cost, profile, choice.batch_size), key=lambda row: -row[1])
    result = {
        "model": spec.source, "weights": weights, "device": profile.key, "input_shape": list(shape),
        "threads": profile.threads,
        "points": [{"batch_size": p.batch_size, "predicted_ms": round(p.latency_ms, 3),
                    "predicted_ms_low": round(p.latency_ms * (1 - profile.spread), 3),
                    "predicted_ms_high": round(p.latency_ms * (1 + profile.spread), 3),
                    "predicted_images_per_s": round(p.images_per_s, 1),
                    "peak_memory_mib": round(p.peak_memory_bytes / MIB, 1)} for p in curve],
        "mape": None, "chosen_batch_size": choice.batch_size, "choice": choice.reason,
        "gflops_per_image": round(cost.flops(1) / 1e9, 3),
        "layers": [{"name": layer.name, "op": layer.op, "mflops": round(layer.flops_at(choice.batch_size) / 1e6, 2),
                    "mib": round(layer.bytes_at(choice.batch_size) / MIB, 2), "predicted_ms": round(ms, 3),
                    "bound": bound} for layer, ms, bound in layers[:TOP_LAYERS]],
        "uncosted": list(cost.uncosted), "calibration": _profile_origin(profile, None),
    }
    if validate:
        from spark_cnn.perf_tools.validate import validate as measure

        # Each batch size in a fresh process with the sidecar's environment, as the sidecar runs it (a process
        # that ran other batch sizes, or this command's own allocator, times differently).
        measured = measure(spec.source, [p.batch_size for p in curve], profile, module=module, input_shape=shape,
                           isolate=True)
        by_size = {p["batch_size"]: p for p in measured["points"]}
        for point in result["points"]:
            m = by_size[point["batch_size"]]
            point.update(measured_ms=m["measured_ms"], error=m["error"],
                         measured_images_per_s=round(1000 * point["batch_size"] / m["measured_ms"], 1))
        best = max(result["points"], key=lambda p: p["measured_images_per_s"])
        picked = next(p for p in result["points"] if p["batch_size"] == choice.batch_size)
        result.update(mape=measured["mape"], mape_ge8=measured["mape_ge8"],
                      repeatability=measured["repeatability"], load=measured["load"],
                      measured_best_batch_size=best["batch_size"],
                      pick_fraction_of_best=round(picked["measured_images_per_s"] / best["measured_images_per_s"], 3))
    return result


def profile_report(result: dict) -> str:
    weights = f" ({result['weights']} weights)" if result.get("weights") else ""
    lines = [f"{result['model']}{weights} on {result['device']} ({result['threads']} threads), input "
             f"{'x'.join(map(str, result['input_shape']))}, {result['gflops_per_image']} GFLOPs per image",
             trust_line(result["calibration"]),
             f"costliest layers at batch {result['chosen_batch_size']}:",
             f"  {'layer':<34} {'op':<18} {'MFLOPs':>10} {'MiB':>8} {'pred ms':>9}  bound"]
    for row in result["layers"]:
        lines.append(f"  {row['name'][:34]:<34} {row['op'][:18]:<18} {row['mflops']:>10.1f} {row['mib']:>8.2f} "
                     f"{row['predicted_ms']:>9.3f}  {row['bound']}")
    if result["uncosted"]:
        lines.append(f"  not costed: {', '.join(result['uncosted'])}")
    spread = (result["calibration"].get("spread") or 0.0) * 100
    header = f"  {'batch':>5} {'pred ms':>10} {'pred img/s':>11} {'peak MiB':>9}"
    if result["mape"] is not None:
        header += f" {'meas ms':>10} {'meas img/s':>11} {'error':>7}"
    lines += [f"latency per batch (predictions +-{spread:.1f}%, the calibration's spread):" if spread
              else "latency per batch:", header]
    for p in result["points"]:
        line = (f"  {p['batch_size']:>5} {p['predicted_ms']:>10.2f} {p['predicted_images_per_s']:>11.1f} "
                f"{p['peak_memory_mib']:>9.1f}")
        if "measured_ms" in p:
            line += f" {p['measured_ms']:>10.2f} {p['measured_images_per_s']:>11.1f} {100 * p['error']:>6.1f}%"
        lines.append(line)
    lines.append(f"chosen batch size {result['chosen_batch_size']}: {result['choice']}")
    if result["mape"] is not None:
        lines.append(_measured_line(result))
    return "\n".join(lines)


def _measured_line(result: dict) -> str:
    """What `--validate` measured, in a line: the error, how far two sweeps differ, the pick against the best."""
    rep = result["repeatability"]
    return (f"MAPE {result['mape']}% (batch >= 8: {result['mape_ge8']}%); two sweeps differ by {rep['mean_pct']}% "
            f"on average (max {rep['max_pct']}%); measured best batch {result['measured_best_batch_size']}, the "
            f"pick reaches {100 * result['pick_fraction_of_best']:.1f}% of it; load {result['load']}")


def export_device(device: str, path: str, *, threads: int | None = None, refresh: bool = False,
                  calibration_s: float | None = None, strict: bool = False, pool: int | None = None) -> dict:
    """Calibrate `device` (or take its cached profile) and write it to `path` for `plan --device-profile` and
    jobs' `--device-profile` on other hosts. Returns what was written: {"file", "device", "device_name", ...}."""
    from spark_cnn.perf.profile import export_path, export_profile
    from spark_cnn.perf_tools.calibration import calibrate

    path = export_path(path)  # a missing folder stops before the calibration, not after
    profile = calibrate(device, threads=threads, refresh=refresh, strict=strict, **_budget(calibration_s, pool))
    written = export_profile(profile, path)
    return {"device": profile.key, "device_name": profile.device_name, **_profile_origin(profile, written)}


def export_report(exported: dict) -> str:
    return f"exported the {exported['device_name']} profile ({exported['device']}) to {exported['file']}\n" \
           f"  {trust_line(exported)}"


def plot_profile(result: dict, path: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise missing_extra("matplotlib", "plot", "--plot") from e
    sizes = [p["batch_size"] for p in result["points"]]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(sizes, [p["predicted_ms"] for p in result["points"]], "o-", label="predicted")
    if result["mape"] is not None:
        ax.plot(sizes, [p["measured_ms"] for p in result["points"]], "s--", label=f"measured (MAPE {result['mape']}%)")
    ax.axvline(result["chosen_batch_size"], color="grey", linestyle=":", label=f"chosen {result['chosen_batch_size']}")
    ax.set(xscale="log", yscale="log", xlabel="batch size", ylabel="ms per batch",
           title=f"{result['model']} on {result['device']}")
    ax.set_xticks(sizes, [str(s) for s in sizes])
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _budget(calibration_s: float | None, pool: int | None = None) -> dict:
    """calibrate()'s keyword arguments: the time it may take, the cache folder ($SPARK_CNN_CACHE_DIR) and how
    many calibrations the cached profile pools (None: calibrate's default)."""
    from spark_cnn.perf.startpoint import profile_cache_dir

    options: dict = {"cache_dir": profile_cache_dir()}
    if calibration_s is not None:
        options["budget_s"] = calibration_s
    if pool is not None:
        options["pool"] = pool
    return options


def _plan_profile(device: str, threads: int | None, calibration_s: float | None, device_profile: str | None,
                  strict: bool):
    from spark_cnn.perf.profile import read_profile_file
    from spark_cnn.perf_tools.calibration import calibrate

    if device_profile is not None:
        return read_profile_file(device_profile)
    return calibrate(device, threads=threads, strict=strict, **_budget(calibration_s))


def plan_job(spec: ModelSpec, *, images: int, executors: int, cores: int | None = None, device: str = "cpu",
             threads: int | None = None, tuning: str = "performance", calibration_s: float | None = None,
             device_profile: str | None = None, strict: bool = False) -> dict:
    """Predicted wall time of classifying `images` on `executors` executors of `cores` cores each, from this
    host's calibration of `device`, or from `device_profile`, a profile exported on another host (no device is
    needed here then).

    Per executor the pipeline runs at the slowest of its stages, with the batch size the tuner picks:

    - CPU device: the executor's cores decode (Spark tasks) and compute (the sidecar's threads) side by side, so
      the rate is the cores' time per image, decode + compute, spread over every core (`cpu`); the profile's
      per-core speed at its thread count is assumed on every core.
    - CUDA device: the GPU computes at the tuned batch (`compute`); images are decoded where the sidecar's
      `--decode auto` would put them (perf/placement.py): by the executor's cores (`decode`) when they outrun
      the device with headroom, else on the GPU; the host-to-device copy of uint8 pixels (`transfer`).

    Spark's start-up and the output write are not modelled.
    """
    import os

    from spark_cnn.perf.placement import choose_decode_place
    from spark_cnn.perf.timemodel import predict_batch_ms

    if images < 1 or executors < 1:
        raise ConfigError("--images and --executors must be positive")
    if cores is not None and cores < 1:
        raise ConfigError(f"--cores {cores}: expected a positive number of cores per executor")
    profile = _plan_profile(device, threads, calibration_s, device_profile, strict)
    cores = cores or (profile.load.get("cores") if device_profile else None) or os.cpu_count() or 1
    _, shape, cost, weights = _model_and_cost(spec)
    curve = [CurvePoint(b, predict_batch_ms(cost, profile, b)) for b in DEFAULT_BATCH_SIZES]
    choice = choose_batch_size(curve, mode=tuning)
    decode_per_core = 1000.0 / profile.decode_ms
    if profile.is_cuda:
        decode = choose_decode_place("cuda", gpu_decode_works=True, cores=cores, decode_ms=profile.decode_ms,
                                     device_images_per_s=choice.images_per_s)
        stages = {"compute": choice.images_per_s}
        if decode.place == "task":
            stages["decode"] = cores * decode_per_core
        if profile.h2d:
            nbytes, us = profile.h2d[-1]
            stages["transfer"] = 1e6 * nbytes / us / math.prod(shape)  # uint8 pixels per image
    else:
        decode = choose_decode_place("cpu", gpu_decode_works=False, cores=cores, decode_ms=profile.decode_ms,
                                     device_images_per_s=choice.images_per_s)
        compute_core_ms = profile.threads * 1000.0 / choice.images_per_s  # core-milliseconds per image
        stages = {"cpu": cores * 1000.0 / (profile.decode_ms + compute_core_ms),
                  "decode_alone": cores * decode_per_core, "compute_alone": cores * 1000.0 / compute_core_ms}
    limits = {k: v for k, v in stages.items() if not k.endswith("_alone")}
    bottleneck = min(limits, key=limits.get)
    per_executor = limits[bottleneck]
    rate = executors * per_executor
    core_time = None
    if not profile.is_cuda:  # where the cores' time per image goes
        share = compute_core_ms / (profile.decode_ms + compute_core_ms)
        core_time = {"compute": round(share, 3), "decode": round(1 - share, 3)}
    return {"model": spec.source, "weights": weights, "device": profile.key, "device_name": profile.device_name,
            "profile": _profile_origin(profile, device_profile), "images": images, "executors": executors,
            "cores_per_executor": cores, "batch_size": choice.batch_size, "decode": decode.place,
            "decode_why": decode.why,
            "stages_images_per_s_per_executor": {k: round(v, 1) for k, v in stages.items()},
            "bottleneck": bottleneck, "core_time_share": core_time, "images_per_s_per_executor": round(per_executor, 1),
            "images_per_s": round(rate, 1), "wall_s": round(images / rate, 1)}


def _profile_origin(profile, path: str | None) -> dict:
    """Where a plan's profile came from and how far to trust it: file or cache, host, date, load, repeatability."""
    from spark_cnn.perf_tools.calibration import describe_load
    from spark_cnn.perf_tools.pooled_profile import pooled_runs

    return {"file": path, "host": profile.host or None, "created": profile.created,
            "torch_version": profile.torch_version, "version": profile.version, "threads": profile.threads,
            "load": dict(profile.load), "load_summary": describe_load(profile.load),
            "repeatability": dict(profile.repeatability), "spread": profile.spread, "noisy": profile.noisy,
            "pooled_runs": pooled_runs(profile)}


def trust_line(origin: dict) -> str:
    """One line: which calibration, where and when, how busy its host was, how well it repeated (and a
    warning line when it was busy or kept noisy)."""
    where = f"from {origin['file']}" if origin.get("file") else "cached"
    if origin.get("pooled_runs", 1) > 1:
        where += f" (each point the median of its latest {origin['pooled_runs']} runs; the newest's fields)"
    rep = origin.get("repeatability") or {}
    repeat = (f"repeated within {rep['median_pct']}% (median of {rep['points']}; bound {rep['bound_pct']}%)"
              if rep.get("points") else "repeatability not recorded")
    if rep.get("anomalies"):
        repeat += f"; {rep['anomalies'][0]}"
    noisy = origin.get("noisy", rep.get("noisy", rep.get("forced", False)))
    if noisy:
        repeat += ", KEPT ALTHOUGH IMPLAUSIBLE" if rep.get("anomalies") else ", KEPT ALTHOUGH NOISY"
    line = (f"calibration {where}: {origin.get('host') or 'unknown host'}, {origin['created']}, torch "
            f"{origin['torch_version']}, profile v{origin['version']}; {origin['load_summary']}; {repeat}")
    if noisy and not rep.get("anomalies"):
        line += (f"\n  warning: a noisy calibration: predictions carry +-{100 * (origin.get('spread') or 0.0):.1f}%; "
                 "recalibrate on a quiet host for tighter ones (--strict refuses such a calibration)")
    elif (origin.get("load") or {}).get("busy") or noisy:
        line += "\n  warning: predictions from a busy or noisy calibration run slow; recalibrate on a quiet host"
    return line


def plan_report(plan: dict) -> str:
    stages = ", ".join(f"{k.replace('_', ' ')} {v} img/s" for k, v in plan["stages_images_per_s_per_executor"].items())
    weights = f" ({plan['weights']} weights)" if plan.get("weights") else ""
    bottleneck = plan["bottleneck"]
    if plan.get("core_time_share"):
        share = plan["core_time_share"]
        bottleneck += (f" (the executor's cores, shared: {100 * share['compute']:.0f}% of each image's core time "
                       f"computes, {100 * share['decode']:.0f}% decodes)")
    return (f"{plan['model']}{weights} on {plan['executors']} executor(s) x {plan['cores_per_executor']} cores "
            f"({plan['device_name']})\n"
            f"  {trust_line(plan['profile'])}\n"
            f"  batch size {plan['batch_size']}; decode in {plan['decode']} ({plan['decode_why']})\n"
            f"  per executor: {stages}\n"
            f"  bottleneck: {bottleneck}\n"
            f"  expected: {plan['images_per_s_per_executor']} img/s per executor, {plan['images_per_s']} img/s in "
            f"all ({plan['executors']} x); {plan['images']} images in about {plan['wall_s']} s (Spark start-up and "
            "output not included)")
