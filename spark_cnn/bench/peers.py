"""The peers users pick instead of Spark for batch inference over image files: Ray Data and Daft, each written
the way its own documentation shows offline batch inference with a PyTorch model, on the bench's cores.

- ray_data: `ray.data.read_images` (Pillow decodes, RGB), a stateless `map_batches` function that applies the
  user's torchvision transform (the other variants' exactly: `variant_task.user_transform`), then `map_batches` with
  a callable class that loads the model once per actor (an actor pool of `concurrency` actors), batch 32;
  `ray.init(num_cpus=cores)` so Ray schedules on the same cores local[2] uses. Output: Parquet.
- daft: `daft.from_glob_path` + `download()` for the bytes, then a `@daft.cls` class whose batch method
  decodes with Pillow, applies the same transform and runs the model (loaded once per instance), batch 32, on
  Daft's local (native) runner. Output: Parquet.

Both first run the same pipeline on the small warm-up folder (Ray's and Daft's start-up, worker processes, the
model's first load: not counted), then the measured folder. Ray builds a new actor pool for each execution, so
its measured run includes loading the model in its actors, as every run of a user's pipeline does. The result
counts the rows written with a label, the check every variant passes: every image classified once.

They are optional (`pip install 'spark_cnn[peers]'`): without the package the variant is skipped with one line.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
import time

import numpy as np

from spark_cnn.bench.memory import descendants
from spark_cnn.bench.variant_task import BATCH_SIZE, MeasuredWindow, VariantTask, load_model, user_transform

# The package each peer variant needs, as `pip install` names it (the `peers` extra holds both).
PEER_PACKAGES = {"ray_data": "ray", "daft": "daft"}
# Cores the peers schedule on: those `local[2]` gives the Spark variants.
PEER_CORES = 2
# Model actors of the Ray pipeline. Each takes one of PEER_CORES, so the other stays free for reading and
# preprocessing: two actors would hold both cores and leave the read and transform tasks none.
RAY_MODEL_ACTORS = 1
# After ray.shutdown() its raylet, GCS and workers exit within seconds (seen: ~5 s on the loaded 2-core host);
# the variant waits for them, so what it started has ended when it does.
RAY_EXIT_WAIT_S = 30.0


def missing_peer(variant: str) -> str | None:
    """One line saying why `variant` cannot run here (its package is not installed), or None when it can."""
    package = PEER_PACKAGES.get(variant)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return f"{variant}: skipped, {package} is not installed (pip install 'spark_cnn[peers]')"


def _classify(model, images) -> np.ndarray:
    import torch

    with torch.inference_mode():
        return model(images).argmax(1).int().numpy()


def _labelled_rows(folder: str) -> int:
    """Rows of the Parquet output in `folder` whose label is set."""
    import pyarrow.dataset as ds

    labels = ds.dataset(folder, format="parquet").to_table(columns=["label"]).column("label")
    return len(labels) - labels.null_count


def _measured(task: VariantTask, run) -> dict:
    """Warm-up on the small folder, then the measured folder; rows written with a label are the images done."""
    workdir = tempfile.mkdtemp(prefix="scnb-")
    try:
        run(task.warmup_input, os.path.join(workdir, "warmup"))
        out = os.path.join(workdir, "out")
        with MeasuredWindow() as window:
            started = time.perf_counter()
            run(task.input, out)
            elapsed = time.perf_counter() - started
        return {"images": _labelled_rows(out), "elapsed_s": elapsed, **window.result()}
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


# --- Ray Data ------------------------------------------------------------------------------------------------

class RayClassifier:
    """The model, loaded once per actor (Ray Data's callable class); a batch of transformed images in, labels out."""

    def __init__(self, name: str, weights: str | None):
        self.model = load_model(name, weights)

    def __call__(self, batch: dict) -> dict:
        import torch

        return {"path": batch["path"], "label": _classify(self.model, torch.from_numpy(batch["image"]))}


def _ray_transform(batch: dict) -> dict:
    """Ray Data's preprocessing stage: the user's torchvision transform on each decoded image."""
    from PIL import Image

    transform = user_transform()
    images = np.stack([transform(Image.fromarray(image)).numpy() for image in batch["image"]])
    return {"path": batch["path"], "image": images}


def run_ray_data(task: VariantTask) -> dict:
    import ray

    ray.init(num_cpus=PEER_CORES, include_dashboard=False, log_to_driver=False, configure_logging=False)
    try:
        context = ray.data.DataContext.get_current()
        context.enable_progress_bars = False

        def run(folder: str, out: str) -> None:
            images = ray.data.read_images(folder, mode="RGB", include_paths=True, file_extensions=["jpg"])
            labels = (images.map_batches(_ray_transform, batch_size=BATCH_SIZE)
                      .map_batches(RayClassifier, fn_constructor_args=(task.model, task.weights),
                                   compute=ray.data.ActorPoolStrategy(size=RAY_MODEL_ACTORS), batch_size=BATCH_SIZE))
            labels.write_parquet(out)

        return _measured(task, run)
    finally:
        started_by_ray = descendants(os.getpid())  # its raylet, GCS, workers and actors
        ray.shutdown()
        wait_exited(started_by_ray, RAY_EXIT_WAIT_S)


def wait_exited(pids: list[int], timeout_s: float) -> list[int]:
    """Wait up to `timeout_s` for `pids` to exit; returns those still running (the bench reaps and reports them)."""
    deadline = time.monotonic() + timeout_s
    running = list(pids)
    while running and time.monotonic() < deadline:
        time.sleep(0.1)
        running = [pid for pid in running if _alive(pid)]
    return running


def _alive(pid: int) -> bool:
    """Running, not exited (a zombie has exited: only its parent's wait is missing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] != b"Z"


# --- Daft ----------------------------------------------------------------------------------------------------

def _daft_classifier():
    """The Daft class (built on first use: `daft` is optional): the model once per instance, a batch method."""
    import daft
    from daft import DataType

    @daft.cls
    class DaftClassifier:
        def __init__(self, name: str, weights: str | None):
            self.model = load_model(name, weights)
            self.transform = user_transform()

        @daft.method.batch(return_dtype=DataType.int32(), batch_size=BATCH_SIZE)
        def __call__(self, contents):
            import io

            import torch
            from PIL import Image

            images = torch.stack([self.transform(Image.open(io.BytesIO(data)).convert("RGB"))
                                  for data in contents.to_pylist()])
            return _classify(self.model, images)

    return DaftClassifier


def run_daft(task: VariantTask) -> dict:
    import daft

    daft.set_runner_native()
    classifier = _daft_classifier()(task.model, task.weights)

    def run(folder: str, out: str) -> None:
        files = daft.from_glob_path(os.path.join(folder, "**", "*.jpg"))
        files = files.with_column("content", files["path"].download())
        files.select("path", classifier(files["content"]).alias("label")).write_parquet(out)

    return _measured(task, run)


RUNNERS = {"ray_data": run_ray_data, "daft": run_daft}
