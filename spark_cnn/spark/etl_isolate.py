"""A micro-batch that fails every time it runs: find the files it fails on, so the run can go on without them.

A model that raises on one image, or a decoder that runs out of memory on one file, fails the whole Spark job
of its micro-batch; the checkpoint replays that batch first on every run, so without this nothing new would ever
be processed. Once a batch has failed MAX_BATCH_ATTEMPTS times (kills included: the checkpoint counts attempts
before they start), it is split in halves and each half runs on its own, recursively; a file that fails alone
is isolated (the job writes it as an error row) and the rest land as usual. Pure: the caller's `process`
writes a group of files and raises when it fails.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

from spark_cnn.errors import SparkCnnError

T = TypeVar("T")

# Spark has already retried each failed task before a batch fails, so a batch that fails on a second run as well
# fails on its own files, not on a hiccup; a third try would only hold new files back one run longer.
MAX_BATCH_ATTEMPTS = 2
# More files failing alone than this in one batch is the model or the cluster, not the files: stop (the batch
# stays pending) instead of turning every file into an error row. Each isolated file costs about two Spark jobs.
MAX_ISOLATED_FILES = 10


def isolate(items: Sequence[T], process: Callable[[list[T]], None], *, failure: Exception | None = None,
            max_isolated: int = MAX_ISOLATED_FILES) -> list[tuple[T, Exception | None]]:
    """`items` failed together (with `failure`, when known): run `process` on halves, and on the halves of a half
    that fails, down to single items. Returns each item that failed alone, with its error, in order. A single
    item is not run again: it has failed alone already. Raises SparkCnnError when more than `max_isolated`
    items fail alone.

    >>> def process(group):
    ...     if 3 in group:
    ...         raise ValueError("no 3s")
    >>> [(item, str(error)) for item, error in isolate(list(range(6)), process)]
    [(3, 'no 3s')]
    """
    if len(items) == 1:
        return [(items[0], failure)]
    isolated: list[tuple[T, Exception | None]] = []

    def split(group: list[T]) -> None:
        half = len(group) // 2
        for part in (group[:half], group[half:]):
            try:
                process(part)
            except Exception as e:
                if len(part) > 1:
                    split(part)
                    continue
                isolated.append((part[0], e))
                if len(isolated) > max_isolated:
                    raise SparkCnnError(
                        f"more than {max_isolated} files of one micro-batch fail even alone, so the fault is not "
                        f"in the files (the model, the cluster?): fix it and run again; the batch stays pending "
                        f"(the last: {first_line(e)})") from e

    split(list(items))
    return isolated


class BatchLog(Protocol):
    def start_attempt(self, n: int) -> int: ...
    def commit(self, n: int) -> None: ...


class BatchWriter(Protocol):
    """`write` a batch whole; or `begin`, `write_part` (raises when its job fails), `finish` with error rows."""

    def write(self, batch_id: int, files: list) -> None: ...
    def begin(self, batch_id: int) -> None: ...
    def write_part(self, batch_id: int, files: list) -> None: ...
    def finish(self, batch_id: int, files: list, errors: list[tuple[str, str]]) -> None: ...


def run_batch(log: BatchLog, writer: BatchWriter, batch_id: int, files: list, *, replay: bool) -> list[str]:
    """Write micro-batch `batch_id` and commit it; `replay`: a batch an earlier run planned and never committed.
    Its MAX_BATCH_ATTEMPTS-th failure isolates the files it fails on (error rows) instead of failing the run;
    an earlier failure fails the run, so that a passing fault (a cluster going down) turns no file into an error
    row. Returns the paths isolated."""
    attempts = log.start_attempt(batch_id) if replay else 1  # a new batch's file counts as its first attempt
    failure = None
    if attempts <= MAX_BATCH_ATTEMPTS:
        try:
            writer.write(batch_id, files)
        except Exception as e:
            if attempts < MAX_BATCH_ATTEMPTS:
                raise
            failure = e
        else:
            log.commit(batch_id)
            return []
    writer.begin(batch_id)
    bad = isolate(files, lambda group: writer.write_part(batch_id, group), failure=failure)
    writer.finish(batch_id, files, [(f.path, isolated_error(attempts, error)) for f, error in bad])
    log.commit(batch_id)
    return [f.path for f, _ in bad]


def isolated_error(attempts: int, error: Exception | None) -> str:
    """The error row of a file isolated from a batch that failed `attempts` times."""
    why = first_line(error) if error is not None else "the runs that tried it failed or were killed"
    return (f"isolated: its micro-batch failed {attempts} times and this file failed alone as well, so the run "
            f"went on without it: {why}")


def first_line(error: Exception) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
