"""Spark's answers to what a task asks its engine (task/stream.py TaskEnvironment): shipped files, GPUs."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark import SparkFiles, TaskContext

from spark_cnn.task.stream import TaskEnvironment


def shipped_file(name: str) -> str:
    """The executor-local copy of a file the driver shipped with `SparkContext.addFile`."""
    return SparkFiles.get(name)


def task_gpu_addresses() -> Sequence[str]:
    """The GPUs Spark's resource scheduling gave the running task (none without GPU scheduling)."""
    context = TaskContext.get()
    gpus = context.resources().get("gpu") if context is not None else None
    return tuple(gpus.addresses) if gpus is not None else ()


SPARK_TASK = TaskEnvironment(shipped_file=shipped_file, gpu_addresses=task_gpu_addresses)
