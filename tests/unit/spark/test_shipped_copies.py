"""The driver's folder of shipped copies (spark/shipped_copies.py): a folder whose owner lock is free is swept, one
whose lock is held (its driver alive) or that has no owner file is left alone. The lock is a real `flock`: a
second open file description in this process contends with it as another process's would."""

from __future__ import annotations

import fcntl
import os

from spark_cnn.spark.shipped_copies import FOLDER_PREFIX, OWNER_FILE, _locked_folder, remove_abandoned_folders


def _folder_with_owner(parent, name: str) -> str:
    folder = parent / f"{FOLDER_PREFIX}{name}"
    folder.mkdir()
    (folder / OWNER_FILE).write_bytes(b"")
    (folder / "0123456789abcdef-model.pt").write_bytes(b"weights")
    return str(folder)


def test_only_folders_whose_owner_lock_is_free_are_removed(tmp_path):
    dead = _folder_with_owner(tmp_path, "dead")
    alive = _folder_with_owner(tmp_path, "alive")
    held = os.open(os.path.join(alive, OWNER_FILE), os.O_WRONLY)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    (tmp_path / f"{FOLDER_PREFIX}old_version").mkdir()  # no owner file: nothing says its driver died
    (tmp_path / "other_tool_tmp").mkdir()
    try:
        assert remove_abandoned_folders(str(tmp_path)) == [dead]
    finally:
        os.close(held)
    assert sorted(os.listdir(tmp_path)) == sorted([os.path.basename(alive), f"{FOLDER_PREFIX}old_version",
                                                  "other_tool_tmp"])
    assert remove_abandoned_folders(str(tmp_path)) == [alive]  # its lock dropped with its descriptor


def test_a_new_folder_appears_with_its_lock_held_and_a_link_is_never_followed(tmp_path):
    folder, fd = _locked_folder(str(tmp_path))
    try:
        assert os.path.basename(folder).startswith(FOLDER_PREFIX) and os.listdir(folder) == [OWNER_FILE]
        target = tmp_path / "target"
        target.mkdir()
        (target / OWNER_FILE).write_bytes(b"")
        os.symlink(target, tmp_path / f"{FOLDER_PREFIX}link")
        assert remove_abandoned_folders(str(tmp_path)) == []
        assert target.exists() and os.path.isdir(folder)
    finally:
        os.close(fd)
