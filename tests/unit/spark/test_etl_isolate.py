"""A micro-batch that fails every time: after MAX_BATCH_ATTEMPTS failed attempts its bad files are isolated as
error rows and the runs go on with new files (pure: a writer double over a real checkpoint folder, no Spark)."""

from __future__ import annotations

import pytest

from spark_cnn.errors import SparkCnnError
from spark_cnn.spark.etl_isolate import MAX_BATCH_ATTEMPTS, MAX_ISOLATED_FILES, isolate, run_batch
from spark_cnn.spark.etl_listing import ListedFile, micro_batches
from spark_cnn.spark.etl_log import EtlLog
from spark_cnn.spark.storage import ArrowFS


class _Fails:
    """`process` for isolate: raises on any group holding a bad item; counts the groups it ran."""

    def __init__(self, bad):
        self.bad, self.runs, self.done = set(bad), [], []

    def __call__(self, group):
        self.runs.append(list(group))
        hit = self.bad.intersection(group)
        if hit:
            raise RuntimeError(f"the model fails on {min(hit)}")
        self.done.extend(group)


@pytest.mark.parametrize("bad", [[5], [0, 13], [15]])
def test_isolate_finds_the_bad_items_and_processes_every_other_one_once(bad):
    process = _Fails(bad)
    isolated = isolate(list(range(16)), process)
    assert [item for item, _ in isolated] == bad
    assert all(str(error) == f"the model fails on {item}" for item, error in isolated)
    assert sorted(process.done) == sorted(set(range(16)) - set(bad))  # each good item written once
    assert len(process.runs) <= 2 * len(bad) * 4  # two groups per level, log2(16) levels per bad item


def test_isolate_runs_a_lone_item_no_more_and_stops_when_everything_fails():
    never = _Fails([])
    error = RuntimeError("out of memory")
    assert isolate(["a"], never, failure=error) == [("a", error)] and never.runs == []
    everything = _Fails(range(100))
    with pytest.raises(SparkCnnError, match=f"more than {MAX_ISOLATED_FILES} files .* fail even alone"):
        isolate(list(range(100)), everything)
    assert len(everything.runs) < 4 * MAX_ISOLATED_FILES + 2 * 7  # bounded: not a job per item of the batch


class _Writer:
    """MicroBatchWriter's calls, less Spark: a job fails when its files include a bad one."""

    def __init__(self, bad: set[str]):
        self.bad, self.rows, self.jobs = bad, {}, 0
        self._staged: dict[int, dict[str, str | None]] = {}

    def _job(self, files):
        self.jobs += 1
        hit = sorted(self.bad & {f.path for f in files})
        if hit:
            raise SparkCnnError(f"the Spark job failed: the model raised on {hit[0]}")
        return {f.path: None for f in files}

    def write(self, batch_id, files):
        self.rows.update(self._job(files))

    def begin(self, batch_id):
        self._staged[batch_id] = {}

    def write_part(self, batch_id, files):
        self._staged[batch_id].update(self._job(files))

    def finish(self, batch_id, files, errors):
        self.rows.update(self._staged.pop(batch_id))
        self.rows.update(dict(errors))


def _run(root: str, writer: _Writer, listed: list[str]) -> list[str]:
    """One run as etl_job.run_etl drives the batches: the pending one first, then the new files."""
    log = EtlLog(ArrowFS(), root)
    isolated = []
    pending = log.pending_batch()
    if pending is not None:
        isolated += run_batch(log, writer, *pending, replay=True)
    ready = [ListedFile(p, 1, 0) for p in listed if p not in log.taken]
    for files in micro_batches(ready, max_files=8, max_bytes=1 << 30):
        isolated += run_batch(log, writer, log.plan(files), files, replay=False)
    return isolated


def test_a_batch_that_always_fails_is_isolated_on_its_last_attempt_and_new_files_go_on(tmp_path):
    root = f"file:{tmp_path}/checkpoint"
    poison = "file:/in/03.png"
    writer = _Writer({poison})
    first = [f"file:/in/{i:02d}.png" for i in range(8)]
    for _ in range(MAX_BATCH_ATTEMPTS - 1):  # the failure fails the run: it may pass (a cluster going down)
        with pytest.raises(SparkCnnError, match="raised on file:/in/03.png"):
            _run(root, writer, first)
    assert writer.rows == {}
    later = first + [f"file:/in/{i:02d}.png" for i in range(8, 12)]
    assert _run(root, writer, later) == [poison]  # the last attempt fails too: isolated, and the run goes on
    assert sorted(writer.rows) == later  # one row per file, the new ones included
    assert writer.rows[poison].startswith(f"isolated: its micro-batch failed {MAX_BATCH_ATTEMPTS} times")
    assert "raised on file:/in/03.png" in writer.rows[poison]
    assert all(writer.rows[p] is None for p in later if p != poison)
    assert _run(root, writer, later) == [] and EtlLog(ArrowFS(), root).pending_batch() is None


def test_a_batch_whose_runs_were_killed_is_isolated_without_running_it_whole_again(tmp_path):
    root = f"file:{tmp_path}/checkpoint"
    log = EtlLog(ArrowFS(), root)
    files = [ListedFile(f"file:/in/{i}.png", 1, 0) for i in range(4)]
    n = log.plan(files)  # attempt 1: killed (a decoder running the driver out of memory)
    for _ in range(MAX_BATCH_ATTEMPTS - 1):
        EtlLog(ArrowFS(), root).start_attempt(n)  # ... and each replay killed too
    writer = _Writer({"file:/in/2.png"})
    assert _run(root, writer, [f.path for f in files]) == ["file:/in/2.png"]
    assert writer.jobs <= 4  # halves, then the failing half's halves: never the whole batch again
    assert "failed or were killed" not in writer.rows["file:/in/2.png"]  # it failed alone here: that error
