"""What `spark-cnn bench` prints and writes: a table per model, the targets, JSON, and a bar chart."""

from __future__ import annotations

import json
import statistics

from spark_cnn.bench.cputime import KINDS
from spark_cnn.bench.detect_check import summary_line
from spark_cnn.bench.device_budget import decode_ms_per_image
from spark_cnn.bench.spread import paired_ratios
from spark_cnn.bench.variants import IDENTITY_MODEL, SIDECAR_DECODE_VARIANT, SPARK_CNN_VARIANTS, VARIANTS
from spark_cnn.errors import missing_extra
from spark_cnn.models.device_curve import SIM_PREFIX

# The project's throughput targets on the 2-core machine (docs/benchmarks.md): (what, ratio needed, models it
# applies to; None: every real model, not the near-free one; EVERY_MODEL: the near-free one too). With the
# near-free model the limit is decoding alone and what is missing from it is the framework's own cost, as
# against the peers.
EVERY_MODEL = ("*",)
TARGETS = (
    ("spark_cnn / limit", "spark_cnn", "limit", 0.9, None),
    ("spark_cnn / decode-only limit", "spark_cnn", "limit", 0.85, (IDENTITY_MODEL,)),
    ("spark_cnn / predict_batch_udf", "spark_cnn", "predict_batch_udf", 2.0, (IDENTITY_MODEL,)),
    ("spark_cnn / predict_batch_udf", "spark_cnn", "predict_batch_udf", 1.8, ("mobilenet_v3_small",)),
    ("spark_cnn / bare", "spark_cnn", "bare", 1.3, ("mobilenet_v3_small",)),
    ("spark_cnn / ray_data", "spark_cnn", "ray_data", 1.5, EVERY_MODEL),
    ("spark_cnn / daft", "spark_cnn", "daft", 1.5, EVERY_MODEL),
)


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def _applies(models: tuple[str, ...] | None, model: str) -> bool:
    if models is EVERY_MODEL:
        return True
    if models is None:  # the real models: neither the near-free one nor a simulated device (no model limit)
        return model != IDENTITY_MODEL and not model.startswith(SIM_PREFIX)
    return model in models


def target_lines(entry: dict) -> list[str]:
    """One line per target that applies to this model: the ratio measured and whether it is met. Over several
    rounds the ratio is the median of the per-round ratios (bench/spread.py), and the line says whether every
    round met it."""
    results, memory, lines = entry["results"], entry.get("memory_mb", {}), []
    rounds = entry.get("rounds")
    for name, top, bottom, needed, models in TARGETS:
        if not _applies(models, entry["model"]) or top not in results or bottom not in results:
            continue  # not this model's target, or a variant not run (not asked for, or its package missing)
        if rounds:
            paired = [r for r in paired_ratios(rounds, top, bottom) if r is not None]
            ratio = statistics.median(paired) if paired else None
        else:
            paired, ratio = [], _ratio(results.get(top), results.get(bottom))
        lines.append(_target_line(name, ratio, needed, paired, len(rounds or [])))
        if bottom == "limit" and (steady := _steady_ratios(entry, top)):
            lines.append(_target_line("  the same at steady state", statistics.median(steady), needed, steady,
                                      len(rounds or [])))
        if bottom == "limit" and (share := _useful_share_line(entry, top)):
            lines.append(share)
    ours, theirs = memory.get("spark_cnn"), memory.get("predict_batch_udf")
    if ours and theirs:
        verdict = "met" if ours <= theirs else "MISSED"
        lines.append(f"  {'memory spark_cnn / pbu':32s} {ours / theirs:6.2f}  (<= 1.0: {verdict})")
    return lines


def _target_line(name: str, ratio: float | None, needed: float, paired: list[float], rounds: int) -> str:
    verdict = "n/a" if ratio is None else ("met" if ratio >= needed else "MISSED")
    if rounds and paired:
        short = sum(r < needed for r in paired)
        verdict += (f", met in every round (min {min(paired):.2f})" if not short
                    else f", missed in {short} of {rounds} rounds (min {min(paired):.2f})")
    return f"  {name:32s} {'n/a' if ratio is None else f'{ratio:.2f}':>6s}  (>= {needed}: {verdict})"


def _useful_share_line(entry: dict, variant: str) -> str | None:
    """`variant`'s useful share of the cores' time (bench/device_budget.useful_share): the limit's ratio with the
    decode and model costs measured inside the run itself, round by round, so that the host's drift between
    the run and the limit's measurement cancels. A yardstick for changes, not the target's verdict."""
    shares = [share for share in (entry.get("useful_share") or {}).get(variant) or [] if share]
    if not shares:
        return None
    spread = f" (rounds {min(shares):.2f}-{max(shares):.2f})" if len(shares) > 1 else ""
    split = (entry.get("cores_time_ms_per_image") or {}).get(variant)
    where = ("; the cores' time an image, median round: " + ", ".join(f"{part} {ms:.2f}" for part, ms in split.items())
             + " ms") if split else ""
    return (f"  {'  useful share of the cores':32s} {statistics.median(shares):6.2f}{spread}: its decoding and "
            f"model CPU, measured in the run, times its rate, over the cores{where}")


def _steady_ratios(entry: dict, variant: str) -> list[float]:
    """`variant`'s rate at steady state (bench/device_budget.steady_rate) over the limit, within each round."""
    steady = (entry.get("steady_state_rates") or {}).get(variant) or []
    limits = [r.get("limit") for r in entry["rounds"]] if entry.get("rounds") else [entry["results"].get("limit")]
    return [round(rate / limit, 4) for rate, limit in zip(steady, limits, strict=False) if rate and limit]


def steady_lines(entry: dict) -> list[str]:
    """The spark_cnn variants' rates at steady state: what a long job sustains once each job's fixed cost is
    taken out (two jobs of one session; bench/device_budget.steady_rate)."""
    lines = []
    for variant, rates in (entry.get("steady_state_rates") or {}).items():
        steady = entry.get("details", {}).get(variant, {}).get("steady_state") or {}
        measured = [rate for rate in rates if rate]
        if not measured or steady.get("job_s") is None:
            continue
        low, high = min(measured), max(measured)
        lines.append(f"  {variant} at steady state: {statistics.median_low(measured):.1f} img/s"
                     + (f" (rounds {low:.1f}-{high:.1f})" if len(measured) > 1 else "")
                     + f", from jobs of {steady['images'][0]} and {steady['images'][1]} images (the longer's "
                     f"extra images over its extra seconds); each job costs {steady['job_s']:.2f} s besides"
                     + _steady_cpu_note(steady))
    return lines


def _steady_cpu_note(steady: dict) -> str:
    """'; CPU ms an image: jvm J, python_worker W, ...' at steady state (the median round's), where measured."""
    ms = {kind: value for kind, value in (steady.get("ms_per_image") or {}).items() if value}
    if not ms:
        return ""
    total = ms.pop("total", None)
    return ("; CPU ms an image: " + ", ".join(f"{kind} {value:.2f}" for kind, value in sorted(ms.items()))
            + (f", total {total:.2f}" if total else ""))


def table(entry: dict) -> str:
    results, memory, details = entry["results"], entry.get("memory_mb", {}), entry.get("details", {})
    ours = results.get("spark_cnn")
    spread = entry.get("spread") or {}
    rounds = f", median of {len(entry['rounds'])} rounds" if entry.get("rounds") else ""
    lines = [f"{entry['model']}: {entry['images']} images per variant{rounds}, master local[2], {entry['machine']}",
             f"  {'variant':24s} {'images/s':>9s} {'x spark_cnn':>11s} {'peak MB (RSS)':>13s} {'seconds':>8s}"
             + (f" {'min-max images/s (spread)':>28s}" if spread else "")]
    for variant in VARIANTS:
        if variant not in results:
            continue
        rate = results[variant]
        ratio = _ratio(rate, ours)
        seconds = details.get(variant, {}).get("elapsed_s")
        lines.append(f"  {variant:24s} {'failed' if rate is None else f'{rate:9.1f}':>9s} "
                     f"{'' if ratio is None else f'{ratio:.2f}':>11s} "
                     f"{'' if memory.get(variant) is None else f'{memory[variant]:.0f}':>13s} "
                     f"{'' if seconds is None else f'{seconds:.1f}':>8s}"
                     + (f" {_spread_cell(spread.get(variant)):>28s}" if spread else ""))
    lines += cpu_lines(entry)
    lines += limit_lines(details.get("limit", {}), ours)
    lines += beyond_decoding_lines(entry)
    lines += budget_lines(entry)
    ours_detail = details.get("spark_cnn", {})
    if ours_detail.get("batch_size"):
        lines.append(f"  spark_cnn: batch size {ours_detail['batch_size']}, mean batch "
                     f"{ours_detail.get('mean_batch_size')}, decode in {ours_detail.get('decode')}"
                     + _forward_note(ours_detail))
    lines += steady_lines(entry)
    if entry.get("row_check"):
        lines.append(summary_line(entry["row_check"]))
    return "\n".join(lines + target_lines(entry))


def _forward_note(detail: dict) -> str:
    """The sidecar's CPU per image in its forwards (its compute threads' own time) and in the rest, its serving.

    >>> _forward_note({"images": 100, "compute_cpu_s": 0.3, "cpu_ms_per_image": {"sidecar": 4.0}})
    '; sidecar 4.00 ms an image: forward 3.00, serving 1.00'
    """
    images, sidecar = detail.get("images"), (detail.get("cpu_ms_per_image") or {}).get("sidecar")
    if not images or not detail.get("compute_cpu_s") or sidecar is None:
        return ""
    forward = 1000.0 * detail["compute_cpu_s"] / images
    return f"; sidecar {sidecar:.2f} ms an image: forward {forward:.2f}, serving {sidecar - forward:.2f}"


def limit_lines(limit: dict, ours: float | None) -> list[str]:
    """How the limit was made: side by side (every core busy at once, the limit) and alone (one core at a time)."""
    if not limit.get("decode_per_s_one_core"):
        return []
    side = limit.get("side_by_side")
    alone = limit.get("images_per_s_alone") or limit.get("images_per_s")
    if not limit.get("model_per_s_by_threads"):
        lines = [f"  limit = {limit['cores']} cores x decode on a core: the model is near-free"]
        if side:
            lines.append(f"    side by side ({side['decoders']} decoding at once{_windows_note(side)}): "
                         f"{side['decode_per_s_per_core']:.1f} "
                         f"img/s per core ({1000 / side['decode_per_s_per_core']:.2f} CPU ms per image)")
        lines.append(f"    alone: {limit['decode_per_s_one_core']:.1f} img/s on one core "
                     f"({1000 / limit['decode_per_s_one_core']:.2f} CPU ms per image)"
                     + (f" = {alone:.1f} img/s" if alone else ""))
        return lines
    model_rates = ", ".join(f"{t} thread(s) {r:.1f}" for t, r in limit["model_per_s_by_threads"].items())
    lines = [f"  limit = {limit['cores']} cores / (1/decode + min over threads t of t/model), batch "
             f"{limit['model_batch_size']}"]
    if side:
        lines.append(f"    side by side (the limit{_windows_note(side)}): decode "
                     f"{side['decode_per_s_per_core']:.1f} img/s a core beside the model, model "
                     f"{side['model_per_s_one_thread']:.1f} img/s on 1 thread beside decoding "
                     f"= {limit['images_per_s']:.1f} img/s")
    lines.append(f"    alone: decode {limit['decode_per_s_one_core']:.1f} img/s on one core; model {model_rates} img/s "
                 + (f"= {alone:.1f} img/s" if alone else "") + (f" (spark_cnn / lone-core limit {ours / alone:.2f})"
                                          if side and ours and alone else ""))
    return lines


def _windows_note(side: dict) -> str:
    """', median of N windows, MIN-MAX img/s' where the side-by-side limit was measured more than once."""
    rates = [window["images_per_s"] for window in side.get("windows") or ()]
    if len(rates) < 2:
        return ""
    return f", median of {len(rates)} windows {min(rates):.1f}-{max(rates):.1f} img/s"


def _spread_cell(spread: dict | None) -> str:
    if not spread:
        return "failed"
    failed = f", {spread['failed']} failed" if spread["failed"] else ""
    return f"{spread['min']:.1f}-{spread['max']:.1f} ({100 * spread['spread']:.1f}%{failed})"


def beyond_decoding_lines(entry: dict) -> list[str]:
    """For the near-free model or a simulated device: each spark_cnn variant's CPU per image beyond decoding (its
    total less the limit's decode on one core), what the framework costs a host; with the sidecar decoding, what a
    GPU host pays besides nvJPEG."""
    limit = entry.get("details", {}).get("limit", {})
    cpu = entry.get("cpu_ms_per_image", {})
    near_free = entry["model"] == IDENTITY_MODEL or entry["model"].startswith(SIM_PREFIX)
    decode_ms = decode_ms_per_image(limit)
    if not near_free or decode_ms is None:
        return []
    return [f"  {variant}: {cpu[variant]['total'] - decode_ms:.2f} CPU ms per image beyond decoding "
            f"({cpu[variant]['total']:.2f} - {decode_ms:.2f})"
            for variant in SPARK_CNN_VARIANTS if (cpu.get(variant) or {}).get("total")]


def budget_lines(entry: dict) -> list[str]:
    """A GPU node's CPU budget per variant (bench/device_budget.py): CPU per image beyond decoding by process,
    and cores per 1k images/s in all and for the framework alone, against the target."""
    budgets = entry.get("device_budget") or {}
    if not budgets:
        return []
    kinds = [k for k in KINDS if any(k in b["beyond_decoding_ms_per_image"] for b in budgets.values())]
    lines = [f"  {'beyond decoding, ms/img':24s} {'decode in':>13s} " + " ".join(f"{k:>13s}" for k in kinds)
             + f" {'cores/1k img/s':>15s} {'framework':>10s}"]
    for variant, b in budgets.items():
        beyond = b["beyond_decoding_ms_per_image"]
        lines.append(f"  {variant:24s} {b['decode_place']:>13s} "
                     + " ".join(f"{beyond[k]:13.2f}" if k in beyond else f"{'':13s}" for k in kinds)
                     + f" {b['cores_per_1k_img_s']:15.2f} {b['framework_cores_per_1k_img_s']:10.2f}"
                     + f"  (<= {b['framework_target_ms_per_image']}: "
                     + ("met" if b["framework_target_met"] else "MISSED") + ")")
    for variant, b in budgets.items():
        basis = b.get("basis", "whole run")
        if basis == "steady state":
            basis += (f" (a shorter job in the same session; {b['per_job_cpu_s']:.2f} CPU-s per job besides, "
                      f"{b['whole_run_cpu_ms_per_image']:.2f} ms per image over the whole measured run)")
        lines.append(f"  {variant}: {basis}; decoding {b['decode_ms_per_image']:.2f} ms per image, measured in "
                     f"{b.get('decode_measured_in', 'the limit: one core, alone')}"
                     + (f" (with the limit's decoding instead: {b['framework_ms_per_image_at_limit_decode']:.2f} ms "
                        "of framework)" if b.get("framework_ms_per_image_at_limit_decode") is not None else ""))
        by_round = [r.get(variant) for r in entry.get("framework_ms_per_image_by_round") or []]
        if by_round:
            met = sum(ms is not None and ms <= b["framework_target_ms_per_image"] for ms in by_round)
            lines.append(f"  {variant}: framework ms per image by round "
                         + " ".join("n/a" if ms is None else f"{ms:.2f}" for ms in by_round)
                         + f" (<= {b['framework_target_ms_per_image']} in {met} of {len(by_round)})")
    return lines


def cpu_lines(entry: dict) -> list[str]:
    """CPU milliseconds per image of each variant's measured run, by process kind (empty without samples)."""
    cpu = {v: ms for v, ms in entry.get("cpu_ms_per_image", {}).items() if ms}
    if not cpu:
        return []
    kinds = [k for k in KINDS if any(k in ms for ms in cpu.values())]
    lines = [f"  {'CPU ms per image':24s} " + " ".join(f"{k:>13s}" for k in [*kinds, "total"])]
    for variant in (v for v in VARIANTS if v in cpu):
        lines.append(f"  {variant:24s} " + " ".join(
            f"{cpu[variant][k]:13.2f}" if k in cpu[variant] else f"{'':13s}" for k in [*kinds, "total"]))
    return lines


def write_json(path: str, entries: list[dict]) -> None:
    """One model: the entry itself (README's bench JSON); several: a list of entries, one per model."""
    with open(path, "w") as f:
        json.dump(entries[0] if len(entries) == 1 else entries, f, indent=2, default=str)


def plot(path: str, entries: list[dict]) -> None:
    """Grouped bars: images/s per variant, one group per model; `limit` hatched; ratios to spark_cnn on top."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        raise missing_extra("matplotlib", "plot", "--plot") from e

    fig, axes = plt.subplots(1, len(entries), figsize=(5.5 * len(entries), 4.2), squeeze=False)
    colours = {"bare": "#8c8c8c", "row": "#c4a35a", "predict_batch_udf": "#d9822b", "spark_cnn": "#2b6cb0",
               SIDECAR_DECODE_VARIANT: "#5b8fd0",
               "ray_data": "#6b9e5b", "daft": "#8a6bb0", "limit": "#ffffff"}
    for ax, entry in zip(axes[0], entries, strict=True):
        names = [v for v in VARIANTS if entry["results"].get(v) is not None]
        rates = [entry["results"][v] for v in names]
        bars = ax.bar(names, rates, color=[colours[v] for v in names], edgecolor="black")
        ours = entry["results"].get("spark_cnn")
        for bar, name, rate in zip(bars, names, rates, strict=True):
            if name == "limit":
                bar.set_hatch("//")
            label = f"{rate:.0f}" + (f"\n{rate / ours:.2f}x" if ours else "")
            ax.annotate(label, (bar.get_x() + bar.get_width() / 2, rate), ha="center", va="bottom", fontsize=8)
        ax.set_title(f"{entry['model']} ({entry['images']} images, local[2])", fontsize=10)
        ax.set_ylabel("images/s")
        ax.set_ylim(0, max(rates) * 1.25 if rates else 1)
        ax.tick_params(axis="x", labelrotation=20, labelsize=8)
    fig.suptitle(f"spark-cnn bench: {entries[0]['machine']}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
