"""`spark-cnn bench-scale`: what the framework costs per file and per job at big-data sizes.

Over N small real images (bench/scale_data.py) and the near-free model, with master local[2]:

- planning: from the job's call to its first inference task (checking the model, listing N files, building
  the input's partitions, shipping the model), and from the process start (adds the session's start-up,
  which does not grow with N);
- the driver's peak memory (the Python driver and the JVM, which in local mode is also the executor);
- steady-state images/s at N against the same at BASELINE_FILES, from the tasks' own times in Spark's event
  log (`steady_rate`: the first wave of tasks pays the workers' and the sidecar's start, so it is left out);
- the output: files, bytes, rows per file;
- what the summary costs after the write (publish and counts; the counts are gathered while writing) and what
  reading the output back cost before that (`readback_s`, measured after the job for comparison);
- `--etl`: one `spark-cnn etl` run over the same files (new checkpoint) against classify's rate on them;
- `--plan-only`: the listing and partitioning of N files and one Spark job over them, no inference (the
  planning and memory at a million files in a minute instead of the classify run's ~20).

Each measurement runs in its own process (`scale_job.py`) while TreeMemorySampler watches its tree.
"""

from __future__ import annotations

import glob
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from spark_cnn.bench.dataset import DEFAULT_DATA_DIR
from spark_cnn.bench.memory import TreeMemorySampler, become_subreaper, reap_leftovers
from spark_cnn.bench.scale_data import scale_input
from spark_cnn.bench.scale_job import ScaleTask
from spark_cnn.bench.suite import machine_info

DEFAULT_FILES = 1_000_000
QUICK_FILES = 20_000
BASELINE_FILES = 20_000  # the rate at N is judged against the rate here
JOB_TIMEOUT_S = 4 * 3600  # a million files at ~750 images/s is ~25 minutes here; leave room for slower hosts
# Targets for a million files on the 2-core development host (docs/benchmarks.md, "At big-data sizes").
MAX_PLANNING_S = 60.0
MAX_DRIVER_RSS_MB = 2048.0
MIN_RATE_RATIO = 0.9   # steady rate at N within 10% of the rate at BASELINE_FILES
MIN_ETL_RATIO = 0.8    # one etl run over N new files against classify on them
MAX_FILES_PER_10K_ROWS = 1.0  # output: at most one file per 10,000 rows (or a few per core; see output_ok)


@dataclass(frozen=True)
class ScaleConfig:
    files: int = DEFAULT_FILES
    quick: bool = False  # one classify run at `files`, no baseline
    plan_only: bool = False
    etl: bool = False
    data_dir: str = DEFAULT_DATA_DIR
    master: str = "local[2]"
    cores: int = 2


# ---- reading Spark's event log (pure) ------------------------------------------------------------------------


def read_events(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def tasks_of(events: Iterable[dict]) -> list[dict]:
    """One entry per finished, successful task: stage, launch and finish (epoch ms), records written."""
    tasks = []
    for event in events:
        if event.get("Event") != "SparkListenerTaskEnd":
            continue
        info = event.get("Task Info", {})
        if info.get("Failed") or info.get("Killed"):
            continue
        output = (event.get("Task Metrics") or {}).get("Output Metrics") or {}
        tasks.append({"stage": event.get("Stage ID"), "launch_ms": info["Launch Time"],
                      "finish_ms": info["Finish Time"], "records": int(output.get("Records Written", 0))})
    return tasks


def inference_tasks(tasks: list[dict]) -> list[dict]:
    """The tasks of the stage that wrote the output rows (the most records: the job's mapInArrow + write); where
    nothing was written (--plan-only), of the stage with the most tasks (the scan of the listed files)."""
    written: dict[int, int] = {}
    counts: dict[int, int] = {}
    for task in tasks:
        written[task["stage"]] = written.get(task["stage"], 0) + task["records"]
        counts[task["stage"]] = counts.get(task["stage"], 0) + 1
    if not written:
        return []
    stage = max(written, key=written.get) if max(written.values()) > 0 else max(counts, key=counts.get)
    return [task for task in tasks if task["stage"] == stage]


def steady_rate(tasks: list[dict], slots: int) -> dict:
    """Images/s of a stage's tasks on `slots` cores: `job` over the stage's whole span; `steady` leaves out the
    first wave (the first `slots` tasks to launch, which pay the Python workers' and the sidecar's start): rows
    per task-second of the later tasks, times the slots. With a single wave, `steady` is the job rate.

    >>> tasks = [{"launch_ms": 0, "finish_ms": 2000, "records": 100}, {"launch_ms": 0, "finish_ms": 2100,
    ...          "records": 100}, {"launch_ms": 1998, "finish_ms": 3000, "records": 100},
    ...          {"launch_ms": 2100, "finish_ms": 3100, "records": 100}]
    >>> steady_rate(tasks, slots=2)
    {'tasks': 4, 'slots': 2, 'job': 129.03, 'steady': 199.8, 'first_launch_ms': 0}
    """
    if not tasks:
        return {"tasks": 0, "slots": slots, "job": None, "steady": None, "first_launch_ms": None}
    ordered = sorted(tasks, key=lambda t: t["launch_ms"])
    first_launch = ordered[0]["launch_ms"]
    span_s = (max(t["finish_ms"] for t in tasks) - first_launch) / 1000
    records = sum(t["records"] for t in tasks)
    job = records / span_s if span_s > 0 and records else None
    # By launch order, not by time: Spark may launch the next task a few ms before it records the finish of the
    # task whose core it takes.
    later = ordered[slots:]
    busy_s = sum(t["finish_ms"] - t["launch_ms"] for t in later) / 1000
    steady = slots * sum(t["records"] for t in later) / busy_s if later and busy_s > 0 and records else job
    return {"tasks": len(tasks), "slots": slots, "job": _round(job), "steady": _round(steady),
            "first_launch_ms": first_launch}


def first_task_ms(events: Iterable[dict], since_ms: int) -> int | None:
    """When the first task launched at or after `since_ms` (epoch ms)."""
    launches = [e["Task Info"]["Launch Time"] for e in events
                if e.get("Event") == "SparkListenerTaskStart" and e["Task Info"]["Launch Time"] >= since_ms]
    return min(launches, default=None)


def output_stats(folder: str) -> dict:
    """Parquet files under `folder` (hidden names skipped, as readers skip them), their bytes and rows."""
    import pyarrow.parquet as pq

    paths = [p for p in glob.glob(os.path.join(folder, "**", "*.parquet"), recursive=True)
             if not any(part.startswith(("_", ".")) for part in os.path.relpath(p, folder).split(os.sep))]
    sizes = [os.path.getsize(p) for p in paths]
    rows = sum(pq.read_metadata(p).num_rows for p in paths)
    return {"files": len(paths), "bytes": sum(sizes), "rows": rows,
            "rows_per_file": round(rows / len(paths), 1) if paths else None,
            "mean_file_mb": round(sum(sizes) / len(paths) / 2**20, 3) if paths else None}


def output_ok(stats: dict, *, cores: int) -> bool:
    """No tiny-file explosion: at most one output file per 10,000 rows, or three per core (the partitions
    a small input needs to keep the cores busy)."""
    allowed = max(3 * cores, math.ceil(stats["rows"] / 10_000 * MAX_FILES_PER_10K_ROWS))
    return stats["files"] <= allowed


# ---- running -------------------------------------------------------------------------------------------------


def measure(task: ScaleTask, workdir: str, *, cores: int) -> dict:
    """One scale_job run in a fresh process; adds its peak memory by process kind and its event-log timings."""
    out = os.path.join(workdir, f"{task.mode}-{os.path.basename(task.input)}.json")
    started_ms = int(time.time() * 1000)
    with TreeMemorySampler() as sampler:
        proc = subprocess.run([sys.executable, "-m", "spark_cnn.bench.scale_job", json.dumps(asdict(task)), out],
                              capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    leftovers = reap_leftovers()
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-12:])
        raise RuntimeError(f"bench-scale {task.mode} over {task.input} failed (exit {proc.returncode}):\n{tail}")
    with open(out) as f:
        result = json.load(f)
    logs = glob.glob(os.path.join(task.event_log_dir, f"{result['app_id']}*"))
    events = read_events(logs[0]) if logs else []
    call_ms = result["call_started_ms"]
    first = first_task_ms(events, call_ms)
    inference = steady_rate(inference_tasks(tasks_of(events)), slots=cores)
    peaks = {kind: round(value / 2**20, 1) for kind, value in sampler.peak_rss_of_role.items()}
    result.update(
        process_started_ms=started_ms,
        first_task_s=None if first is None else round((first - call_ms) / 1000, 3),
        first_inference_task_s=(None if inference["first_launch_ms"] is None
                                else round((inference["first_launch_ms"] - call_ms) / 1000, 3)),
        start_to_first_task_s=None if first is None else round((first - started_ms) / 1000, 3),
        rate=inference, peak_rss_mb=peaks,
        driver_rss_mb=round(peaks.get("driver", 0) + peaks.get("jvm", 0), 1),
        leftover_processes=leftovers)
    if task.mode != "plan":
        result["output"] = output_stats(task.output)
    if task.mode == "classify":
        last_finish = max((t["finish_ms"] for t in inference_tasks(tasks_of(events))), default=None)
        # after the last task: the write's commit, publishing, the counts and the summary file
        result["after_tasks_s"] = (None if last_finish is None
                                   else round((call_ms + result["call_s"] * 1000 - last_finish) / 1000, 3))
    return result


def run_scale_bench(config: ScaleConfig, log=print) -> dict:
    """The measurements the config asks for; returns the report's JSON (also what `table` prints)."""
    become_subreaper()
    files = config.files
    report: dict = {"machine": machine_info(), "master": config.master, "files": files, "runs": {}}
    with tempfile.TemporaryDirectory(prefix="spark_cnn_scale_") as workdir:
        def task(mode: str, n: int) -> ScaleTask:
            folder = scale_input(n, config.data_dir, log=log)
            return ScaleTask(mode=mode, input=folder, output=os.path.join(workdir, f"{mode}-{n}"),
                             event_log_dir=os.path.join(workdir, "events"), files=n, master=config.master)

        if config.plan_only:
            log(f"plan only: listing and partitioning {files:,} files ...")
            report["runs"][f"plan-{files}"] = measure(task("plan", files), workdir, cores=config.cores)
            return report
        sizes = [files] if config.quick or files <= BASELINE_FILES else [BASELINE_FILES, files]
        for n in sizes:
            log(f"classify {n:,} files ...")
            report["runs"][f"classify-{n}"] = measure(task("classify", n), workdir, cores=config.cores)
        if config.etl:
            log(f"etl {files:,} new files ...")
            report["runs"][f"etl-{files}"] = measure(task("etl", files), workdir, cores=config.cores)
    report["targets"] = targets(report, cores=config.cores)
    return report


# ---- reporting -----------------------------------------------------------------------------------------------


def targets(report: dict, *, cores: int) -> list[dict]:
    """Each target that the runs measured: what, the value, the bound, met or not."""
    runs, n = report["runs"], report["files"]
    found = []

    def check(name: str, value, bound, ok: bool) -> None:
        found.append({"target": name, "value": value, "bound": bound, "met": ok})

    main = runs.get(f"classify-{n}") or runs.get(f"plan-{n}")
    if main is not None:
        planning = main.get("first_inference_task_s") or main.get("first_task_s")
        if planning is not None:
            check(f"planning at {n:,} files (s)", planning, f"<= {MAX_PLANNING_S:g}", planning <= MAX_PLANNING_S)
        check(f"driver peak RSS at {n:,} files (MB, Python + JVM)", main["driver_rss_mb"],
              f"<= {MAX_DRIVER_RSS_MB:g}", main["driver_rss_mb"] <= MAX_DRIVER_RSS_MB)
    base, big = runs.get(f"classify-{BASELINE_FILES}"), runs.get(f"classify-{n}")
    if base is not None and big is not None and base is not big:
        ratio = _ratio(big["rate"]["steady"], base["rate"]["steady"])
        check(f"steady rate {n:,} / {BASELINE_FILES:,} files", ratio, f">= {MIN_RATE_RATIO}",
              ratio is not None and ratio >= MIN_RATE_RATIO)
    if big is not None:
        check(f"output files for {big['output']['rows']:,} rows", big["output"]["files"],
              f"<= max({3 * cores}, rows/10,000)", output_ok(big["output"], cores=cores))
    etl = runs.get(f"etl-{n}")
    if etl is not None and big is not None:
        ratio = _ratio(n / etl["call_s"], n / big["call_s"])
        check(f"etl / classify rate over {n:,} new files (whole calls)", ratio, f">= {MIN_ETL_RATIO}",
              ratio is not None and ratio >= MIN_ETL_RATIO)
    return found


def table(report: dict) -> str:
    runs = report["runs"]
    names = list(runs)
    rows = [
        ("session start s", lambda r: r["session_s"]),
        ("call s", lambda r: r["call_s"]),
        ("listing s", lambda r: r.get("listing_s")),
        ("to first task s", lambda r: r.get("first_task_s")),
        ("to first inference task s", lambda r: r.get("first_inference_task_s")),
        ("process start to first task s", lambda r: r.get("start_to_first_task_s")),
        ("driver peak RSS MB (Python)", lambda r: r["peak_rss_mb"].get("driver")),
        ("JVM peak RSS MB", lambda r: r["peak_rss_mb"].get("jvm")),
        ("tasks", lambda r: r["rate"]["tasks"] or r.get("partitions")),
        ("job images/s", lambda r: r["rate"]["job"]),
        ("steady images/s", lambda r: r["rate"]["steady"]),
        ("whole-call images/s", lambda r: _round(r["task"]["files"] / r["call_s"]) if r["mode"] != "plan" else None),
        ("output files", lambda r: r.get("output", {}).get("files")),
        ("output MB", lambda r: _mb(r.get("output", {}).get("bytes"))),
        ("rows per output file", lambda r: r.get("output", {}).get("rows_per_file")),
        ("after last task s", lambda r: r.get("after_tasks_s")),
        ("reading output back s", lambda r: r.get("readback_s")),
    ]
    width = max(14, *(len(n) for n in names))
    lines = [f"bench-scale: digits PNGs (8x8), near-free model, master {report['master']}, {report['machine']}",
             f"  {'':32s}" + "".join(f"{n:>{width + 2}s}" for n in names)]
    for label, value in rows:
        cells = [_cell(value, runs[n]) for n in names]
        if all(c == "" for c in cells):
            continue
        lines.append(f"  {label:32s}" + "".join(f"{c:>{width + 2}s}" for c in cells))
    for t in report.get("targets", []):
        value = t["value"] if not isinstance(t["value"], float) else f"{t['value']:.2f}"
        lines.append(f"  {t['target']:58s} {value!s:>9s}  ({t['bound']}: {'met' if t['met'] else 'MISSED'})")
    return "\n".join(lines)


def _cell(value, run: dict) -> str:
    try:
        v = value(run)
    except (KeyError, TypeError):
        return ""
    if v is None:
        return ""
    return f"{v:,.2f}" if isinstance(v, float) else f"{v:,}"


def _mb(value: int | None) -> float | None:
    return None if value is None else round(value / 2**20, 2)


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a and b else None


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
