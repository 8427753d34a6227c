"""Where a job may write (spark/locations.py): never onto, into or around its input, the root or the home dir."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from spark_cnn.errors import InputError
from spark_cnn.spark.job_io import check_local_paths
from spark_cnn.spark.locations import check_checkpoint_location, check_output_location, location


@pytest.fixture
def tree(tmp_path):
    """photos/ with a subfolder, a symlink to photos, a separate home directory."""
    (tmp_path / "photos" / "cats").mkdir(parents=True)
    (tmp_path / "home").mkdir()
    os.symlink(tmp_path / "photos", tmp_path / "link")
    return tmp_path


@pytest.mark.parametrize("output, refused", [
    ("photos", "is the input"),
    ("photos/", "is the input"),
    ("photos/cats/..", "is the input"),
    ("link", "is the input"),  # a symlink to the input
    ("photos/..", "contains the input"),  # classify photos/ photos/.. --overwrite: would delete the images
    (".", "contains the input"),
    ("photos/out", "lies inside the input"),
    ("link/cats/out", "lies inside the input"),
    ("home", "is the home directory"),
    ("/", "is the filesystem root"),
])
def test_outputs_on_into_or_around_the_input_are_refused(tree, output, refused):
    with pytest.raises(InputError, match=refused) as error:
        check_output_location(str(tree / "photos"), str(tree / output) if output != "/" else "/",
                              home=str(tree / "home"))
    assert "choose a new folder outside the input" in str(error.value)
    assert "\n" not in str(error.value)


def test_an_output_above_the_home_directory_is_refused(tree):
    (tree / "home" / "me").mkdir()
    with pytest.raises(InputError, match="contains the home directory"):
        check_output_location(str(tree / "photos"), str(tree / "home"), home=str(tree / "home" / "me"))


@pytest.mark.parametrize("output", ["out", "photos-out", "home/out", "photos2"])
def test_outputs_beside_the_input_are_allowed(tree, output):
    check_output_location(str(tree / "photos"), str(tree / output), home=str(tree / "home"))


def test_file_uris_and_paths_compare_equal(tree):
    with pytest.raises(InputError, match="contains the input"):
        check_output_location(f"file://{tree}/photos", f"file:{tree}", home=str(tree / "home"))


@pytest.mark.parametrize("input_uri, output_uri, refused", [
    ("hdfs://nn:8020/data/photos", "hdfs://NN:8020/data/photos/", "is the input"),
    ("hdfs://nn:8020/data/photos", "HDFS://nn:8020/data/photos/x/../..", "contains the input"),
    ("s3a://bucket/photos", "s3a://bucket//photos/./out", "lies inside the input"),
    ("s3a://bucket/photos", "s3a://bucket/", "is the filesystem root"),
    ("s3a://bucket/photos", "s3a://bucket", "is the filesystem root"),
])
def test_other_filesystems_compare_normalised_uris(input_uri, output_uri, refused):
    with pytest.raises(InputError, match=refused):
        check_output_location(input_uri, output_uri)


@pytest.mark.parametrize("input_uri, output_uri", [
    ("hdfs://nn:8020/data/photos", "hdfs://other:8020/data/photos"),  # another cluster
    ("s3a://bucket/photos", "s3a://bucket/photos-out"),
    ("file:///data/photos", "hdfs://nn:8020/data/photos"),  # another filesystem
])
def test_the_same_path_on_another_filesystem_is_allowed(input_uri, output_uri):
    check_output_location(input_uri, output_uri)


def test_location_resolves_symlinks_for_paths_that_do_not_exist_yet(tree):
    assert location(str(tree / "link" / "new" / "out")) == ("file", str(tree.resolve() / "photos" / "new" / "out"))


@pytest.mark.parametrize("checkpoint, refused", [
    ("photos/_checkpoint", "overlaps the input"), ("photos", "overlaps the input"), (".", "overlaps the input"),
    ("out", "is the output folder")])
def test_checkpoints_that_would_be_listed_as_input_or_are_the_output_are_refused(tree, checkpoint, refused):
    with pytest.raises(InputError, match=refused):
        check_checkpoint_location(str(tree / "photos"), str(tree / checkpoint), str(tree / "out"))
    check_checkpoint_location(str(tree / "photos"), str(tree / "checkpoints" / "out"), str(tree / "out"))


def test_the_local_check_refuses_before_the_existence_checks(tree):
    # With the output equal to the input, "already exists; use --overwrite" would send the user the wrong way.
    with pytest.raises(InputError, match="is the input"):
        check_local_paths(f"file://{tree}/photos", f"file://{tree}/photos", False)
    with pytest.raises(InputError, match="overlaps the input"):
        check_local_paths(f"file://{tree}/photos", f"file://{tree}/out", True,
                          checkpoint_uri=f"file://{tree}/photos/.checkpoint")


# Spellings of one store as users write them (Hadoop's, pyarrow's, Azure's two endpoints, default ports).
ALIASES = {
    "s3": ["s3://bkt", "s3a://bkt", "s3n://BKT"],
    "gcs": ["gs://bkt", "gcs://bkt"],
    "azure": ["abfs://box@acct.dfs.core.windows.net", "abfss://box@acct.dfs.core.windows.net",
              "wasb://box@acct.blob.core.windows.net", "wasbs://box@ACCT.blob.core.windows.net", "az://box"],
    "hdfs": ["hdfs://nn", "hdfs://nn:8020", "HDFS://NN:8020/"],
}
SAME_STORE = [(a, b) for spellings in ALIASES.values() for a in spellings for b in spellings if a != b]
# (output, refused) for an input at /data/photos
OVERLAPS = [("/data/photos", "is the input"), ("/data", "contains the input"),
            ("/data/photos/out", "lies inside the input")]


@pytest.mark.parametrize("where, refused", OVERLAPS)
@pytest.mark.parametrize("input_store, output_store", SAME_STORE)
def test_an_output_spelled_with_another_alias_of_the_input_store_is_refused(input_store, output_store, where,
                                                                            refused):
    with pytest.raises(InputError, match=refused) as error:
        check_output_location(f"{input_store}/data/photos", f"{output_store.rstrip('/')}{where}")
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("input_store, checkpoint_store", SAME_STORE)
def test_a_checkpoint_spelled_with_another_alias_inside_the_input_is_refused(input_store, checkpoint_store):
    with pytest.raises(InputError, match="overlaps the input"):
        check_checkpoint_location(f"{input_store}/data/photos", f"{checkpoint_store.rstrip('/')}/data/photos/_cp")
    with pytest.raises(InputError, match="is the output folder"):
        check_checkpoint_location(f"{input_store}/data/photos", f"{checkpoint_store.rstrip('/')}/data/out",
                                  f"{input_store}/data/out")


@pytest.mark.parametrize("input_store, output_store", [
    ("s3://bkt", "gs://bkt"), ("s3a://bkt", "s3a://other"), ("gs://bkt", "abfs://bkt@acct.dfs.core.windows.net"),
    ("hdfs://nn", "hdfs://nn:9000"), ("hdfs://nn:8020", "hdfs://other:8020"), ("viewfs://nn", "hdfs://nn"),
    ("abfs://box@acct.dfs.core.windows.net", "abfs://box@other.dfs.core.windows.net"),
    ("abfs://box@acct.dfs.core.windows.net", "az://other"),
])
def test_the_same_path_in_another_store_stays_allowed(input_store, output_store):
    check_output_location(f"{input_store}/data/photos", f"{output_store}/data/photos")
    check_checkpoint_location(f"{input_store}/data/photos", f"{output_store}/data/photos/_cp")


def _volume_stat(*existing: str, same_as: dict[str, str] | None = None):
    """`os.stat` of a volume holding `existing` folders, case-insensitive as macOS's and Windows' are;
    `same_as`: a path -> the folder it is mounted from (a bind mount)."""
    inodes = {path.lower(): ino for ino, path in enumerate(existing, start=1)}
    for path, source in (same_as or {}).items():
        inodes[path.lower()] = inodes[source.lower()]

    def stat(path: str):
        if path.lower() not in inodes:
            raise FileNotFoundError(path)
        return SimpleNamespace(st_dev=7, st_ino=inodes[path.lower()])

    return stat


CASELESS = _volume_stat("/", "/Volumes", "/Volumes/Mac", "/Volumes/Mac/Photos", "/mnt", "/mnt/photos",
                        same_as={"/mnt/photos": "/Volumes/Mac/Photos"})


@pytest.mark.parametrize("output, refused", [
    ("/Volumes/Mac/photos", "is the input"),
    ("/volumes/mac/PHOTOS", "is the input"),
    ("/Volumes/MAC", "contains the input"),
    ("/Volumes/Mac/photos/out", "lies inside the input"),
    ("/mnt/photos", "is the input"),  # a bind mount of the input
    ("/mnt/photos/out", "lies inside the input"),
])
def test_another_spelling_of_the_input_on_a_case_insensitive_volume_or_mount_is_refused(output, refused):
    with pytest.raises(InputError, match=refused):
        check_output_location("/Volumes/Mac/Photos", output, home="/home/me", stat=CASELESS)
    with pytest.raises(InputError, match="overlaps the input"):
        check_checkpoint_location("/Volumes/Mac/Photos", output, stat=CASELESS)


@pytest.mark.parametrize("output", ["/Volumes/Mac/photos-out", "/Volumes/Mac/out", "/mnt/out"])
def test_folders_beside_the_input_on_a_case_insensitive_volume_are_allowed(output):
    check_output_location("/Volumes/Mac/Photos", output, home="/home/me", stat=CASELESS)
