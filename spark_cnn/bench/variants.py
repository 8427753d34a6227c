"""The variants `spark-cnn bench` compares. Each runs in a fresh process (`python -m spark_cnn.bench.variants`),
so its memory is its own and nothing it starts outlives it unnoticed.

- bare: a plain PyTorch loop, as a user writes it without Spark: Pillow + torchvision transforms, batches of 32.
- row: a pandas UDF that calls the model once per image (model cached per Python worker).
- predict_batch_udf: Spark's own answer, batch_size 32, the model loaded in every Python worker.
- spark_cnn: this project's classify job (sidecar, dynamic batching, tuned batch size, chosen decode place).
- spark_cnn_sidecar_decode: the same job with `--decode sidecar`, the path a GPU host takes (tasks read files,
  the sidecar decodes them, as nvJPEG would on the device): its CPU per image beyond decoding is what the
  framework costs a host that feeds a fast device.
- ray_data, daft: the peers users pick instead of Spark, each as its documentation shows batch inference
  (bench/peers.py; optional packages, skipped with one line when missing).
- a simulated device (`sim:CURVE`, models/simulated.py) runs spark_cnn and spark_cnn_sidecar_decode only: a
  device's latency per batch behind the whole pipeline, costing the host no CPU; what the two paths spend per image
  beyond decoding is what a GPU host's framework costs (bench/device_budget.py).
- limit: decode alone on one core and the model alone (1 and all threads), combined into the best rate the
  machine's cores allow for the whole pipeline (see `pipeline_limit`). For the near-free model (`identity`, a
  TorchScript file: bench/tiny.py) and a simulated device the model is not measured: the limit is the
  decode-only rate of the cores.

The two Spark baselines run as a user's job would: a SparkSession with Spark's defaults and the binaryFile
source; spark_cnn runs its classify job with its own session settings (spark/session.py).

A detector (a torchvision detection builder's name) runs two variants only, on images of several shapes:
spark_cnn's `detect` job and predict_batch_udf written for detection (the model's own size rule applied with
Pillow, the model called on a list of images, boxes scaled back to each image's pixels, returned as per-row
arrays since pyspark's struct return types hold arrays of scalars); each keeps its rows for the bench's check
that both found the same boxes (bench/detect_check.py).

Every classifier variant preprocesses alike (RGB, shorter side 256, centre crop 224, ImageNet mean/std) and reports
images/s over its measured run only: Spark variants first run the same job on a small warm-up folder, so
session start, Python workers, model loading and the sidecar's start are not counted. Each also reports that
run's wall-clock window (`measured_window`, time.time()) and the CPU ticks of the bench's process tree at its
two edges (`window_snapshots`), so the bench can charge CPU time to that run alone.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict

import numpy as np
import pandas as pd  # the row UDF's type hints are resolved in this module's namespace

from spark_cnn.bench.variant_task import (
    BATCH_SIZE,
    LIMIT_BATCH_SIZES,
    MeasuredWindow,
    VariantTask,
    load_model,
    user_transform,
)
from spark_cnn.task.sidecar_env import SIDECAR_MALLOC_ENV

MASTER = "local[2]"
PEER_VARIANTS = ("ray_data", "daft")  # bench/peers.py: Ray Data and Daft, the `peers` extra
# spark_cnn with the sidecar decoding (`--decode sidecar`): the GPU host's path, measured on any host.
SIDECAR_DECODE_VARIANT = "spark_cnn_sidecar_decode"
# This project's variants: a sidecar per executor, tasks or the sidecar decoding.
SPARK_CNN_VARIANTS = ("spark_cnn", SIDECAR_DECODE_VARIANT)
VARIANTS = ("bare", "row", "predict_batch_udf", *SPARK_CNN_VARIANTS, *PEER_VARIANTS, "limit")
# What `spark-cnn bench` runs unless told: the sidecar-decode variant is asked for by name (`make bench-identity`),
# since on a CPU it repeats spark_cnn's work in another process and would add minutes per model.
DEFAULT_VARIANTS = tuple(v for v in VARIANTS if v != SIDECAR_DECODE_VARIANT)
# What a detector is compared with: the others assume fixed-size crops and a (batch, classes) output.
DETECT_VARIANTS = ("predict_batch_udf", "spark_cnn")
# The near-free model's name in the bench commands (bench/tiny.py); here, torch-free, for the CLI and the report.
IDENTITY_MODEL = "identity"
# Its factory, by name: building every command's parser imports bench-sidecar's options, and a name costs no torch.
IDENTITY_FACTORY = "spark_cnn.bench.tiny:identity_classifier"


# --- the user's side: what someone writes without this project (load_model, user_transform: variant_task.py) ---


def _open_rgb(data: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(data)).convert("RGB")


def _top1(logits) -> tuple[np.ndarray, np.ndarray]:
    score, label = logits.softmax(1).max(1)
    return label.int().numpy(), score.float().numpy()


def detect_images(model, contents) -> list[dict]:
    """What a user's detection predict function does with a batch of image files: each decoded with Pillow,
    resized to the model's own size rule (read from its transform by the product's `detect_sizing`, so both
    variants send the model the same pixels), the model called on the list, boxes scaled back to each image's
    pixels. One dict per image: labels (k,), scores (k,), boxes (4k,) flattened x1, y1, x2, y2."""
    import torch
    from PIL import Image
    from torchvision.transforms.functional import to_tensor

    from spark_cnn.models.dense_heads import detect_sizing

    rule, images, sources = detect_sizing(model), [], []
    for data in contents:
        image = _open_rgb(data)
        height, width = rule.target(image.height, image.width)
        images.append(to_tensor(image.resize((width, height), Image.BILINEAR)))
        sources.append((image.height, image.width))
    with torch.inference_mode():
        found = model(images)
    rows = []
    for image, (height, width), out in zip(images, sources, found, strict=True):
        sy, sx = height / image.shape[1], width / image.shape[2]
        boxes = out["boxes"].float() * torch.tensor([sx, sy, sx, sy])
        rows.append({"labels": out["labels"].int().numpy(), "scores": out["scores"].float().numpy(),
                     "boxes": boxes.flatten().numpy()})
    return rows


# --- bare --------------------------------------------------------------------------------------------------

def run_bare(task: VariantTask) -> dict:
    import torch
    from PIL import Image

    from spark_cnn.bench.dataset import input_files

    model, transform = load_model(task.model, task.weights), user_transform()

    def run(paths: list[str]) -> int:
        done = 0
        for i in range(0, len(paths), BATCH_SIZE):
            images = torch.stack([transform(Image.open(p).convert("RGB")) for p in paths[i:i + BATCH_SIZE]])
            with torch.inference_mode():
                labels, _ = _top1(model(images))
            done += len(labels)
        return done

    run(input_files(task.warmup_input))
    with MeasuredWindow() as window:
        started = time.perf_counter()
        done = run(input_files(task.input))
        elapsed = time.perf_counter() - started
    return {"images": done, "elapsed_s": elapsed, **window.result(), "torch_threads": torch.get_num_threads()}


# --- Spark baselines ---------------------------------------------------------------------------------------

def _row_udf(name: str, weights: str):
    from pyspark.sql.functions import pandas_udf

    @pandas_udf("label int, score float")
    def classify_rows(batches: Iterator[pd.Series]) -> Iterator[pd.DataFrame]:
        import torch

        model, transform = load_model(name, weights), user_transform()
        for contents in batches:
            labels, scores = [], []
            for data in contents:  # one image per model call
                with torch.inference_mode():
                    label, score = _top1(model(transform(_open_rgb(data)).unsqueeze(0)))
                labels.append(int(label[0]))
                scores.append(float(score[0]))
            yield pd.DataFrame({"label": labels, "score": scores})

    return classify_rows


def _predict_batch_udf(name: str, weights: str):
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import FloatType, IntegerType, StructField, StructType

    def make_predict_fn():
        import torch

        model, transform = load_model(name, weights), user_transform()

        def predict(contents: np.ndarray) -> dict:
            images = torch.stack([transform(_open_rgb(data)) for data in contents])
            with torch.inference_mode():
                label, score = _top1(model(images))
            return {"label": label, "score": score}

        return predict

    return predict_batch_udf(make_predict_fn, batch_size=BATCH_SIZE, return_type=StructType(
        [StructField("label", IntegerType()), StructField("score", FloatType())]))


def _predict_batch_udf_detect(name: str, weights: str):
    """predict_batch_udf for a detector: ragged rows come back as a list of dicts (one per image) of 1-D arrays."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql.types import ArrayType, FloatType, IntegerType, StructField, StructType

    def make_predict_fn():
        model = load_model(name, weights)

        def predict(contents: np.ndarray) -> list[dict]:
            return detect_images(model, contents)

        return predict

    return predict_batch_udf(make_predict_fn, batch_size=BATCH_SIZE, return_type=StructType(
        [StructField("labels", ArrayType(IntegerType())), StructField("scores", ArrayType(FloatType())),
         StructField("boxes", ArrayType(FloatType()))]))


def user_session(app_name: str):
    """A SparkSession as a user starts one: Spark's defaults, only pointed at this interpreter (Python workers
    need pyarrow) and with a quiet console."""
    from pyspark.sql import SparkSession

    from spark_cnn.spark.session import LOG4J2_CONFIG

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # what a user of a virtual environment sets
    return (SparkSession.builder.master(MASTER).appName(app_name)
            .config("spark.pyspark.python", sys.executable).config("spark.ui.showConsoleProgress", "false")
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J2_CONFIG}")
            .getOrCreate())


def _run_spark_udf(task: VariantTask, make_udf) -> dict:
    workdir = tempfile.mkdtemp(prefix="scnb-")
    spark = user_session(f"bench-{task.variant}")
    try:
        udf = make_udf(task.model, task.weights)

        def job(folder: str, out: str) -> float:
            started = time.perf_counter()
            images = spark.read.format("binaryFile").option("recursiveFileLookup", "true").load(folder)
            images.select("path", udf("content").alias("p")).select("path", "p.*").write.mode("overwrite").parquet(out)
            return time.perf_counter() - started

        job(task.warmup_input, os.path.join(workdir, "warmup"))
        out = task.output or os.path.join(workdir, "out")
        with MeasuredWindow() as window:
            elapsed = job(task.input, out)
        rows = spark.read.parquet(out).count()
        return {"images": rows, "elapsed_s": elapsed, **window.result()}
    finally:
        spark.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def run_row(task: VariantTask) -> dict:
    return _run_spark_udf(task, _row_udf)


def run_predict_batch_udf(task: VariantTask) -> dict:
    return _run_spark_udf(task, _predict_batch_udf_detect if task.task == "detect" else _predict_batch_udf)


# --- this project ------------------------------------------------------------------------------------------

def run_spark_cnn(task: VariantTask, decode: str = "auto") -> dict:
    from spark_cnn.config import ClassifyConfig, InferenceOptions
    from spark_cnn.models.spec import ModelSpec
    from spark_cnn.spark.classify_job import classify, detect
    from spark_cnn.spark.session import spark_session
    from spark_cnn.task.launcher import stop_sidecars

    place = decode if decode != "auto" else (task.decode or decode)  # a variant's own place, else the task's
    workdir = tempfile.mkdtemp(prefix="scnb-")
    spark = spark_session(master=MASTER, app_name=f"bench-{task.variant}", quiet=True)
    try:
        def job(folder: str, out: str) -> dict:
            config = ClassifyConfig(input=folder, output=out,
                                    inference=InferenceOptions(ModelSpec(task.model, task.weights),
                                                               decode=place,
                                                               batch_size=task.batch_size),
                                    master=MASTER,
                                    quiet=True)
            return (detect if task.task == "detect" else classify)(config, spark=spark)

        def short_job() -> dict:
            with MeasuredWindow() as short_window:
                short_summary = job(task.short_input, os.path.join(workdir, "short"))
            return {"images": short_summary["images"], "elapsed_s": short_summary["elapsed_s"],
                    **_work_cpu_s(short_summary), **short_window.result()}

        # starts the sidecar and loads the model: start-up, not measured
        job(task.warmup_input, os.path.join(workdir, "warmup"))
        short = short_job() if task.short_input and not task.short_after else None
        with MeasuredWindow() as window:
            summary = job(task.input, task.output or os.path.join(workdir, "out"))
        if task.short_input and task.short_after:
            short = short_job()
        sidecars = summary["sidecars"]
        return {"images": summary["images"], "elapsed_s": summary["elapsed_s"], **window.result(),
                **({"short_run": short} if short else {}), **_work_cpu_s(summary),
                "errors": summary["errors"],
                "batch_size": summary["batch_size"],
                "mean_batch_size": [s.get("mean_batch_size") for s in sidecars],
                "decode": [s.get("decode") for s in sidecars], "tuning": [s.get("tuning") for s in sidecars]}
    finally:
        app_id = spark.sparkContext.applicationId
        spark.stop()  # first, so no task left over can start a sidecar after they are stopped (job_io)
        stop_sidecars(app_id)
        shutil.rmtree(workdir, ignore_errors=True)


def _work_cpu_s(summary: dict) -> dict:
    """CPU seconds of the job's useful work, as its sidecars counted it: decoding in the sidecars (their decoding
    threads' own time; 0 where tasks decode), decoding in the tasks (the time the tasks' threads took to read
    and decode each request's images, as they said), and computing (the sidecars' forward threads)."""
    return {key: round(sum(s.get(key) or 0.0 for s in summary["sidecars"]), 3)
            for key in ("decode_cpu_s", "task_decode_cpu_s", "compute_cpu_s")}


# --- limit -------------------------------------------------------------------------------------------------

def pipeline_limit(decode_per_s: float, model_per_s: dict[int, float], cores: int) -> float:
    """The best whole-pipeline rate `cores` cores allow, images/s.

    Each image costs 1/decode_per_s core-seconds of decoding (measured on one core) and, at the model's most
    core-efficient thread count t, t/model_per_s[t] core-seconds of compute. With every core busy on useful
    work and nothing else, `cores` core-seconds per second give cores / (decode + compute) images/s. Serving,
    Spark and copies cost extra, so a real pipeline stays below this. Without model rates (a near-free model)
    the compute is taken as nothing: the decode-only rate of the cores.

    >>> round(pipeline_limit(184.0, {1: 117.0, 2: 196.0}, 2), 1)  # the 2-core figures of docs/benchmarks.md
    143.0
    """
    compute_core_s = min((threads / rate for threads, rate in model_per_s.items() if rate > 0), default=0.0)
    return cores / (1.0 / decode_per_s + compute_core_s)


def _rate(fn, measure_s: float, per_call: int) -> float:
    """Calls per second of `fn` times `per_call`, over at least `measure_s` seconds and two calls, after a warm-up
    of a quarter of that (at least one call), so that no measurement counts a fresh process's first calls."""
    warm_until = time.perf_counter() + measure_s / 4
    fn()
    while time.perf_counter() < warm_until:
        fn()
    done, started = 0, time.perf_counter()
    while True:
        fn()
        done += per_call
        elapsed = time.perf_counter() - started
        if elapsed >= measure_s and done >= 2 * per_call:
            return done / elapsed


def run_limit(task: VariantTask) -> dict:
    """The limit, measured two ways. Alone: decoding on one core with the others idle, and the model at 1 and all
    threads with nothing else running. Side by side: the same decoding on every core but one (child processes)
    while the model runs at one thread on the last, as any pipeline that decodes while it computes runs them. The
    limit is the side-by-side one: on this project's 2-core guest the model ran 16% slower beside decoding than
    alone (docs/benchmarks.md), a cost no pipeline escapes; the lone-core figure stays in the result
    (`images_per_s_alone`). Side by side runs LIMIT_WINDOWS windows and takes the median, so that one stalled
    window does not decide; the guest's drift between rounds, minutes apart, is larger than the windows' spread
    and is what `--repeats` measures (docs/benchmarks.md). With a near-free model every core decodes side by side."""
    import torch

    from spark_cnn.bench.dataset import input_files
    from spark_cnn.imaging.preprocess import preprocess_pixels
    from spark_cnn.models.resolve import resolve_endpoint
    from spark_cnn.models.spec import ModelSpec
    from spark_cnn.sidecar.runner import ModelRunner

    endpoint = resolve_endpoint(ModelSpec(task.model, task.weights)).endpoint
    prep = endpoint.preprocessing
    contents = []
    for path in input_files(task.input)[:256]:
        with open(path, "rb") as f:
            contents.append(f.read())
    position = [0]

    def decode_some() -> None:  # the product's decoder: Pillow decode, resize, crop to uint8 (what tasks do)
        for _ in range(16):
            preprocess_pixels(contents[position[0] % len(contents)], prep)
            position[0] += 1

    decode_per_s = _rate(decode_some, task.measure_s, 16)
    cores = os.cpu_count() or 1
    result = {"decode_per_s_one_core": decode_per_s, "cores": cores, "model_per_s_by_threads": {},
              "model_per_s_one_thread_by_batch": {}, "model_batch_size": None}
    if not task.measure_model:
        result["images_per_s_alone"] = pipeline_limit(decode_per_s, {}, cores)
        if cores > 1:
            beside = _beside_decoders(contents, prep, cores - 1, lambda: _rate(decode_some, task.measure_s, 16),
                                      task.limit_windows)
            windows = [{"decode_per_s_per_core": (parent + sum(decoders)) / cores}
                       for parent, decoders in zip(beside["parent_per_s"], beside["decoders_per_s"], strict=True)]
            for window in windows:
                window["images_per_s"] = pipeline_limit(window["decode_per_s_per_core"], {}, cores)
            result["side_by_side"] = {**_median_window(windows), "decoders": cores, "windows": windows}
            result["images_per_s"] = result["side_by_side"]["images_per_s"]
        else:
            result["images_per_s"] = result["images_per_s_alone"]
        return result
    pixels = np.stack([preprocess_pixels(data, prep) for data in contents[:max(task.limit_batch_sizes)]])
    runner = ModelRunner(endpoint, torch.device("cpu"))
    by_batch, model_per_s = {}, {}
    torch.set_num_threads(1)
    for size in task.limit_batch_sizes:
        by_batch[size] = _rate(lambda s=size: runner.run(pixels[:s]), task.measure_s, size)
    best = max(by_batch, key=by_batch.get)
    model_per_s[1] = by_batch[best]
    if cores > 1:
        beside = _beside_decoders(contents, prep, cores - 1,
                                  lambda: _rate(lambda: runner.run(pixels[:best]), task.measure_s, best),
                                  task.limit_windows)
        windows = [{"decode_per_s_per_core": sum(decoders) / len(decoders), "model_per_s_one_thread": parent}
                   for parent, decoders in zip(beside["parent_per_s"], beside["decoders_per_s"], strict=True)]
        for window in windows:
            window["images_per_s"] = pipeline_limit(window["decode_per_s_per_core"],
                                                    {1: window["model_per_s_one_thread"]}, cores)
        result["side_by_side"] = {**_median_window(windows), "decoders": cores - 1, "windows": windows}
        torch.set_num_threads(cores)
        model_per_s[cores] = _rate(lambda: runner.run(pixels[:best]), task.measure_s, best)
    result.update(model_per_s_by_threads=model_per_s, model_per_s_one_thread_by_batch=by_batch,
                  model_batch_size=best, images_per_s_alone=pipeline_limit(decode_per_s, model_per_s, cores))
    side = result.get("side_by_side")
    result["images_per_s"] = side["images_per_s"] if side else result["images_per_s_alone"]
    return result


def _median_window(windows: list[dict]) -> dict:
    """The side-by-side window whose limit is the median (the lower middle of an even count), so that its decode
    and model rates are one window's, measured together.

    >>> _median_window([{"images_per_s": 3}, {"images_per_s": 1}, {"images_per_s": 2}])
    {'images_per_s': 2}
    """
    ranked = sorted(windows, key=lambda window: window["images_per_s"])
    return dict(ranked[(len(ranked) - 1) // 2])


def _beside_decoders(contents: list[bytes], prep, decoders: int, measure, windows: int = 1) -> dict:
    """Run `measure()` (a rate, in this process) `windows` times while `decoders` child processes decode
    `contents` without a pause; per window, the parent's rate and each child's decode rate over the same span
    (children count their images in shared memory, read at each window's edges). Children are spawned (no fork
    of a process holding torch's threads), decode from their start to the end, and are joined before returning."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    ready, stop = context.Semaphore(0), context.Event()
    counters = [context.RawValue("q", 0) for _ in range(decoders)]
    children = [context.Process(target=_decode_until_stopped, args=(contents, prep, ready, stop, counter),
                                daemon=True) for counter in counters]
    with _tasks_allocator():
        for child in children:
            child.start()
    parent_per_s, decoders_per_s = [], []
    try:
        for _ in children:
            if not ready.acquire(timeout=120):
                raise RuntimeError("a side-by-side decoder did not start within 120 s")
        for _ in range(windows):
            counts, started = [counter.value for counter in counters], time.perf_counter()
            parent_per_s.append(measure())
            elapsed = time.perf_counter() - started
            decoders_per_s.append([(counter.value - count) / elapsed
                                   for counter, count in zip(counters, counts, strict=True)])
    finally:
        stop.set()
        for child in children:
            child.join(timeout=30)
            if child.is_alive():
                child.kill()
                child.join()
    return {"parent_per_s": parent_per_s, "decoders_per_s": decoders_per_s}


@contextlib.contextmanager
def _tasks_allocator():
    """Children spawned inside start with the allocator Spark's Python workers have: without the sidecar's malloc
    settings, which the limit's own process runs with (suite.variant_environment). Spawning reads the
    environment then; glibc reads it once, when the child starts."""
    saved = {name: os.environ.pop(name) for name in SIDECAR_MALLOC_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def _decode_until_stopped(contents: list[bytes], prep, ready, stop, counter) -> None:
    """A side-by-side decoder (child process): warm up, say ready, then decode until `stop`, counting each image
    in `counter` (shared memory, written by this process only)."""
    from spark_cnn.imaging.preprocess import preprocess_pixels

    for data in contents[:16]:
        preprocess_pixels(data, prep)
    ready.release()
    done = 0
    while not stop.is_set():
        preprocess_pixels(contents[done % len(contents)], prep)
        done += 1
        counter.value = done


RUNNERS = {"bare": run_bare, "row": run_row, "predict_batch_udf": run_predict_batch_udf,
           "spark_cnn": run_spark_cnn, SIDECAR_DECODE_VARIANT: lambda task: run_spark_cnn(task, decode="sidecar"),
           "limit": run_limit}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_cnn.bench.variants")
    parser.add_argument("task", help="VariantTask as JSON")
    parser.add_argument("out", help="write the result JSON here")
    args = parser.parse_args(argv)
    fields = json.loads(args.task)
    fields["limit_batch_sizes"] = tuple(fields.get("limit_batch_sizes", LIMIT_BATCH_SIZES))
    task = VariantTask(**fields)
    if task.variant in PEER_VARIANTS:  # their packages are optional: imported only when asked for
        from spark_cnn.bench.peers import RUNNERS as PEER_RUNNERS

        result = PEER_RUNNERS[task.variant](task)
    else:
        result = RUNNERS[task.variant](task)
    if "images_per_s" not in result:
        result["images_per_s"] = result["images"] / result["elapsed_s"] if result["elapsed_s"] else None
    with open(args.out, "w") as f:
        json.dump({**result, "task": asdict(task)}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
