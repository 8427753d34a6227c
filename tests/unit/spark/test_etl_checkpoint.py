"""The ETL checkpoint stays the size of what INPUT holds, however many runs came before, and never re-lands a
file or misses one: nightly runs simulated over a real checkpoint folder (ArrowFS on local files, no Spark)."""

from __future__ import annotations

import os
import time

import pytest

from spark_cnn.spark import etl_log
from spark_cnn.spark.etl_listing import ListedFile, Listing, gone, micro_batches, settled
from spark_cnn.spark.etl_log import EtlLog
from spark_cnn.spark.storage import ArrowFS

DAY_MS = 24 * 3600 * 1000
START_MS = 1_700_000_000_000
NEW_PER_NIGHT = 100
RETAINED_NIGHTS = 20  # the landing zone deletes files this many nights old


def _night(root: str, live: list[str], now_ms: int, *, max_files: int = 40) -> tuple[list[str], float, int]:
    """One run as etl_job.run_etl does it, less Spark: load, forget, take the new files, plan and commit them
    in micro-batches, compact. Returns the files it took, the load time and the entries it loaded."""
    started = time.perf_counter()
    log = EtlLog(ArrowFS(), root)
    load_s, loaded = time.perf_counter() - started, len(log.taken)
    assert log.pending_batch() is None
    listing = Listing([ListedFile(path, 10, 0) for path in live])
    log.forget_gone(gone(log.taken, listing, None), now_ms)
    ready, _ = settled(listing.files, log.taken, {}, now_ms, 0)
    for files in micro_batches(ready, max_files=max_files, max_bytes=1 << 30):
        log.commit(log.plan(files))
    log.compact()
    return [f.path for f in ready], load_s, loaded


def _stored_lines(root: str) -> int:
    lines = 0
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name)) as f:
                lines += sum(1 for _ in f)
    return lines


def test_a_year_of_nightly_runs_keeps_the_checkpoint_bounded_and_lands_each_file_once(tmp_path, monkeypatch):
    # Smaller thresholds than the defaults, so a short simulation passes through every compaction rule.
    monkeypatch.setattr(etl_log, "COMPACT_EVERY", 20)
    monkeypatch.setattr(etl_log, "COMPACT_MIN_ENTRIES", 500)
    root = f"file:{tmp_path}/checkpoint"
    landed: list[str] = []
    loads = []
    for night in range(150):
        live = [f"file:/in/{day:03d}/{i:03d}.png" for day in range(max(0, night - RETAINED_NIGHTS + 1), night + 1)
                for i in range(NEW_PER_NIGHT)]
        took, load_s, loaded = _night(root, live, START_MS + night * DAY_MS)
        assert sorted(took) == [f"file:/in/{night:03d}/{i:03d}.png" for i in range(NEW_PER_NIGHT)]  # nothing missed
        landed += took
        loads.append((load_s, loaded, _stored_lines(f"{tmp_path}/checkpoint") if night % 10 == 9 else 0))
    assert len(landed) == len(set(landed)) == 150 * NEW_PER_NIGHT  # nothing landed twice
    # Held: the files INPUT holds (20 nights) and those gone for less than a week (7 nights), plus batch files
    # not yet folded in (at most as many entries as the compact file). Without forgetting: 15,000 by the end.
    window = (RETAINED_NIGHTS + 7) * NEW_PER_NIGHT
    late = loads[60:]
    assert max(loaded for _, loaded, _ in late) <= 2 * window
    assert max(lines for _, _, lines in late) <= 2 * window + 200  # + version and end lines, absent.json
    assert len(os.listdir(tmp_path / "checkpoint" / "batches")) <= 20 + 1
    # the load time does not grow with the runs behind it (generous: a shared, noisy host)
    assert sum(s for s, _, _ in loads[-20:]) <= 3 * sum(s for s, _, _ in loads[40:60]) + 0.5


def test_a_folder_missing_for_days_is_not_landed_again_but_one_gone_for_over_a_week_is_new(tmp_path):
    root = f"file:{tmp_path}/checkpoint"
    files = [f"file:/in/mount/{i}.png" for i in range(5)]
    assert len(_night(root, files, START_MS)[0]) == 5
    for day in range(1, 4):  # the mount is down: its files are missing from three listings
        assert _night(root, [], START_MS + day * DAY_MS)[0] == []
    assert _night(root, files, START_MS + 4 * DAY_MS)[0] == []  # back: nothing taken twice
    for day in range(5, 13):  # deleted, and gone for over a week: forgotten
        _night(root, [], START_MS + day * DAY_MS)
    assert sorted(EtlLog(ArrowFS(), root).taken) == []
    assert len(_night(root, files, START_MS + 13 * DAY_MS)[0]) == 5  # the same names again: new files


class _KilledFS(ArrowFS):
    """Dies at its first delete: a run killed after the compact file was written, before the old files went."""

    def delete(self, uri: str) -> None:
        raise KeyboardInterrupt


def test_a_run_killed_while_compacting_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(etl_log, "COMPACT_EVERY", 2)
    root = f"file:{tmp_path}/checkpoint"
    for night in range(2):
        _night(root, [f"file:/in/{night}.png"], START_MS)
    log = EtlLog(_KilledFS(), root)
    log.commit(log.plan([ListedFile("file:/in/2.png", 1, 0)]))  # a third batch file: more than COMPACT_EVERY
    with pytest.raises(KeyboardInterrupt):
        log.compact()
    assert "2.compact" in os.listdir(tmp_path / "checkpoint" / "batches")
    reloaded = EtlLog(ArrowFS(), root)
    assert reloaded.taken == {f"file:/in/{i}.png" for i in range(3)} and reloaded.pending_batch() is None
    assert _night(root, [f"file:/in/{i}.png" for i in range(4)], START_MS)[0] == ["file:/in/3.png"]
