"""Which files the ETL sees under INPUT and which of them it takes: any modification time, once settled."""

from __future__ import annotations

import os

from spark_cnn.spark import listing
from spark_cnn.spark.etl_listing import ListedFile, Listing, Waiting, gone, list_local, micro_batches, settled

NOW_MS = 1_700_000_000_000
SETTLE_MS = 30_000


def test_old_files_are_ready_recent_ones_wait_and_taken_ones_are_skipped():
    listed = [ListedFile("file:/in/epoch.png", 10, 0), ListedFile("file:/in/old.png", 10, NOW_MS - SETTLE_MS),
              ListedFile("file:/in/copying.png", 10, NOW_MS - 1_000), ListedFile("file:/in/done.png", 10, 0)]
    ready, waiting = settled(listed, {"file:/in/done.png"}, {}, NOW_MS, SETTLE_MS)
    assert [f.path for f in ready] == ["file:/in/epoch.png", "file:/in/old.png"]
    assert waiting == {"file:/in/copying.png": Waiting(10, NOW_MS - 1_000, NOW_MS)}


def test_a_future_modification_time_is_taken_once_a_run_saw_it_unchanged_for_the_settle_time():
    future = ListedFile("file:/in/future.png", 10, NOW_MS + 86_400_000)
    _, waiting = settled([future], set(), {}, NOW_MS, SETTLE_MS)
    ready, still = settled([future], set(), waiting, NOW_MS + SETTLE_MS - 1, SETTLE_MS)
    assert ready == [] and still == waiting  # unchanged, but not for long enough yet
    grown = ListedFile(future.path, 20, future.mtime_ms)
    ready, still = settled([grown], set(), waiting, NOW_MS + SETTLE_MS, SETTLE_MS)
    assert ready == [] and still[future.path].since_ms == NOW_MS + SETTLE_MS  # it changed: the wait starts over
    ready, _ = settled([future], set(), waiting, NOW_MS + SETTLE_MS, SETTLE_MS)
    assert ready == [future]


def test_no_settle_time_takes_everything_at_once():
    listed = [ListedFile("file:/in/b.png", 1, NOW_MS + 5), ListedFile("file:/in/a.png", 1, NOW_MS)]
    ready, waiting = settled(listed, set(), {}, NOW_MS, 0)
    assert [f.path for f in ready] == ["file:/in/a.png", "file:/in/b.png"] and waiting == {}  # oldest first


def test_listing_follows_links_once_keeps_dangling_ones_and_skips_hidden_and_special_files(tmp_path):
    root = tmp_path / "in"
    (root / "a").mkdir(parents=True)
    (root / "a" / "x.png").write_bytes(b"x")
    (root / "a" / ".partial.png").write_bytes(b"x")
    (root / "_tmp").mkdir()
    (root / "_tmp" / "y.png").write_bytes(b"y")
    (root / "a" / "notes.txt").write_bytes(b"n")
    os.symlink(root, root / "a" / "loop")  # a folder link back to INPUT: its files are listed once
    os.symlink(root / "gone.png", root / "dangling.png")
    os.mkfifo(root / "pipe.png")  # opening a FIFO blocks: never taken
    listed = list_local(str(root), "*.png")
    assert sorted(f.path for f in listed) == [f"file:{root}/a/x.png", f"file:{root}/dangling.png"]


def test_micro_batches_keep_the_order_and_end_at_the_file_or_byte_bound():
    files = [ListedFile(f"file:/in/{i}.png", size, i) for i, size in enumerate([5, 5, 5, 20, 1, 1, 1, 1])]
    batches = micro_batches(files, max_files=3, max_bytes=12)
    assert [[f.size for f in b] for b in batches] == [[5, 5], [5], [20], [1, 1, 1], [1]]
    assert [f for b in batches for f in b] == files  # every file once, oldest first
    assert micro_batches([], max_files=3, max_bytes=12) == []
    assert len(micro_batches(files, max_files=100_000, max_bytes=8 << 30)) == 1


def test_gone_files_are_those_a_listing_proves_missing():
    listing = Listing([ListedFile("file:/in/a/kept.png", 1, 0)], unlisted=("file:/in/locked",))
    taken = {"file:/in/a/kept.png", "file:/in/a/deleted.png", "file:/in/locked/x.png", "file:/in/a/notes.txt"}
    # a folder that could not be listed hides nothing; a name the glob does not show may still be there
    assert gone(taken, listing, "*.png") == {"file:/in/a/deleted.png"}
    assert gone(taken, listing, None) == {"file:/in/a/deleted.png", "file:/in/a/notes.txt"}


def test_a_listing_names_the_folders_it_could_not_read(tmp_path, monkeypatch):
    root = tmp_path / "in"
    (root / "open").mkdir(parents=True)
    (root / "open" / "x.png").write_bytes(b"x")
    (root / "shut").mkdir()
    (root / "shut" / "y.png").write_bytes(b"y")
    real = os.scandir

    def scandir(path):
        if str(path).endswith("/shut"):
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(listing, "_scandir", scandir)
    unlisted: list[str] = []
    files = list_local(str(root), None, unlisted=unlisted)
    assert [f.path for f in files] == [f"file:{root}/open/x.png"] and unlisted == [f"file:{root}/shut"]
