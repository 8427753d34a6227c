"""Local image folders are walked by spark/listing.py: one entry per reachable file, one per folder that cannot
be listed, symlink loops walked once, zero-byte files kept (also under symlinked folders)."""

from __future__ import annotations

import os

import pytest

from spark_cnn.errors import InputError
from spark_cnn.spark import listing
from spark_cnn.spark.listing import Entry, pack_partitions, walk_files


def _tree(root, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def _listed(root, **options) -> dict[str, Entry]:
    return {os.path.relpath(e.path, root): e for e in walk_files(str(root), **options)}


def test_a_symlink_loop_is_walked_once(tmp_path):
    _tree(tmp_path / "in", {"a/1.png": b"x", "b/2.png": b"yy"})
    os.symlink(tmp_path / "in", tmp_path / "in" / "a" / "loop")  # in/a/loop/a/loop/... without end
    os.symlink("..", tmp_path / "in" / "b" / "up")
    assert set(_listed(tmp_path / "in")) == {"a/1.png", "b/2.png"}


def test_zero_byte_files_under_a_symlinked_folder_are_listed(tmp_path):
    _tree(tmp_path / "elsewhere", {"empty.png": b"", "ok.png": b"png"})
    _tree(tmp_path / "in", {"here.png": b"p"})
    os.symlink(tmp_path / "elsewhere", tmp_path / "in" / "linked")
    listed = _listed(tmp_path / "in")
    assert set(listed) == {"here.png", "linked/empty.png", "linked/ok.png"}
    assert listed["linked/empty.png"].size == 0 and listed["linked/ok.png"].size == 3


def test_an_unreadable_subfolder_is_one_entry_with_the_reason_and_the_rest_is_listed(tmp_path, monkeypatch):
    _tree(tmp_path / "in", {"a/1.png": b"x", "locked/2.png": b"y", "z.png": b"z"})
    real = os.scandir

    def scandir(path):  # as the kernel answers a folder without read permission (root reads it anyway)
        if os.path.basename(path) == "locked":
            raise PermissionError(13, "Permission denied", path)
        return real(path)

    monkeypatch.setattr(listing, "_scandir", scandir)
    listed = _listed(tmp_path / "in")
    assert set(listed) == {"a/1.png", "locked", "z.png"}
    assert listed["locked"].error == "cannot list folder: PermissionError: Permission denied"
    assert all(e.error is None for name, e in listed.items() if name != "locked")


def test_an_unreadable_input_folder_stops_the_job_saying_what_to_check(tmp_path, monkeypatch):
    (tmp_path / "in").mkdir()

    def refuse(path):
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(listing, "_scandir", refuse)
    with pytest.raises(InputError, match=r"input .*/in cannot be listed \(PermissionError: Permission denied\): "
                                         r"check its permissions"):
        list(walk_files(str(tmp_path / "in")))


def test_hidden_names_glob_and_special_files(tmp_path):
    _tree(tmp_path / "in", {"a.png": b"1", "b.jpg": b"2", ".hidden.png": b"3", "_meta/c.png": b"4",
                            "k=v/d.png": b"5", "e.png._COPYING_": b"6"})
    os.mkfifo(tmp_path / "in" / "pipe.png")  # reading it would block a task
    os.symlink(tmp_path / "nowhere.png", tmp_path / "in" / "dangling.png")
    listed = _listed(tmp_path / "in", glob="*.png")
    assert set(listed) == {"a.png", "k=v/d.png", "dangling.png"}  # the dangling link fails when read: its row
    assert set(_listed(tmp_path / "in" / "b.jpg", glob="*.jpg")) == {"."}  # a file as the input


def test_a_folder_linked_twice_is_listed_once(tmp_path):
    _tree(tmp_path / "in", {"a/1.png": b"x"})
    os.symlink(tmp_path / "in" / "a", tmp_path / "in" / "b")
    assert set(_listed(tmp_path / "in")) == {"a/1.png"}  # the first path in name order


def test_partitions_are_packed_as_sparks_file_scan_packs_them():
    files = [Entry(f"/f{size}", size) for size in (1, 9, 3, 7, 0)]
    # total = 20 + 5 * 2 = 30; 30 // 2 = 15 -> split 10 (max_partition_bytes); largest first, each + open cost
    groups = pack_partitions(files, max_partition_bytes=10, open_cost_bytes=2, min_partitions=2)
    assert [[e.size for e in group] for group in groups] == [[9], [7], [3, 1, 0]]
    # one core: split min(100, max(2, 30)) = 30: everything fits in one partition
    groups = pack_partitions(files, max_partition_bytes=100, open_cost_bytes=2, min_partitions=1)
    assert [[e.size for e in group] for group in groups] == [[9, 7, 3, 1, 0]]
    assert pack_partitions([], max_partition_bytes=10, open_cost_bytes=2, min_partitions=2) == []


def test_many_small_files_are_spread_over_few_even_partitions_of_at_least_min_files():
    files = [Entry(f"/f{i}", 200 + i % 7) for i in range(10_000)]
    spark_like = pack_partitions(files, max_partition_bytes=128 << 20, open_cost_bytes=256 << 10, min_partitions=2)
    assert len(spark_like) == 20  # 500 files each: one output file per 500 rows
    groups = pack_partitions(files, max_partition_bytes=128 << 20, open_cost_bytes=256 << 10, min_partitions=2,
                             min_files=1_000)
    assert len(groups) == 10  # 1,000 files each, more than TASKS_PER_CORE x 2 cores
    assert sorted(e.path for g in groups for e in g) == sorted(e.path for e in files)  # each file once
    sizes = [sum(e.size for e in g) for g in groups]
    assert max(sizes) - min(sizes) <= 206  # even in bytes: at most one file's difference
    # fewer files: never fewer than one partition per core, and a wave of tasks more per 2,048 files a core, up
    # to three (Spark's packing made 8 partitions of 500 files of the 4,000 here, 25 of the 12,288)
    few = files[:4_000]
    assert len(pack_partitions(few, max_partition_bytes=128 << 20, open_cost_bytes=256 << 10, min_partitions=2,
                               min_files=10_000)) == 2
    more = [Entry(f"/g{i}", 200) for i in range(12_288)]
    assert len(pack_partitions(more, max_partition_bytes=128 << 20, open_cost_bytes=256 << 10, min_partitions=2,
                               min_files=10_000)) == 3 * 2
    # a middling job of small files (Spark's packing: 4 partitions, 466 files in the first three) and large files (5
    # partitions of two 50 MB files) alike: one task per core, even in bytes
    middling = [Entry(f"/m{i}", 26_000) for i in range(1_536)]
    assert [len(g) for g in pack_partitions(middling, max_partition_bytes=128 << 20, open_cost_bytes=256 << 10,
                                            min_partitions=2, min_files=20_000)] == [768, 768]
    big = [Entry(f"/b{i}", 50 << 20) for i in range(10)]
    assert len(pack_partitions(big, max_partition_bytes=128 << 20, open_cost_bytes=256 << 10,
                               min_partitions=2)) == 5
    assert [len(g) for g in pack_partitions(big, max_partition_bytes=128 << 20, open_cost_bytes=256 << 10,
                                            min_partitions=2, min_files=1_000)] == [5, 5]
    # a handful of files: Spark's packing stands (no more partitions than the count)
    handful = [Entry(f"/h{i}", 1_000) for i in range(3)]
    assert pack_partitions(handful, max_partition_bytes=128 << 20, open_cost_bytes=256 << 10, min_partitions=2,
                           min_files=1_000) == pack_partitions(handful, max_partition_bytes=128 << 20,
                                                               open_cost_bytes=256 << 10, min_partitions=2)
