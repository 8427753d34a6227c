"""Helpers of the fault tests: watching a job's progress from outside, comparing outputs.

"Identical to a clean run" means: the same set of paths, each exactly once; the same error (or none) per path
(up to the memory addresses Pillow puts in some messages);
the same label, label name and top-k labels; scores and logits equal within OUTPUT_ATOL. Two clean runs
differ in those floats too: which rows share a device batch changes the kernels' rounding (the demo CNN's
logits move by up to 7e-8 between batches of 1-3 rows and larger ones), so a tighter check would compare
batch composition, not correctness.
"""

from __future__ import annotations

import glob
import os
import re
import time
from urllib.parse import urlparse

import numpy as np
import pyarrow.parquet as pq

from spark_cnn.task.procs import ProcessId, cmdline, is_alive

OUTPUT_ATOL = 1e-5


def committed_tasks(output: str) -> int:
    """Tasks of the running classify job into `output` whose Parquet part is committed (staging directory)."""
    parent, name = os.path.split(output.rstrip("/"))
    return len(glob.glob(os.path.join(parent, f".{name}.spark_cnn-*.tmp", "_temporary", "*", "task_*", "part-*")))


def wait_for(condition, timeout_s: float, poll_s: float = 0.1):
    """The first truthy value of `condition()` within `timeout_s`, else None."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    return None


def sidecar_processes(runtime_dir: str) -> dict[int, list[str]]:
    """Live sidecar processes whose socket lies in `runtime_dir`: pid -> command line."""
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        args = cmdline(int(entry))
        if ("spark_cnn.sidecar" in args and "--socket" in args
                and os.path.dirname(args[args.index("--socket") + 1]) == runtime_dir
                and is_alive(ProcessId(int(entry), 0))):
            found[int(entry)] = args
    return found


def argument(args: list[str], flag: str) -> str:
    return args[args.index(flag) + 1]


def read_rows(output: str) -> dict[str, dict]:
    rows = pq.read_table(output).to_pylist()
    by_path = {urlparse(row["path"]).path: row for row in rows}
    assert len(by_path) == len(rows), f"{len(rows) - len(by_path)} duplicate path(s) in {output}"
    return by_path


def assert_same_output(clean: dict[str, dict], other: dict[str, dict]) -> None:
    assert set(other) == set(clean), (f"missing {sorted(set(clean) - set(other))[:5]}, "
                                      f"extra {sorted(set(other) - set(clean))[:5]}")
    for path, row in clean.items():
        got = other[path]
        assert (_stable(got["error"]), got["label"], got["label_name"]) == \
            (_stable(row["error"]), row["label"], row["label_name"]), path
        if row["error"] is None:
            assert [p["label"] for p in got["topk"]] == [p["label"] for p in row["topk"]], path
            np.testing.assert_allclose(got["score"], row["score"], atol=OUTPUT_ATOL, rtol=0)
            if row.get("logits") is not None:
                np.testing.assert_allclose(got["logits"], row["logits"], atol=OUTPUT_ATOL, rtol=0)


def _stable(error: str | None) -> str | None:
    return None if error is None else re.sub(r"0x[0-9a-fA-F]+", "0x?", error)


def reference_rows(folder: str, weights: str, labels: str) -> dict[str, dict]:
    """What a clean run outputs for the demo model over `folder`, computed in this process without Spark or a
    sidecar: the task's decoding (preprocess_pixels) and the sidecar's ModelRunner, in batches of 64."""
    import torch

    from spark_cnn.errors import ImageError
    from spark_cnn.imaging.preprocess import preprocess_pixels
    from spark_cnn.models.digits import DIGITS_FACTORY
    from spark_cnn.models.resolve import resolve_endpoint
    from spark_cnn.models.spec import ModelSpec
    from spark_cnn.sidecar.runner import ModelRunner

    endpoint = resolve_endpoint(ModelSpec(DIGITS_FACTORY, weights), logits=True).endpoint
    runner = ModelRunner(endpoint, torch.device("cpu"))
    with open(labels) as f:
        names = [line.strip() for line in f if line.strip()]
    rows, decoded = {}, []
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                data = f.read()
            try:
                decoded.append((path, preprocess_pixels(data, endpoint.preprocessing)))
            except ImageError as e:
                rows[path] = {"error": str(e), "label": None, "label_name": None}
    for start in range(0, len(decoded), 64):
        chunk = decoded[start:start + 64]
        out = runner.run(np.stack([pixels for _, pixels in chunk]))
        for i, (path, _) in enumerate(chunk):
            label = int(out["label"][i])
            rows[path] = {"error": None, "label": label, "label_name": names[label], "score": float(out["score"][i]),
                          "topk": [{"label": int(k)} for k in out["topk_label"][i]], "logits": out["logits"][i]}
    return rows
