"""Files Spark lists and the tasks read themselves (sources.LOCAL_FILES): path forms and guard rails."""

from __future__ import annotations

import contextlib
import os
import resource
import threading

import pytest

from spark_cnn.errors import ImageError
from spark_cnn.imaging.decode import read_image_file
from spark_cnn.imaging.limits import DecodeOptions
from spark_cnn.task.files import listed_local_path, read_listed_file

# A read that takes longer hangs: the fixed reads fail in milliseconds.
READ_DEADLINE_S = 10.0
# Address space a read may add while tested: reading /dev/zero without a bound stops here with a MemoryError
# instead of taking the machine's memory.
READ_MEMORY_HEADROOM = 2 << 30


@pytest.mark.parametrize("listed, local", [
    ("file:/data/a.jpg", "/data/a.jpg"),
    ("file:///data/a.jpg", "/data/a.jpg"),
    ("file://localhost/data/a.jpg", "/data/a.jpg"),
    # Spark's listing does not percent-encode: '#', '?', '%' and spaces are part of the name.
    ("file:/data/a b#1?.jpg", "/data/a b#1?.jpg"),
    ("file:/data/100%25.jpg", "/data/100%25.jpg"),
    ("file:/données/é.png", "/données/é.png"),
])
def test_local_paths_from_spark_listings(listed, local):
    assert listed_local_path(listed) == local


@pytest.mark.parametrize("listed", ["hdfs://nn:8020/data/a.jpg", "s3a://bucket/a.jpg", "file://otherhost/a.jpg",
                                    "/data/a.jpg", "file:"])
def test_other_filesystems_are_not_local(listed):
    assert listed_local_path(listed) is None


def test_a_listed_file_is_read_with_an_odd_name(tmp_path):
    name = tmp_path / "a b#1?%20.jpg"
    name.write_bytes(b"\xff\xd8 bytes")
    assert read_listed_file("file:" + str(name)) == b"\xff\xd8 bytes"


def test_guard_rails_and_unreadable_files_become_image_errors(tmp_path):
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    big = tmp_path / "big.jpg"
    big.write_bytes(b"x" * 2048)
    with pytest.raises(ImageError, match="empty file"):
        read_image_file(str(empty))
    with pytest.raises(ImageError, match="file too large: 2048 bytes"):
        read_image_file(str(big), DecodeOptions(max_file_bytes=1024))
    with pytest.raises(ImageError, match="cannot read file: FileNotFoundError"):
        read_listed_file("file:" + str(tmp_path / "gone.jpg"))
    with pytest.raises(ImageError, match="not a local file"):
        read_listed_file("wasbs://container@account/a.jpg")
    with pytest.raises(ImageError, match="file too large: 2048 bytes"):  # the listed size: refused unread
        read_listed_file("s3://bucket/a.jpg", DecodeOptions(max_file_bytes=1024), size=2048)
    if os.geteuid() != 0:  # root reads files whatever their mode
        locked = tmp_path / "locked.jpg"
        locked.write_bytes(b"x")
        locked.chmod(0)
        with pytest.raises(ImageError, match="PermissionError"):
            read_image_file(str(locked))


def test_a_folder_listed_because_it_could_not_be_read_gets_an_error_saying_so(tmp_path, monkeypatch):
    folder = tmp_path / "locked"
    folder.mkdir()
    with pytest.raises(ImageError, match="could not list this folder when the job started .*run the job again"):
        read_listed_file("file:" + str(folder))

    def refuse(path):  # as root, chmod 000 does not stop the listing: refuse it as the kernel would
        raise PermissionError(13, "Permission denied", path)

    monkeypatch.setattr(os, "listdir", refuse)
    with pytest.raises(ImageError, match=r"cannot list folder \(PermissionError: Permission denied\): its images"):
        read_listed_file("file:" + str(folder))


def _read_in_time(path: str):
    """read_listed_file(`path`) on a thread: its bytes or the exception it raised; fails the test when it has not
    returned within READ_DEADLINE_S (the thread is left behind, a daemon)."""
    outcome = []

    def read():
        try:
            outcome.append(read_listed_file("file:" + path, DecodeOptions(max_file_bytes=1024)))
        except Exception as e:  # the outcome under test
            outcome.append(e)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(READ_DEADLINE_S)
    assert not reader.is_alive(), f"reading {path} hangs"
    return outcome[0]


@contextlib.contextmanager
def _bounded_memory():
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    with open("/proc/self/statm") as f:
        used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    bound = used + READ_MEMORY_HEADROOM
    resource.setrlimit(resource.RLIMIT_AS, (bound if hard == resource.RLIM_INFINITY else min(bound, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def test_a_fifo_or_a_link_to_a_device_in_the_input_is_an_error_row_not_a_hang(tmp_path):
    fifo = tmp_path / "swapped.jpg"
    os.mkfifo(fifo)
    zeros = tmp_path / "zeros.jpg"
    zeros.symlink_to("/dev/zero")
    photo = tmp_path / "photo.jpg"
    photo.write_bytes(b"\xff\xd8 bytes")
    linked = tmp_path / "linked.jpg"
    linked.symlink_to(photo)
    try:
        with _bounded_memory():
            from_fifo = _read_in_time(str(fifo))
            from_zeros = _read_in_time(str(zeros))
    finally:
        with contextlib.suppress(OSError):  # a reader blocked in open() on the FIFO: a writer lets it go
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    assert isinstance(from_fifo, ImageError) and "not a regular file: it is a FIFO" in str(from_fifo), from_fifo
    assert isinstance(from_zeros, ImageError), from_zeros
    assert "not a regular file (a link to /dev/zero): it is a character device" in str(from_zeros)
    assert _read_in_time(str(photo)) == b"\xff\xd8 bytes"
    assert _read_in_time(str(linked)) == b"\xff\xd8 bytes", "a link to a regular file is read"


def test_a_file_under_a_linked_folder_or_named_relatively_is_read(tmp_path, monkeypatch):
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "a.jpg").write_bytes(b"\xff\xd8 a")
    (tmp_path / "linked").symlink_to(photos, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    assert read_image_file(str(tmp_path / "linked" / "a.jpg")) == b"\xff\xd8 a"
    assert read_image_file("photos/a.jpg") == b"\xff\xd8 a"
    assert read_image_file("linked/a.jpg") == b"\xff\xd8 a"
