"""The sidecar as a real process: start, share, serve exact results to many clients, refuse strangers, exit.

No Spark and no mocks: each test starts `python -m spark_cnn.sidecar` through the launcher, with a sleeping child
process standing in for the executor JVM it watches, and the tiny demo CNN (random weights) as its model. All
files live in a private runtime directory under /tmp (Unix socket paths must stay under ~100 bytes). Every test
stops what it started and checks that no sidecar process of its application id is left (tests/sidecar_harness.py;
the fixtures are in conftest.py).

A sidecar start costs ~3 s (importing torch), so the tests that leave their sidecar running share one.
"""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from spark_cnn.errors import SidecarError
from spark_cnn.models.digits import DIGITS_PREPROCESSING
from spark_cnn.models.spec import Endpoint
from spark_cnn.task import launcher, protocol
from spark_cnn.task.client import SidecarClient, map_ordered
from spark_cnn.task.launcher import (
    ensure_sidecar,
    find_sidecars,
    stop_sidecars,
)
from spark_cnn.task.procs import ProcessId, cmdline, is_alive, process_id
from spark_cnn.task.protocol import Kind
from spark_cnn.task.sidecar_env import sidecar_environment
from tests.sidecar_harness import (
    EXIT_WAIT_S,
    PIXEL_SHAPE,
    FakeApp,
    check_against_reference,
    gone,
    random_pixels,
    sidecar_pids,
    wait_until,
)

# Every test starts sidecar processes or talks to the shared one.
pytestmark = pytest.mark.slow

# A start that fails must be reported once the process dies (import torch + one error), not at the 180 s limit.
FAILED_START_BOUND_S = 60.0


# --- start and share --------------------------------------------------------------------------------------------

def test_one_sidecar_per_key_visible_in_ps_with_private_files(shared, runtime):
    app, info = shared

    again = ensure_sidecar(app.options(), app.executor)

    assert again.pid == info.pid
    assert (info.app_id, info.executor, info.device) == (app.app_id, "exec-test", "cpu")
    args = cmdline(info.pid)
    assert "spark_cnn" in " ".join(args) and "sidecar" in " ".join(args), args
    assert info.token not in " ".join(args), "the access token must not be visible in ps"
    assert stat.S_IMODE(os.stat(runtime).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(app.base() + ".json").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(info.socket).st_mode) == 0o600
    assert stat.S_ISSOCK(os.stat(info.socket).st_mode)
    assert [found.pid for found in find_sidecars(app.app_id)] == [info.pid]
    with open(f"/proc/{info.pid}/environ", "rb") as f:  # started with the malloc settings the time model assumes
        environ = set(f.read().split(b"\0"))
    assert {f"{k}={v}".encode() for k, v in sidecar_environment().items() if k.startswith("MALLOC_")} <= environ


_RACE_SCRIPT = textwrap.dedent("""
    import os, sys, time
    from spark_cnn.task.launcher import LaunchOptions, ensure_sidecar
    from spark_cnn.task.procs import ExecutorProcess, ProcessId
    pid, start_time, app_id, ready, go = sys.argv[1:]
    open(ready, "w").close()
    while not os.path.exists(go):
        time.sleep(0.002)
    executor = ExecutorProcess(ProcessId(int(pid), int(start_time)), "exec-test")
    print(ensure_sidecar(LaunchOptions(app_id=app_id, device="cpu"), executor).pid)
""")


def test_concurrent_starts_share_one_sidecar(app, runtime):
    signals = tempfile.mkdtemp(prefix="go", dir=os.path.dirname(runtime))
    go = os.path.join(signals, "go")
    readies = [os.path.join(signals, f"ready{i}") for i in range(4)]
    starters = [subprocess.Popen([sys.executable, "-c", _RACE_SCRIPT, str(app.executor.process.pid),
                                  str(app.executor.process.start_time), app.app_id, ready, go],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for ready in readies]
    try:
        assert wait_until(lambda: all(os.path.exists(r) for r in readies), 30.0) is not None
        open(go, "w").close()  # all four call ensure_sidecar at once
        outputs = [starter.communicate(timeout=60) for starter in starters]
    finally:
        for starter in starters:
            starter.kill()
            starter.wait()

    assert [starter.returncode for starter in starters] == [0] * 4, [err for _, err in outputs]
    pids = {int(out.strip()) for out, _ in outputs}
    assert len(pids) == 1, pids
    assert sidecar_pids(app.app_id) == list(pids)


# --- results ----------------------------------------------------------------------------------------------------

def test_results_are_exact_and_in_request_order(shared, endpoint, reference):
    _, info = shared
    rng = np.random.default_rng(1)
    # 17 rows span three device batches of 8; 70 rows exceed the queue bound of 64 and must still be served.
    requests = [(f"req{i}", random_pixels(rng, rows)) for i, rows in enumerate([1, 5, 17, 3, 70, 2])]

    with SidecarClient(info.socket, info.token, endpoint, job=f"order-{uuid.uuid4().hex[:6]}") as client:
        replies = list(map_ordered(client, requests))

    assert [key for key, _ in replies] == [key for key, _ in requests]
    for (_, pixels), (_, reply) in zip(requests, replies, strict=True):
        check_against_reference(reference, pixels, reply)


def test_decode_auto_on_a_cpu_sidecar_decodes_in_the_tasks(shared, endpoint, reference):
    _, info = shared
    pixels = random_pixels(np.random.default_rng(8), 3)
    with SidecarClient(info.socket, info.token, endpoint, job="auto-decode", decode="auto") as client:
        assert client.decode == "task" and client.ready["decode"] == "task"
        replies = dict(map_ordered(client, [("a", pixels)]))
        stats = client.stats("auto-decode")
    check_against_reference(reference, pixels, replies["a"])
    assert stats["decode"] == "task"
    assert stats["decode_cpu_s"] == 0.0  # nothing decoded here


def test_a_sidecar_that_decodes_counts_its_decoding_cpu_apart(shared, endpoint):
    """decode_cpu_s is the decoding threads' own CPU time: what nvJPEG takes off a GPU node's host, kept apart
    from serving (the bench's device budget subtracts it)."""
    import io

    from PIL import Image

    _, info = shared
    rng = np.random.default_rng(9)
    files = []
    for _ in range(24):
        buf = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (300, 400, 3), dtype=np.uint8)).save(buf, format="JPEG")
        files.append(buf.getvalue())
    with SidecarClient(info.socket, info.token, endpoint, job="sidecar-decode", decode="sidecar") as client:
        assert client.decode == "sidecar"
        replies = dict(map_ordered(client, [(i, files[i::3]) for i in range(3)]))
        stats = client.stats("sidecar-decode")
    assert sum(reply.num_rows for reply in replies.values()) == 24
    assert stats["decode"] == "sidecar" and stats["images"] == 24
    assert 0.0 < stats["decode_cpu_s"] < 24 * 0.2, stats  # Pillow at 400x300: ~1-5 ms an image on a core


def test_the_tasks_decoding_cpu_they_tell_is_summed_per_job(shared, endpoint, reference):
    """A task prices each request with the CPU it took to make its images; the sidecar sums it per job
    (task_decode_cpu_s), the decoding half of the bench's useful share. Unpriced requests add nothing."""
    _, info = shared
    pixels = random_pixels(np.random.default_rng(4), 6)
    priced = [(i, protocol.PricedImages(pixels[i::3], 0.125)) for i in range(3)]
    with SidecarClient(info.socket, info.token, endpoint, job="task-decode-cpu") as client:
        replies = list(map_ordered(client, [*priced, (3, pixels[:2])]))
        stats = client.stats("task-decode-cpu")
    for (_, sent), (_, reply) in zip([*priced, (3, protocol.PricedImages(pixels[:2]))], replies, strict=True):
        check_against_reference(reference, sent.images, reply)
    assert stats["task_decode_cpu_s"] == 0.375 and stats["decode_cpu_s"] == 0.0 and stats["images"] == 8, stats


def test_a_jobs_device_profile_reaches_the_sidecars_start_point(shared, endpoint, reference):
    from spark_cnn.task.run_options import RunOptions
    from tests.perf_doubles import synthetic_profile

    _, info = shared
    pixels = random_pixels(np.random.default_rng(9), 3)
    # precision fp32, named: a service of its own (the shared sidecar's auto service predates this profile)
    options = RunOptions(precision="fp32", device_profile=synthetic_profile().to_json())
    with SidecarClient(info.socket, info.token, endpoint, job="job-profile", run_options=options) as client:
        replies = dict(map_ordered(client, [("a", pixels)]))
        stats = client.stats("job-profile")
    check_against_reference(reference, pixels, replies["a"])
    predicted = stats["tuning"]["predicted_images_per_s"]  # the test cache is empty: only the job's profile
    assert set(predicted) >= {"1", "8", "64"} and stats["tuning"]["start"] in {int(b) for b in predicted}
    assert stats["prediction"]["verdict"] == "too few batches"


def test_concurrent_clients_each_get_their_own_results(shared, endpoint, reference):
    _, info = shared
    clients, requests_each = 6, 20
    job = f"concurrent-{uuid.uuid4().hex[:6]}"
    start_together = threading.Barrier(clients)

    def one_client(seed: int) -> list[tuple[np.ndarray, object]]:
        rng = np.random.default_rng(100 + seed)
        # Distinct per client: the first pixel of every image carries the client's number.
        requests = []
        for i in range(requests_each):
            pixels = random_pixels(rng, int(rng.integers(1, 10)))
            pixels[:, 0, 0, 0] = seed
            requests.append((i, pixels))
        with SidecarClient(info.socket, info.token, endpoint, job=job) as client:
            start_together.wait(timeout=30)
            replies = list(map_ordered(client, requests))
        assert [key for key, _ in replies] == list(range(requests_each))
        return [(pixels, reply) for (_, pixels), (_, reply) in zip(requests, replies, strict=True)]

    with ThreadPoolExecutor(clients) as pool:
        results = [future.result(timeout=120) for future in [pool.submit(one_client, c) for c in range(clients)]]

    for per_client in results:
        for pixels, reply in per_client:
            check_against_reference(reference, pixels, reply)
    with SidecarClient(info.socket, info.token, endpoint, job=job) as client:
        stats = client.stats(job)
    total_rows = sum(len(pixels) for per_client in results for pixels, _ in per_client)
    assert stats["requests"] == clients * requests_each
    assert stats["images"] == total_rows
    assert stats["errors"] == 0
    assert stats["pid"] == info.pid
    assert stats["mean_batch_size"] > 1
    # Splitting only adds batches: fewer batches than requests means requests were merged into shared batches.
    assert stats["batches"] < stats["requests"], stats


# --- refusals and bad requests ----------------------------------------------------------------------------------

def test_wrong_token_is_refused_and_the_sidecar_keeps_serving(shared, endpoint, reference):
    _, info = shared

    with pytest.raises(SidecarError, match="refused"):
        SidecarClient(info.socket, "0" * len(info.token), endpoint, job="intruder")

    pixels = random_pixels(np.random.default_rng(2), 4)
    with SidecarClient(info.socket, info.token, endpoint, job="after-intruder") as client:
        [(_, reply)] = list(map_ordered(client, [("ok", pixels)]))
    check_against_reference(reference, pixels, reply)


@pytest.mark.parametrize("bad_pixels", [
    np.zeros((3, 16, 16, 3), dtype=np.uint8),  # another model's input size
    np.zeros((0, *PIXEL_SHAPE), dtype=np.uint8),  # no images at all
], ids=["wrong-shape", "empty"])
def test_bad_infer_fails_that_request_only(shared, endpoint, reference, bad_pixels):
    _, info = shared
    rng = np.random.default_rng(3)
    before, after = random_pixels(rng, 2), random_pixels(rng, 3)
    job = f"bad-{uuid.uuid4().hex[:6]}"

    with SidecarClient(info.socket, info.token, endpoint, job=job) as client:
        replies = dict(map_ordered(client, [("before", before), ("bad", bad_pixels), ("after", after)]))
        later = dict(map_ordered(client, [("later", before)]))  # the same connection, after the error
        stats = client.stats(job)

    assert isinstance(replies["bad"], SidecarError)
    assert "bad request" in str(replies["bad"])
    check_against_reference(reference, before, replies["before"])
    check_against_reference(reference, after, replies["after"])
    check_against_reference(reference, before, later["later"])
    assert (stats["requests"], stats["errors"]) == (3, 1)


def test_undecodable_infer_payload_fails_that_request_only(shared, endpoint, reference):
    """A payload that is not Arrow at all, sent over the raw protocol, fails only its request id."""
    _, info = shared
    pixels = random_pixels(np.random.default_rng(4), 2)

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(info.socket)
        protocol.send_json(sock, Kind.HELLO, 1, {"token": info.token, "endpoint": endpoint.to_json(), "job": "raw"})
        assert protocol.recv_frame(sock).kind == Kind.READY
        protocol.send_frame(sock, Kind.INFER, 2, b"these bytes are not an Arrow stream")
        error = protocol.recv_frame(sock)
        protocol.send_frame(sock, Kind.INFER, 3, protocol.encode_pixels(pixels))
        result = protocol.recv_frame(sock)

    assert (error.kind, error.request_id) == (Kind.ERROR, 2)
    assert "bad request" in error.json()["message"]
    assert (result.kind, result.request_id) == (Kind.RESULT, 3)
    check_against_reference(reference, pixels, protocol.decode_outputs(result.payload))


def test_unloadable_model_is_refused_at_handshake_and_the_sidecar_keeps_serving(shared, endpoint, reference):
    _, info = shared
    missing = Endpoint(source="spark_cnn_no_such_module:factory", weights=None,
                       preprocessing=DIGITS_PREPROCESSING, top_k=1).with_fingerprint()

    with pytest.raises(SidecarError, match="spark_cnn_no_such_module"):
        SidecarClient(info.socket, info.token, missing, job="missing-model")

    pixels = random_pixels(np.random.default_rng(5), 1)
    with SidecarClient(info.socket, info.token, endpoint, job="after-missing") as client:
        [(_, reply)] = list(map_ordered(client, [("ok", pixels)]))
    check_against_reference(reference, pixels, reply)
    assert is_alive(ProcessId(info.pid, 0))


# --- lifecycle ----------------------------------------------------------------------------------------------------

def _files_removed(app: FakeApp) -> bool:
    return not os.path.exists(app.base() + ".json") and not os.path.exists(app.base() + ".sock")


def test_sidecar_exits_with_its_executor(app):
    info = ensure_sidecar(app.options(), app.executor)

    app.child.kill()
    app.child.wait()

    waited = wait_until(lambda: gone(info.pid))
    assert waited is not None, f"sidecar {info.pid} still running {EXIT_WAIT_S} s after its executor died"
    assert waited < 5.0, f"sidecar took {waited:.1f} s to notice its executor died"
    assert wait_until(lambda: _files_removed(app), 2.0) is not None


def test_idle_sidecar_exits_but_not_while_a_client_is_connected(app, endpoint):
    info = ensure_sidecar(app.options(idle_timeout_s=1.0), app.executor)

    with SidecarClient(info.socket, info.token, endpoint, job="idle"):
        time.sleep(2.5)  # over twice the idle timeout, with a connection open
        assert is_alive(ProcessId(info.pid, 0)), "a sidecar with a connected client must not count as idle"

    assert wait_until(lambda: gone(info.pid)) is not None, "the idle sidecar did not exit"
    assert wait_until(lambda: _files_removed(app), 2.0) is not None
    with open(app.base() + ".log") as f:
        assert "exiting: idle" in f.read()


def test_stop_sidecars_stops_a_running_sidecar(app):
    info = ensure_sidecar(app.options(), app.executor)

    assert stop_sidecars(app.app_id) == 1

    assert gone(info.pid)
    assert _files_removed(app)
    assert stop_sidecars(app.app_id) == 0


def test_stop_sidecars_tolerates_a_sidecar_exiting_meanwhile(app, monkeypatch):
    """The driver calls stop_sidecars in a `finally`: a sidecar exiting on its own at that moment (idle, executor
    gone) must not make it raise ProcessLookupError and hide the job's own outcome."""
    info = ensure_sidecar(app.options(), app.executor)
    real_cmdline = launcher.cmdline

    def cmdline_then_exit(pid: int) -> list[str]:
        # The sidecar's own pid-reuse check passes, then the sidecar exits (e.g. it was idle) before the signal.
        args = real_cmdline(pid)
        if pid == info.pid and args:
            os.kill(pid, signal.SIGKILL)
            assert wait_until(lambda: not os.path.exists(f"/proc/{pid}")) is not None  # reaped by the launcher
        return args

    monkeypatch.setattr(launcher, "cmdline", cmdline_then_exit)

    assert stop_sidecars(app.app_id) == 0  # it was gone before the signal: this call stopped nothing
    assert gone(info.pid)


def test_stop_sidecars_waits_for_a_sidecar_on_its_way_out(app):
    """A sidecar whose executor ended removes its socket and info file, then its interpreter tears down: the driver
    stopping Spark first meets it in that state, and must not return while it still runs (nor while one starts)."""
    info = ensure_sidecar(app.options(), app.executor)
    os.unlink(info.socket)  # as lifecycle.remove_files leaves it on its way out
    os.unlink(app.base() + ".json")
    assert find_sidecars(app.app_id) == []

    assert stop_sidecars(app.app_id) == 0  # none was serving

    assert gone(info.pid)


@pytest.mark.parametrize("ending", ["asked to stop", "executor gone"])
def test_a_sidecar_that_ends_exits_0_with_its_files_removed_and_its_last_log_line_out(app, ending):
    """The sidecar ends without the interpreter's teardown (lifecycle.exit_process): a clean status, its files
    removed, and its last log line written before the process is gone."""
    executor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    base = os.path.join(launcher.runtime_dir(), f"direct-{uuid.uuid4().hex[:8]}")
    sidecar = subprocess.Popen(
        [sys.executable, "-m", "spark_cnn.sidecar", "--socket", base + ".sock", "--info", base + ".json",
         "--device", "cpu", "--app-id", app.app_id, "--watch-pid", str(executor.pid),
         "--watch-start-time", str(process_id(executor.pid).start_time)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=sidecar_environment())
    try:
        assert wait_until(lambda: os.path.exists(base + ".json"), FAILED_START_BOUND_S) is not None
        if ending == "asked to stop":
            sidecar.send_signal(signal.SIGTERM)
        else:
            executor.kill()
        output, _ = sidecar.communicate(timeout=EXIT_WAIT_S)
    finally:
        for process in (sidecar, executor):
            process.kill()
            process.wait()
    assert sidecar.returncode == 0, output[-2000:]
    assert not os.path.exists(base + ".sock") and not os.path.exists(base + ".json")
    expected = "asked to stop" if ending == "asked to stop" else f"executor process {executor.pid} is gone"
    assert output.splitlines()[-1].endswith(f"exiting: {expected}"), output[-2000:]


def test_request_to_an_exited_sidecar_raises_sidecar_error(app, endpoint):
    info = ensure_sidecar(app.options(), app.executor)
    with SidecarClient(info.socket, info.token, endpoint, job="orphan") as client:
        assert stop_sidecars(app.app_id) == 1

        with pytest.raises(SidecarError, match="closed the connection|cannot reach|cannot send"):
            list(map_ordered(client, [("after-exit", random_pixels(np.random.default_rng(6), 1))]))


def test_failed_start_is_reported_quickly_with_the_log_tail(app):
    started = time.monotonic()

    with pytest.raises(SidecarError) as raised:
        ensure_sidecar(app.options(device="cuda:7"), app.executor)

    elapsed = time.monotonic() - started
    assert elapsed < FAILED_START_BOUND_S
    message = str(raised.value)
    assert "exited with code" in message
    assert "ConfigError" in message and "cuda:7" in message, message
    assert sidecar_pids(app.app_id) == []
    assert not os.path.exists(app.base("cuda:7") + ".json")
