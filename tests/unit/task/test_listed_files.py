"""Files Spark lists and the tasks read themselves (sources.LOCAL_FILES): path forms and guard rails."""

from __future__ import annotations

import os

import pytest

from spark_cnn.errors import ImageError
from spark_cnn.imaging.decode import read_image_file
from spark_cnn.imaging.limits import DecodeOptions
from spark_cnn.task.files import listed_local_path, read_listed_file


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
