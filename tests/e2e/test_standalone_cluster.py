"""A real Spark standalone cluster on 127.0.0.1 (a master and two workers from the installed pyspark), a job submitted
to it with spark-submit, one sidecar per executor, error rows, and nothing left running afterwards.

The job is the detector's (images at their own sizes, boxes per image): the one several-executor run of it. Classify
on several executors, its rows checked one by one against a clean run: the executor kill of test_faults.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request

import pyarrow.parquet as pq
import pytest

from spark_cnn.models.tiny_dense import TINY_DETECTOR
from tests.e2e.conftest import JOB_TIMEOUT_S
from tests.loopback import free_port
from tests.sample_images import broken_files, digits_subset, write_files
from tests.sidecar_harness import sidecar_pids, wait_until

pytestmark = pytest.mark.e2e

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Starting a JVM on a busy 2-core machine takes ~10 s; a cluster not up in this time is not coming up.
CLUSTER_START_TIMEOUT_S = 90



def _spark_bin(name: str) -> str:
    import pyspark

    return os.path.join(os.path.dirname(pyspark.__file__), "bin", name)


def _alive_workers(ui_port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as reply:
            return int(json.load(reply).get("aliveworkers", 0))
    except OSError:
        return 0


def _ours(pids_groups: list[int], root: str) -> list[str]:
    """Processes this test started that are still there: in one of its process groups, or working in its tmp."""
    left = []
    for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
            if os.getpgid(pid) in pids_groups or cwd.startswith(root):
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    args = f.read().replace(b"\0", b" ").decode(errors="replace")
                left.append(f"{pid}: {args[:200]}")
        except (OSError, ProcessLookupError):
            pass  # gone meanwhile, or not ours to read
    return left


class Cluster:
    """A master and workers, each `spark-class` in its own process group (so teardown reaches the executors
    the workers fork), logs and work dirs under `root`."""

    def __init__(self, root: str, workers: int):
        self.root, self.workers = root, workers
        self.port, self.ui_port = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOCAL_HOSTNAME": "localhost",
                    "SPARK_DAEMON_MEMORY": "256m", "SPARK_WORKER_DIR": os.path.join(root, "work"),
                    "SPARK_LOG_DIR": os.path.join(root, "logs"), "SPARK_PID_DIR": root,
                    "SPARK_CONF_DIR": os.path.join(REPO, "conf"),  # its log4j2: warnings only
                    "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}

    def _start(self, name: str, *args: str) -> None:
        log = open(os.path.join(self.root, f"{name}.log"), "wb")
        self.procs.append(subprocess.Popen([_spark_bin("spark-class"), *args], env=self.env, cwd=self.root,
                                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()

    def start(self) -> None:
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                    "--port", str(self.port), "--webui-port", str(self.ui_port))
        for i in range(self.workers):
            self._start(f"worker-{i}", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                        "--cores", "1", "--memory", "1g", "--webui-port", "0",
                        "--work-dir", os.path.join(self.root, "work", str(i)))
        deadline = time.monotonic() + CLUSTER_START_TIMEOUT_S
        while _alive_workers(self.ui_port) < self.workers:
            exited = [p.args[1] for p in self.procs if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                raise AssertionError(f"cluster did not start (exited: {exited}); logs in {self.root}:\n"
                                     + self.logs())
            time.sleep(0.5)

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n" + open(os.path.join(self.root, n), errors="replace").read()[-1500:]
                         for n in sorted(os.listdir(self.root)) if n.endswith(".log"))

    def stop(self) -> None:
        for proc in self.procs:
            _stop_group(proc)


def _stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the process group, then SIGKILL what is left of it."""
    for sig, wait_s in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                proc.poll()
                return
            proc.poll()
            time.sleep(0.1)


def test_spark_submit_to_a_standalone_cluster_uses_one_sidecar_per_executor(demo_assets, tmp_path):
    root = str(tmp_path)
    images = write_files(digits_subset(demo_assets, os.path.join(root, "in"), per_class=10), broken_files())
    output, summary_path = os.path.join(root, "out"), os.path.join(root, "summary.json")
    cluster = Cluster(os.path.join(root, "cluster"), workers=2)
    os.makedirs(cluster.root)
    groups: list[int] = []
    try:
        cluster.start()
        groups = [p.pid for p in cluster.procs]
        with open(os.path.join(root, "submit.log"), "wb") as log:
            submit = subprocess.Popen(
                [_spark_bin("spark-submit"), "--master", cluster.url, "--conf", "spark.driver.host=127.0.0.1",
                 "--conf", "spark.executor.cores=1", "--conf", "spark.cores.max=2", "--executor-memory", "512m",
                 # Both executors registered before the first task, so the work spreads over both.
                 "--conf", "spark.scheduler.minRegisteredResourcesRatio=1.0",
                 "--conf", "spark.scheduler.maxRegisteredResourcesWaitingTime=60s",
                 os.path.join(REPO, "jobs", "detect.py"), images, output, "--model", TINY_DETECTOR,
                 "--max-detections", "3", "--summary", summary_path],
                env=cluster.env, cwd=root, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            groups.append(submit.pid)
            try:
                submit.wait(timeout=JOB_TIMEOUT_S)
            finally:
                _stop_group(submit)
        report = open(os.path.join(root, "submit.log"), errors="replace").read()
        assert submit.returncode == 0, report[-4000:] + cluster.logs()

        summary = json.load(open(summary_path))
        assert (summary["images"], summary["errors"]) == (103, 3)
        sidecars = summary["sidecars"]
        assert sorted(s["executor"] for s in sidecars) == ["0", "1"], sidecars  # one sidecar per executor
        assert len({s["pid"] for s in sidecars}) == 2 and all(s["images"] > 0 for s in sidecars)
        assert sum(s["images"] for s in sidecars) == 100  # the three broken files never reach a sidecar
        assert summary["app_id"].startswith("app-")  # a standalone application, not local mode
        rows = pq.read_table(output).to_pylist()
        assert len(rows) == 103 and len({r["path"] for r in rows}) == 103
        boxes = [r["detections"] for r in rows if r["error"] is None]
        assert len(boxes) == 100 and all(len(found) == 3 for found in boxes)
        assert "sidecars    2" in report and "output      file://" in report
        # the application is over, its executors gone: their sidecars follow them, the cluster still up
        assert wait_until(lambda: not sidecar_pids(summary["app_id"]), 15.0) is not None, "a sidecar outlived its run"
    finally:
        cluster.stop()
        deadline = time.monotonic() + 20
        while _ours(groups, cluster.root) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = _ours(groups, cluster.root)
    assert left == [], f"processes left running: {left}"
