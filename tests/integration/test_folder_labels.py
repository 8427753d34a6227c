"""The local listing's frame and its folder labels (spark/sources.py), written as SQL strings, on a real session:
a root and class names with characters SQL would need escaped stay exact."""

from __future__ import annotations

from spark_cnn.spark.sources import TRUE_LABEL, local_files, with_folder_labels
from spark_cnn.spark.storage import to_uri


def test_class_folders_label_their_files_and_files_in_the_root_have_none(spark, tmp_path):
    root = tmp_path / "it's a \\ \"root\" café"
    files = {"cat/1.jpg": "cat", "it's/2.jpg": "it's", "dög/deeper/3.jpg": "dög", "4.jpg": None}
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(b"x" * (len(name) + 1))
    frame = with_folder_labels(spark, local_files(spark, str(root)), to_uri(str(root)))  # as jobs pass it
    rows = {row["path"]: row for row in frame.collect()}
    assert len(rows) == len(files)
    by_name = {path.split("café/", 1)[1]: row for path, row in rows.items()}
    assert {name: row[TRUE_LABEL] for name, row in by_name.items()} == files
    assert all(row["content"] is None for row in rows.values())
    assert {name: row["size"] for name, row in by_name.items()} == {name: len(name) + 1 for name in files}
