"""`spark-cnn bench`: every variant, per model, on the same images and machine, one after another in one run.

For each model: save random weights (reloaded by every variant), measure `limit` first, size the run from it
(enough images for at least MIN_STEADY_S of steady work at the limit rate, which every real variant is slower
than), then run each variant in its own process while samplers record the peak memory of that process's
whole tree and the CPU time of each of its processes; the CPU spent in the variant's measured run, by process
kind, divided by its images, is its CPU per image. Whatever a variant leaves running is killed and reported.

`identity` is a near-free model (bench/tiny.py), saved as a TorchScript file that every variant loads as it
loads a user's model; its limit is the decode-only rate of the cores, so what each variant reaches of it shows
what the framework itself costs per image.

A simulated device (`sim:CURVE`, models/simulated.py: a device's time per batch, no host CPU) runs the two
spark_cnn variants only, tasks decoding and the sidecar decoding, at a fixed batch size; with `identity` its entry
adds each variant's CPU per image beyond decoding and cores per 1k images/s (bench/device_budget.py).

A detector (a torchvision detection builder) runs spark_cnn's `detect` job against predict_batch_udf on images of
several shapes (no limit: its model is not one fixed-size forward), then checks that both wrote the same boxes
(bench/detect_check.py); the classifier-only variants are skipped with one line.
"""

from __future__ import annotations

import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace

from spark_cnn.bench.cputime import TreeCpuSampler, cpu_seconds_by_kind, per_image_ms, snapshot_from_json
from spark_cnn.bench.dataset import DEFAULT_DATA_DIR, DETECT_SHAPES, input_dir
from spark_cnn.bench.detect_check import check_outputs, summary_line
from spark_cnn.bench.device_budget import (
    cores_time_split,
    decode_ms_per_image,
    device_budget,
    steady_rate,
    steady_state,
    useful_share,
)
from spark_cnn.bench.memory import TreeMemorySampler, become_subreaper, reap_leftovers
from spark_cnn.bench.peers import missing_peer
from spark_cnn.bench.spread import median_round, rotated, spread_of
from spark_cnn.bench.variant_task import (
    LIMIT_BATCH_SIZES,
    LIMIT_WINDOWS,
    VariantTask,
    bench_task,
    random_torchvision,
)
from spark_cnn.bench.variants import (
    DEFAULT_VARIANTS,
    DETECT_VARIANTS,
    IDENTITY_MODEL,
    SIDECAR_DECODE_VARIANT,
    SPARK_CNN_VARIANTS,
    VARIANTS,
)
from spark_cnn.models.spec import model_kind
from spark_cnn.task.sidecar_env import sidecar_environment

DEFAULT_MODELS = ("mobilenet_v3_small", "resnet18")
# Steady work per variant in the full bench: at least 20 s, so start-up costs fade; sizing from the limit rate
# (an upper bound on every variant's rate) with this target leaves room for a machine that speeds up.
MIN_STEADY_S = 24.0
QUICK_IMAGES = 192
WARMUP_IMAGES = 64  # two partitions' worth: both Python workers start, load their model, reach the sidecar
ROUND_IMAGES_TO = 64
VARIANT_TIMEOUT_S = 900
# A detector's images per variant unless given: ~25 s of ssdlite320 with random weights on 2 CPU cores (~10 img/s,
# docs/benchmarks.md), so start-up costs fade.
DETECT_IMAGES = 256
# A simulated device's images per variant unless given: a job costs ~2 s of JVM CPU (docs/benchmarks.md) whatever
# its size, so 8,192 images (~20 s at this host's ~450 img/s) keep that under 0.25 ms per image, and the 2,048
# distinct files the dataset makes are read four times over (no more images to generate).
SIM_IMAGES = 8192
# A simulated device's batch size: the smaller of the two H200 points its built-in curve comes from, and a
# fixed size keeps the online tuner's trials out of the CPU compared between runs.
SIM_BATCH_SIZE = 64
# What a simulated device runs: the two places a GPU node decodes (tasks, or the sidecar as nvJPEG would), and
# the decode-only limit, whose decode cost per image is taken out of the CPU per image.
SIM_VARIANTS = ("spark_cnn", SIDECAR_DECODE_VARIANT, "limit")
# A detector's warm-up: enough files for both Python workers to start and load their model, at a detector's
# ~10 img/s on a CPU.
DETECT_WARMUP_IMAGES = 16


@dataclass(frozen=True)
class BenchConfig:
    models: tuple[str, ...] = DEFAULT_MODELS
    images: int | None = None   # per model; None: sized from the limit (full) or QUICK_IMAGES (quick)
    quick: bool = False
    variants: tuple[str, ...] = DEFAULT_VARIANTS
    data_dir: str = DEFAULT_DATA_DIR
    repeats: int = 1  # rounds of every variant; more than one reports each figure's spread (bench/spread.py)


def machine_info() -> str:
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{os.cpu_count()} CPU cores{', ' + model if model else ''}, {platform.machine()}, {platform.system()}"


def images_for(limit_per_s: float | None, config: BenchConfig) -> int:
    """Images per variant: given, or the quick count, or enough for MIN_STEADY_S at the limit rate."""
    if config.images:
        return config.images
    if config.quick or not limit_per_s:
        return QUICK_IMAGES
    return max(ROUND_IMAGES_TO, math.ceil(limit_per_s * MIN_STEADY_S / ROUND_IMAGES_TO) * ROUND_IMAGES_TO)


def _images(simulated: bool, limit_per_s: float | None, config: BenchConfig) -> int:
    """Images per variant: a simulated device's fixed count (its limit has no model), else sized from the limit."""
    if simulated:
        return config.images or (QUICK_IMAGES if config.quick else SIM_IMAGES)
    return images_for(limit_per_s, config)


def _save_model(model: str, folder: str) -> tuple[str, str | None]:
    """(model source, weights file) every variant reloads: random torchvision weights saved once, or the
    near-free model as a TorchScript file (no weights file)."""
    import torch

    if model_kind(model) == "simulated":
        return model, None  # nothing to save: every variant builds it from its name
    if model == IDENTITY_MODEL:
        from spark_cnn.bench.tiny import save_identity_torchscript

        return save_identity_torchscript(os.path.join(folder, f"{model}.pt")), None
    torch.manual_seed(0)
    path = os.path.join(folder, f"{model}.pth")
    torch.save(random_torchvision(model).state_dict(), path)
    return model, path


def variant_environment(task: VariantTask) -> dict[str, str]:
    """The environment a variant's process starts with. The limit times the sidecar's runner, so it runs with
    the sidecar's allocator (SIDECAR_MALLOC_ENV; its decoders are spawned without it, as tasks run); without
    it glibc maps and unmaps each large activation, and mobilenet_v3_small's batch of 32 at one thread ran
    3.63-3.93 ms an image against 3.12 (docs/benchmarks.md, "A faster host"). Every other variant is a user's
    process, or starts its sidecar itself, and keeps the bench's environment."""
    return sidecar_environment() if task.variant == "limit" else dict(os.environ)


def run_variant(task: VariantTask, workdir: str) -> dict:
    """One variant in a fresh process; adds its peak memory, CPU per image by process kind, wall time and
    anything it left behind."""
    out = os.path.join(workdir, f"{os.path.basename(task.model)}-{task.variant}.json")
    started = time.perf_counter()
    with TreeMemorySampler() as sampler, TreeCpuSampler() as cpu:
        proc = subprocess.run([sys.executable, "-m", "spark_cnn.bench.variants", json.dumps(asdict(task)), out],
                              capture_output=True, text=True, timeout=VARIANT_TIMEOUT_S, env=variant_environment(task))
    wall_s = time.perf_counter() - started
    leftovers = reap_leftovers()
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-8:])
        return {"images_per_s": None, "error": f"exit {proc.returncode}: {tail}", "wall_s": wall_s,
                "leftover_processes": leftovers}
    with open(out) as f:
        result = json.load(f)
    result.pop("task", None)
    short = result.get("short_run")
    marks = [snapshot_from_json(mark) for mark in result.pop("window_snapshots", [])
             + (short.pop("window_snapshots", []) if short else [])]
    if result.get("measured_window"):
        snapshots = sorted(cpu.snapshots + marks, key=lambda snapshot: snapshot.at)
        measured = cpu_seconds_by_kind(snapshots, *result["measured_window"])
        result["cpu_ms_per_image"] = per_image_ms(measured, result.get("images", 0))
        if short and short.get("images", 0) < result.get("images", 0):
            short_cpu = cpu_seconds_by_kind(snapshots, *short["measured_window"])
            steady = steady_state(short_cpu, short["images"], measured, result["images"])
            steady.update(steady_rate(short["images"], short["elapsed_s"], result["images"], result["elapsed_s"]))
            # the sidecars' own decoding CPU, per image at steady state the same way (0 where tasks decode)
            steady["sidecar_decode_ms_per_image"] = round(
                1000.0 * max(0.0, result.get("decode_cpu_s", 0.0) - short.get("decode_cpu_s", 0.0))
                / (result["images"] - short["images"]), 3)
            result["steady_state"] = steady
    result.update(peak_rss_mb=round(sampler.peak_rss / 2**20, 1),
                  peak_pss_mb=None if sampler.peak_pss is None else round(sampler.peak_pss / 2**20, 1),
                  peak_processes=sampler.peak_processes,
                  peak_rss_mb_by_process={k: round(v / 2**20, 1) for k, v in sampler.peak_rss_by_role.items()},
                  wall_s=round(wall_s, 1), leftover_processes=leftovers)
    return result


def run_bench(config: BenchConfig, log=print) -> list[dict]:
    """Run the bench; one entry per model: {"machine", "model", "images", "results", "memory_mb", "details"}."""
    become_subreaper()  # sidecars started by Spark workers stay in this tree: counted, and reaped if left
    machine = machine_info()
    entries = []
    with tempfile.TemporaryDirectory(prefix="spark_cnn_bench_") as workdir:
        warmup = input_dir(WARMUP_IMAGES, config.data_dir)
        real = [model for model in config.models if model_kind(model) != "simulated"]  # whose batch size is tuned
        if {"spark_cnn", SIDECAR_DECODE_VARIANT} & set(config.variants) and not config.quick and real:
            log(ensure_device_profile())
        for model in config.models:
            source, weights = _save_model(model, workdir)
            if bench_task(model) == "detect":
                entries.append(run_detector(model, source, weights, config, workdir, machine, log))
                continue
            simulated = model_kind(model) == "simulated"
            base = VariantTask(variant="limit", model=source, weights=weights, input=input_dir(256, config.data_dir),
                               warmup_input=warmup, images=0, measure_s=1.5 if config.quick else 4.0,
                               limit_batch_sizes=(16,) if config.quick else LIMIT_BATCH_SIZES,
                               limit_windows=1 if config.quick else LIMIT_WINDOWS,
                               measure_model=not near_free(model),
                               **({"batch_size": SIM_BATCH_SIZE, "decode": "task"} if simulated else {}))
            variants = [v for v in VARIANTS if v in config.variants]
            if simulated and (skipped := [v for v in variants if v not in SIM_VARIANTS]):
                log(f"{model}: skipping {' '.join(skipped)} (a simulated device runs {' and '.join(SIM_VARIANTS)})")
                variants = [v for v in variants if v in SIM_VARIANTS]
            rounds = []
            for index in range(config.repeats):
                if config.repeats > 1:
                    log(f"{model}: round {index + 1} of {config.repeats}")
                details = {}
                if index == 0:  # the first round measures the limit first: the images per variant are sized from it
                    if "limit" in variants:
                        log(f"{model}: limit (decode alone, model alone) ...")
                        details["limit"] = run_variant(base, workdir)
                    images = _images(simulated, details.get("limit", {}).get("images_per_s"), config)
                    folder = input_dir(images, config.data_dir)
                    short_images = short_job_images(model, images)
                    short = ({"short_input": input_dir(short_images, config.data_dir), "short_images": short_images,
                              "short_after": not near_free(model)} if short_images else {})
                    log(f"{model}: {images} images per variant")
                order = rotated(variants, index)
                for variant in (v for v in order if v not in details):
                    if variant == "limit":
                        details["limit"] = run_variant(base, workdir)
                        continue
                    if skipped := missing_peer(variant):
                        if index == 0:
                            log(f"{model}: {skipped}")
                        continue
                    details[variant] = run_variant(replace(base, variant=variant, input=folder, images=images,
                                                           **short), workdir)
                    _log_result(model, variant, details[variant], log)
                rounds.append(details)
            entries.append(_entry(machine, model, images, rounds))
    return entries


def run_detector(model: str, source: str, weights: str | None, config: BenchConfig, workdir: str, machine: str,
                 log=print) -> dict:
    """A detector's entry: spark_cnn's detect job and predict_batch_udf on mixed-shape images, and the row check."""
    skipped = [v for v in config.variants if v not in DETECT_VARIANTS]
    if skipped:
        log(f"{model}: skipping {' '.join(skipped)} (classifier variants; a detector runs "
            f"{' and '.join(DETECT_VARIANTS)} only)")
    images = config.images or (QUICK_IMAGES if config.quick else DETECT_IMAGES)
    log(f"{model}: {images} images per variant, shapes {' '.join(f'{h}x{w}' for h, w in DETECT_SHAPES)}")
    base = VariantTask(variant="spark_cnn", model=source, weights=weights, task="detect", images=images,
                       input=input_dir(images, config.data_dir, DETECT_SHAPES),
                       warmup_input=input_dir(DETECT_WARMUP_IMAGES, config.data_dir, DETECT_SHAPES))
    details, outputs = {}, {}
    for variant in (v for v in DETECT_VARIANTS if v in config.variants):
        outputs[variant] = os.path.join(workdir, f"{model}-{variant}-rows")
        details[variant] = run_variant(replace(base, variant=variant, output=outputs[variant]), workdir)
        _log_result(model, variant, details[variant], log)
    entry = _entry(machine, model, images, details)
    entry["task"] = "detect"
    if len(outputs) == 2 and all(details[v]["images_per_s"] is not None for v in outputs):
        entry["row_check"] = check_outputs(outputs["spark_cnn"], outputs["predict_batch_udf"])
        log(f"{model}:{summary_line(entry['row_check'])}")
    return entry


def _log_result(model: str, variant: str, r: dict, log) -> None:
    rate = "failed" if r["images_per_s"] is None else f"{r['images_per_s']:.1f} img/s"
    log(f"{model}: {variant:24s} {rate}, peak {r.get('peak_rss_mb')} MB RSS, {r['wall_s']:.0f} s wall"
        + (f"  LEFT RUNNING (killed): {r['leftover_processes']}" if r.get("leftover_processes") else "")
        + (f"\n{r['error']}" if r.get("error") else ""))


def short_job_images(model: str, images: int) -> int:
    """Images of the spark_cnn variants' shorter job (a quarter of the measured one's): with it, the rate and
    CPU per image at steady state are told apart from the cost per job (device_budget.steady_state; a near-free
    model's CPU budget, every model's steady rate). 0 for runs too short to split.

    >>> short_job_images("sim:resnet50-h200", 8192), short_job_images("resnet18", 8192)
    (2048, 2048)
    """
    short = images // 4 // ROUND_IMAGES_TO * ROUND_IMAGES_TO
    return short if short >= WARMUP_IMAGES else 0


def near_free(model: str) -> bool:
    """Whether `model` costs the host nothing per image (identity, a simulated device): its limit is decoding."""
    return model == IDENTITY_MODEL or model_kind(model) == "simulated"


def _entry(machine: str, model: str, images: int, rounds: dict | list[dict]) -> dict:
    """One model's entry from its rounds (one round's details, or a list of them). With several rounds each
    variant's rate is its median, its details are those of its median round, and "rounds" and "spread" keep every
    round's rates and each variant's spread."""
    rounds = [rounds] if isinstance(rounds, dict) else rounds
    ran = [v for v in VARIANTS if any(v in details for details in rounds)]
    rates = {v: [details.get(v, {}).get("images_per_s") for details in rounds] for v in ran}
    details = {v: rounds[index][v] if (index := median_round(rates[v])) is not None
               else next(d[v] for d in rounds if v in d) for v in ran}
    entry = {
        "machine": machine, "model": model, "images": images,
        "results": {v: _rounded(details[v].get("images_per_s")) for v in ran},
        "memory_mb": {v: details[v].get("peak_rss_mb") for v in ran if v != "limit"},
        "cpu_ms_per_image": {v: details[v].get("cpu_ms_per_image") for v in ran if v != "limit"},
        "details": details,
    }
    if len(rounds) > 1:
        entry["rounds"] = [{v: _rounded(rates[v][index]) for v in ran} for index in range(len(rounds))]
        entry["spread"] = {v: spread_of(rates[v]) for v in ran}
    cores = next((d["limit"]["cores"] for d in rounds if d.get("limit", {}).get("cores")), os.cpu_count() or 1)
    shares = {v: [useful_share(r.get(v, {}), cores) for r in rounds] for v in ran if v in SPARK_CNN_VARIANTS}
    if any(share for v in shares for share in shares[v]):
        entry["useful_share"] = {v: values for v, values in shares.items() if any(values)}
        entry["cores_time_ms_per_image"] = {v: cores_time_split(details[v], cores) for v in entry["useful_share"]}
    steady = {v: [r.get(v, {}).get("steady_state", {}).get("images_per_s") for r in rounds] for v in ran}
    if any(rate for v in steady for rate in steady[v]):
        entry["steady_state_rates"] = {v: [_rounded(rate) for rate in steady[v]] for v in ran
                                       if any(steady[v])}
    if near_free(model):
        entry["device_budget"] = budgets(details)
        if len(rounds) > 1:  # each round's framework CPU per image: the budget's own spread
            entry["framework_ms_per_image_by_round"] = [
                {v: b["framework_cores_per_1k_img_s"] for v, b in budgets(round_details).items()}
                for round_details in rounds]
    return entry


def budgets(details: dict) -> dict:
    """Each spark_cnn variant's CPU beyond decoding and cores per 1k images/s: at steady state where the variant
    ran a shorter job too (`steady_state`), else over its whole run. Decoding is the sidecar's own decoding CPU
    where it decoded and measured it, else the limit's decode on one core."""
    limit_decode_ms = decode_ms_per_image(details.get("limit", {}))
    out = {}
    for variant in SPARK_CNN_VARIANTS:
        detail = details.get(variant, {})
        places = set(detail.get("decode") or [])
        if not detail.get("cpu_ms_per_image") or len(places) != 1:
            continue  # not run, failed, or its sidecars decoded in different places: nothing to take out
        place, steady = places.pop(), detail.get("steady_state")
        images = detail.get("images") or 0
        counted_by_sidecar = place == "sidecar" and bool(detail.get("decode_cpu_s")) and images > 0
        if place == "gpu":  # nvJPEG decodes on the device: the host CPU that drives it is the framework's
            decode_ms, measured_where = 0.0, "the device (nvJPEG; the host CPU driving it counts as framework)"
        elif counted_by_sidecar:
            decode_ms = (steady or {}).get("sidecar_decode_ms_per_image") or 1000.0 * detail["decode_cpu_s"] / images
            measured_where = "the sidecar's decoding threads"
        elif limit_decode_ms:
            decode_ms, measured_where = limit_decode_ms, _limit_decode_where(details["limit"])
        else:
            continue
        if steady:
            budget = device_budget(steady["ms_per_image"], decode_ms, place)
            budget.update(basis="steady state", per_job_cpu_s=steady["per_job_s"]["total"],
                          whole_run_cpu_ms_per_image=detail["cpu_ms_per_image"]["total"])
        else:
            budget = device_budget(detail["cpu_ms_per_image"], decode_ms, place, detail.get("images_per_s"))
            budget["basis"] = "whole run"
        budget["decode_measured_in"] = measured_where
        if counted_by_sidecar and limit_decode_ms:
            # the same CPU less the limit's decoding instead: the bound if the decoding threads' extra cost over
            # the limit's decoder (sharing cores with serving) were the framework's
            budget["framework_ms_per_image_at_limit_decode"] = round(budget["cores_per_1k_img_s"] - limit_decode_ms, 3)
        out[variant] = budget
    return out


def _limit_decode_where(limit: dict) -> str:
    return ("the limit: every core decoding side by side" if limit.get("side_by_side")
            else "the limit: one core, alone")


def ensure_device_profile() -> str:
    """Calibrate this host's CPU once (cached), as a deployment does, so the sidecar starts from the analytical
    model's batch size; outside every measured run. The quick bench skips it: the sidecar then starts from its
    default and the online tuner alone moves it."""
    from spark_cnn.perf.startpoint import cached_profile, profile_cache_dir
    from spark_cnn.perf_tools.calibration import calibrate
    profile = cached_profile("cpu")
    if profile is not None:
        return f"device profile {profile.key}: cached ({profile.created})"
    profile = calibrate("cpu", cache_dir=profile_cache_dir())
    return f"device profile {profile.key}: calibrated in {profile.calibration_s:.1f} s"


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
