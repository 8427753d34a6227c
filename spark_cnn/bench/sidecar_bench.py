"""`spark-cnn bench-sidecar`: one sidecar, K client processes, dynamic batching on vs off vs the device alone.

K client processes (separate processes, like Spark's Python workers) each keep requests of R images in
flight against one sidecar. `off` runs every request alone (the target batch is R, so nothing merges);
`on` lets the batcher merge requests of all clients into batches of the target size (auto or --batch-size);
`device_only` runs the model in this process on ready-made batches of that same size: the rate the sidecar
would reach if serving cost nothing. A detector or segmenter (a torchvision detection or segmentation builder
name) gets photos of several shapes, each sent at its own size under the model's size rule, as `spark-cnn detect`'s
tasks send them; its device-only run takes batches of those same images. Modes alternate over rounds so drift
hits both alike; images/s are means over rounds, each measured after a warm-up. No Spark and no Java are needed.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import platform
import shutil
import statistics
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, replace

import numpy as np

from spark_cnn.bench.variant_task import bench_task, random_torchvision
from spark_cnn.bench.variants import IDENTITY_FACTORY, IDENTITY_MODEL
from spark_cnn.config import InferenceOptions
from spark_cnn.errors import ConfigError
from spark_cnn.imaging.preprocess import preprocess_pixels
from spark_cnn.imaging.samples import bench_jpegs
from spark_cnn.imaging.sizing import sized_pixels
from spark_cnn.models.spec import Endpoint
from spark_cnn.options import check_choices, option, same_as
from spark_cnn.task import protocol
from spark_cnn.task.client import SidecarClient, map_ordered
from spark_cnn.task.launcher import RUNTIME_DIR_ENV, LaunchOptions, ensure_sidecar, stop_sidecars
from spark_cnn.task.procs import ExecutorProcess, process_id
from spark_cnn.task.protocol import SizedImages
from spark_cnn.task.run_options import DECODE_PLACES, PIXELS_DECODE_PLACE, RunOptions

# Distinct images the clients cycle through: enough that no cache makes repeats free.
BENCH_IMAGES = 32
# Images each client keeps in flight, as a Spark task does (4 requests of 16 rows): with tiny requests the
# client sends more of them, so K clients can fill several device batches between them.
ROWS_IN_FLIGHT_PER_CLIENT = 64
# Images each client keeps in flight for a detector or segmenter: such a model runs at a few images/s on a CPU,
# where 64 images in flight per client would queue each for longer than a measuring round lasts.
SIZED_ROWS_IN_FLIGHT_PER_CLIENT = 16
CLIENT_START_TIMEOUT_S = 120.0
# (height, width) of a detector's or segmenter's bench photos: square, landscape, portrait and a larger one, so
# requests and batches mix sizes (all fit the 427 x 640 source photos).
DENSE_BENCH_SHAPES = ((320, 320), (240, 427), (427, 320), (400, 600))


@dataclass(frozen=True)
class SidecarBenchConfig:
    """bench-sidecar's options, declared once (spark_cnn/options.py): its flags are generated from them. How the
    sidecar serves (batch size, device, precision, layout, compile, threads) are the jobs' own declarations."""

    model: str = option("mobilenet_v3_small", group="model",
                        help="torchvision model (random weights; a detection or segmentation builder sends each "
                             "image at its own size), or identity: a near-free model that measures what serving "
                             "alone costs")
    clients: int = option(4, help="client processes")
    request_size: int = option(1, help="images per request")
    batch_size: int | None = same_as(RunOptions, "batch_size", help="target batch with batching on: auto or N")
    device: str = same_as(InferenceOptions, "device")
    # Not the jobs' --decode: a concrete place, since the clients must know whether to send pixels or files.
    decode: str = option(PIXELS_DECODE_PLACE, choices=DECODE_PLACES,
                         help="task: clients send pixels, as the tasks do; sidecar/gpu: clients send JPEG files")
    precision: str = same_as(RunOptions, "precision")
    channels_last: bool | None = same_as(RunOptions, "channels_last")
    compile: bool = same_as(RunOptions, "compile")
    threads: int | None = same_as(InferenceOptions, "threads",
                                  help="torch CPU threads in the sidecar and the device-only run")
    warmup_s: float = option(3.0, flag="--warmup", metavar="S", help="warm-up seconds before each measurement")
    measure_s: float = option(10.0, flag="--seconds", metavar="S", help="measured seconds per mode and round")
    rounds: int = option(2, help="off/on alternations")
    max_in_flight: int | None = option(None, flag="--in-flight", metavar="N",
                                       help="requests each client keeps in flight (default: 64 images' worth)")
    image_size: int | None = option(None, help="square input side in pixels (resize and crop; default: the "
                                               "model's own, 32 for identity)")

    def __post_init__(self) -> None:
        check_choices(self)
        if min(self.clients, self.request_size, self.rounds, self.image_size or 1, self.max_in_flight or 1) < 1 \
                or not self.measure_s > 0 or self.warmup_s < 0:
            raise ConfigError("--clients, --request-size, --rounds, --seconds, --in-flight and --image-size must be "
                              "positive (--warmup 0 or more)")

    @property
    def requests_in_flight(self) -> int:
        """Requests each client keeps in flight: as asked, within what one connection may have unanswered."""
        wanted = self.max_in_flight or max(1, ROWS_IN_FLIGHT_PER_CLIENT // self.request_size)
        return min(wanted, protocol.MAX_REQUESTS_IN_FLIGHT)


def machine_info(device: str) -> str:
    cpu = f"{os.cpu_count()} CPU cores, {platform.machine()}, {platform.system()}"
    if device.startswith("cuda"):
        import torch

        return f"{torch.cuda.get_device_name(torch.device(device))}; {cpu}"
    return cpu


def take_images(images: list, start: int, count: int):
    """`count` images from `start` on, cycling: one request's or one batch's, stacked fixed-size pixels, one
    SizedImages (single images at their own sizes, joined), or the files as they are."""
    chunk = [images[(start + j) % len(images)] for j in range(count)]
    if isinstance(chunk[0], np.ndarray):
        return np.stack(chunk)
    return SizedImages.concat(chunk) if isinstance(chunk[0], SizedImages) else chunk


def _client_main(socket_path: str, token: str, endpoint_json: str, job: str, options: RunOptions, decode: str,
                 images: list, request_size: int, max_in_flight: int, window, ready, go, results) -> None:
    """One client process: keep requests in flight until the window closes; report images done inside it."""
    endpoint = Endpoint.from_json(endpoint_json)
    with SidecarClient(socket_path, token, endpoint, job, run_options=options, decode=decode) as client:
        ready.put(os.getpid())
        go.wait()
        start, end = window[0], window[1]

        def requests():
            i = 0
            while time.time() < end:
                yield None, take_images(images, i, request_size)
                i += request_size

        done = 0
        for _, reply in map_ordered(client, requests(), max_in_flight):
            if isinstance(reply, Exception):
                raise reply
            if start <= time.time() <= end:
                done += reply.num_rows
    results.put(done)


def _drive(cfg: SidecarBenchConfig, info, endpoint: Endpoint, options: RunOptions, images: list) -> dict:
    """One measured mode: K client processes against the sidecar. Returns images/s and the sidecar's stats."""
    ctx = mp.get_context("spawn")  # fresh interpreters, like Spark's Python workers; no inherited threads
    job = f"bench-{uuid.uuid4().hex[:8]}"
    window, ready, go, results = ctx.Array("d", 2), ctx.Queue(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client_main, daemon=True, args=(
        info.socket, info.token, endpoint.to_json(), job, options, cfg.decode, images, cfg.request_size,
        cfg.requests_in_flight, window, ready, go, results)) for _ in range(cfg.clients)]
    for proc in procs:
        proc.start()
    try:
        for _ in procs:
            ready.get(timeout=CLIENT_START_TIMEOUT_S)
        window[0] = time.time() + cfg.warmup_s
        window[1] = window[0] + cfg.measure_s
        go.set()
        done = sum(results.get(timeout=cfg.warmup_s + cfg.measure_s + CLIENT_START_TIMEOUT_S) for _ in procs)
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
    with SidecarClient(info.socket, info.token, endpoint, job, run_options=options) as client:
        stats = client.stats(job)
    tuning = stats.get("tuning")
    # mid-trial the target alternates between two sizes: the tuner's best so far is the one to compare
    batch_size = tuning["best"] if tuning else stats["batch_size"]
    return {"images_per_s": done / cfg.measure_s, "mean_batch_size": stats["mean_batch_size"],
            "batch_size": batch_size, "precision": stats["precision"], "tuning": tuning}


def _tuning_line(tuning: dict | None) -> str:
    """The online tuner's state after a round (its service lives on across rounds): where it started, its best
    size so far, and whether it has settled."""
    if not tuning:
        return ""
    state = "settled" if tuning["settled"] else f"trying {tuning['target']}"
    return (f"; tuner {tuning['start']} -> {tuning['best']} ({state} after {tuning['batches']} full batches; "
            f"img/s by size {tuning['observed_images_per_s']})")


def _device_only(endpoint: Endpoint, device: str, options: RunOptions, batch_size: int, images: list,
                 cfg: SidecarBenchConfig) -> float:
    """The model alone, in this process, on ready-made batches of the clients' images (pixels, or SizedImages):
    upload + forward + download per batch."""
    import torch

    from spark_cnn.sidecar.runner import ModelRunner, cpu_compute_workers, resolve_device
    from spark_cnn.task.sidecar_env import cpu_threads

    runner = ModelRunner(endpoint, resolve_device(device), options)
    if runner.device.type == "cpu":
        torch.set_num_threads(cpu_threads(cfg.threads))  # the same count the sidecar ran with
    workers = cpu_compute_workers(runner.device, cfg.threads)  # and as many batches side by side
    batch = take_images(images, 0, batch_size)
    for _ in range(3):
        runner.run(batch)  # warm-up: allocator, cuDNN autotuning, the precision probe
    done = [0] * workers
    started = time.perf_counter()

    def work(i: int) -> None:
        while time.perf_counter() - started < cfg.measure_s / 2:
            runner.run(batch)
            done[i] += batch_size

    threads = [threading.Thread(target=work, args=(i,)) for i in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / (time.perf_counter() - started)


def run_sidecar_bench(cfg: SidecarBenchConfig, log=print) -> dict:
    """Run the benchmark; returns the JSON document (keys `on`, `off`, `device_only`, images/s, and context)."""
    import torch

    from spark_cnn.models.resolve import resolve_endpoint
    from spark_cnn.models.spec import ModelSpec

    task = bench_task(cfg.model)
    if task != "classify" and (cfg.image_size is not None or cfg.decode != "task"):
        raise ConfigError(f"--model {cfg.model} sizes each image by its own rule, made in the clients: drop "
                          "--image-size and --decode")
    workdir = tempfile.mkdtemp(prefix="scnb")
    previous_runtime_dir = os.environ.get(RUNTIME_DIR_ENV)
    os.environ[RUNTIME_DIR_ENV] = os.path.join(workdir, "rt")  # a private sidecar, whatever else runs here
    app_id = f"bench-sidecar-{uuid.uuid4().hex[:8]}"
    try:
        torch.manual_seed(0)
        size = None if cfg.image_size is None else {"resize": cfg.image_size, "crop": cfg.image_size}
        if cfg.model == IDENTITY_MODEL:  # serving alone: a model that costs nearly nothing (bench/tiny.py)
            endpoint = resolve_endpoint(ModelSpec(IDENTITY_FACTORY, preprocessing=size)).endpoint
        else:
            weights = os.path.join(workdir, f"{cfg.model}.pt")
            torch.save(random_torchvision(cfg.model).state_dict(), weights)
            endpoint = resolve_endpoint(ModelSpec(cfg.model, weights, preprocessing=size), task=task).endpoint
        if endpoint.sized and cfg.max_in_flight is None:
            cfg = replace(cfg, max_in_flight=max(1, SIZED_ROWS_IN_FLIGHT_PER_CLIENT // cfg.request_size))
        if endpoint.sized:  # each at its own size under the model's rule, made as `detect`'s tasks make them
            files = bench_jpegs(BENCH_IMAGES, shapes=DENSE_BENCH_SHAPES)
            images = []
            for file in files:
                pixels, source = sized_pixels(file, endpoint.sizing)
                images.append(SizedImages([pixels], [source]))
            sent = [one.images[0] for one in images]
        else:
            files = bench_jpegs(BENCH_IMAGES)
            sent = list(np.stack([preprocess_pixels(f, endpoint.preprocessing) for f in files]))
            images = sent if cfg.decode == "task" else files
        # What one image puts on the socket: its pixels, or its file when the sidecar decodes.
        bytes_per_image = (statistics.mean(p.nbytes for p in sent) if cfg.decode == "task"
                           else statistics.mean(len(f) for f in files))
        run = RunOptions(precision=cfg.precision, channels_last=cfg.channels_last, compile=cfg.compile)
        off = replace(run, batch_size=cfg.request_size)
        on = replace(run, batch_size=cfg.batch_size)

        me = ExecutorProcess(process_id(os.getpid()), "bench")  # the sidecar exits if this process dies
        info = ensure_sidecar(LaunchOptions(app_id=app_id, device=cfg.device, threads=cfg.threads), me)
        log(f"sidecar pid {info.pid} on {info.device}; {cfg.clients} clients x {cfg.requests_in_flight} requests "
            f"of {cfg.request_size} in flight, decode in {cfg.decode}, {cfg.rounds} rounds of {cfg.warmup_s:.0f} s "
            f"warm-up + {cfg.measure_s:.0f} s")
        rounds = []
        for i in range(cfg.rounds):
            for mode, options in (("off", off), ("on", on)):
                result = _drive(cfg, info, endpoint, options, images)
                rounds.append({"round": i, "mode": mode, **result})
                log(f"  round {i} {mode:3s}: {result['images_per_s']:8.1f} img/s, mean batch "
                    f"{result['mean_batch_size']:.1f}{_tuning_line(result['tuning'])}")
        stop_sidecars(app_id)
        on_batch = max(r["batch_size"] for r in rounds if r["mode"] == "on")
        device_only = _device_only(endpoint, info.device, on, on_batch, images if endpoint.sized else sent, cfg)
        log(f"  device only at batch {on_batch}: {device_only:8.1f} img/s")
        mean = {mode: statistics.mean(r["images_per_s"] for r in rounds if r["mode"] == mode) for mode in ("on", "off")}
        return {
            "on": round(mean["on"], 2), "off": round(mean["off"], 2), "device_only": round(device_only, 2),
            # None where a window was too short for any image to complete (a smoke run on a loaded machine)
            "on_over_off": round(mean["on"] / mean["off"], 3) if mean["off"] else None,
            "on_over_device_only": round(mean["on"] / device_only, 3) if device_only else None,
            "batch_size": on_batch, "machine": machine_info(info.device), "device": info.device,
            "task": task, "input_shape": None if endpoint.sized else list(sent[0].shape),
            # the (height, width) sizes sent, each image at its own (detectors, segmenters)
            "input_sizes": sorted({tuple(p.shape[:2]) for p in sent}) if endpoint.sized else None,
            "bytes_per_image": round(bytes_per_image),
            "on_gb_per_s": round(mean["on"] * bytes_per_image / 1e9, 3),
            "config": asdict(cfg), "rounds": rounds,
        }
    finally:
        stop_sidecars(app_id)
        if previous_runtime_dir is None:
            os.environ.pop(RUNTIME_DIR_ENV, None)
        else:
            os.environ[RUNTIME_DIR_ENV] = previous_runtime_dir
        shutil.rmtree(workdir, ignore_errors=True)
