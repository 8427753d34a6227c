"""A real Spark Connect server on 127.0.0.1 for tests: the installed pyspark's SparkConnectServer (what
`sbin/start-connect-server.sh` runs, and what `SparkSession.builder.remote("local[2]")` starts in-process) on a
`local[2]` master, in its own process group, with this interpreter for its Python workers. Clients reach it at
`url` from other processes: a process that holds a classic SparkSession (the integration suite's) cannot also
hold a Connect one.

`stop()` ends the server and checks that neither it nor a sidecar of its application is left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from tests.loopback import free_port, listening
from tests.sidecar_harness import sidecar_pids, wait_until

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# A JVM on a busy 2-core machine starts in ~25 s; a server not listening by then is not coming up.
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30




class ConnectServer:
    def __init__(self, root: str):
        import pyspark

        self.root = root
        self.port = free_port()
        self.url = f"sc://127.0.0.1:{self.port}"
        home = os.path.dirname(pyspark.__file__)
        self.log_path = os.path.join(root, "connect-server.log")
        env = {**os.environ, "SPARK_HOME": home, "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_CONF_DIR": os.path.join(REPO, "conf"),  # its log4j2 (warnings only) and Arrow batch bounds
               "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
               # the server's Python workers import this checkout's spark_cnn
               "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
        for name in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE"):
            env.pop(name, None)
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [os.path.join(home, "bin", "spark-submit"), "--class",
                 "org.apache.spark.sql.connect.service.SparkConnectServer", "--name", "spark_cnn-connect-test",
                 "--master", "local[2,4]", "--conf", "spark.connect.grpc.binding.address=127.0.0.1",
                 "--conf", f"spark.connect.grpc.binding.port={self.port}",
                 "--conf", f"spark.pyspark.python={sys.executable}",
                 # the session defaults spark_session gives a classic session (spark/session.py)
                 "--conf", "spark.sql.files.openCostInBytes=262144"],
                env=env, cwd=root, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        self.app_id: str | None = None

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not listening(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"the Connect server did not start; its log:\n{self.log()[-3000:]}")
            time.sleep(0.5)

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()

    def group_processes(self) -> list[str]:
        """Processes still in the server's process group (the JVM, its Python workers and daemons)."""
        self.proc.poll()  # reaps the server once it has exited, so its zombie does not count
        left = []
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit()):
            try:
                if os.getpgid(pid) == self.proc.pid:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        args = f.read().replace(b"\0", b" ").decode(errors="replace")
                    left.append(f"{pid}: {args[:160]}")
            except OSError:
                pass
        return left

    def stop(self) -> None:
        """SIGTERM the server's process group (SIGKILL after STOP_TIMEOUT_S); then nothing of it may be left:
        sidecars exit with their executor JVM."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            if wait_until(lambda: not self.group_processes(), STOP_TIMEOUT_S) is not None:
                break
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        assert not self.group_processes(), f"left running: {self.group_processes()}"
        if self.app_id is not None:
            assert wait_until(lambda: not sidecar_pids(self.app_id)) is not None, \
                f"sidecars of {self.app_id} left running: {sidecar_pids(self.app_id)}"
