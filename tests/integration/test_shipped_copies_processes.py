"""Shipped copies of real driver processes: a driver SIGKILLed mid-session (no atexit) leaves its folder of model
copies, and the next driver to ship a file removes it, leaving a live driver's folder alone; drivers that exit
normally remove their own (spark/shipped_copies.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from spark_cnn.spark.shipped_copies import FOLDER_PREFIX

DRIVER = ("import sys\n"
          "from spark_cnn.spark.shipped_copies import content_addressed_copy\n"
          "print(content_addressed_copy(sys.argv[1]), flush=True)\n"
          "sys.stdin.read()\n")  # a driver alive until its stdin closes


def _driver(weights: str, env: dict) -> tuple[subprocess.Popen, str]:
    child = subprocess.Popen([sys.executable, "-c", DRIVER, weights], env=env, text=True,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return child, os.path.dirname(child.stdout.readline().strip())


def _ship_folders(parent) -> list[str]:
    return sorted(os.path.join(parent, n) for n in os.listdir(parent) if n.startswith(FOLDER_PREFIX))


def test_a_killed_drivers_copies_are_swept_by_the_next_and_a_live_drivers_kept(tmp_path):
    weights = tmp_path / "model.pt"
    weights.write_bytes(os.urandom(1 << 16))
    parent = tmp_path / "tmp"
    parent.mkdir()
    env = {**os.environ, "TMPDIR": str(parent)}
    killed, killed_folder = _driver(str(weights), env)
    alive, alive_folder = _driver(str(weights), env)
    try:
        killed.kill()
        killed.wait(timeout=30)
        assert _ship_folders(parent) == sorted([killed_folder, alive_folder])  # SIGKILL: no atexit ran

        finished = subprocess.run([sys.executable, "-c", DRIVER, str(weights)], env=env, input="",
                                  capture_output=True, text=True, timeout=60)
        assert finished.returncode == 0, finished.stderr
        assert _ship_folders(parent) == [alive_folder]  # the killed one swept, the finished one removed at exit
        assert os.listdir(alive_folder) != []
    finally:
        alive.stdin.close()
        assert alive.wait(timeout=30) == 0
        if killed.poll() is None:
            os.kill(killed.pid, signal.SIGKILL)
    assert _ship_folders(parent) == [] and os.listdir(parent) == []
