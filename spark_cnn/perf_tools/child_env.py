"""The environment of a process that perf/ starts to time code as a sidecar runs it: the sidecar's (its malloc
settings, which glibc reads only when a process starts) with this copy of spark_cnn first on the path."""

from __future__ import annotations

import os

from spark_cnn.task.sidecar_env import sidecar_environment

__all__ = ["sidecar_child_env"]

# The folder holding this spark_cnn package: a child imports the same code as its parent.
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def sidecar_child_env(**extra: str) -> dict[str, str]:
    """This process's environment plus the sidecar's malloc settings and `extra`, with PYTHONPATH starting at
    the folder that holds this spark_cnn."""
    env = sidecar_environment()
    env.update(extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH")) if p)
    return env
