"""publish (spark/job_io.py) never loses both outputs: killed between any two filesystem steps, the old output
survives under OUTPUT or a hidden sibling, and the next job's `recover_output` leaves exactly one at OUTPUT."""

from __future__ import annotations

import pytest

from spark_cnn.errors import InputError
from spark_cnn.spark.job_io import publish, recover_output, staging_uri

OUTPUT = "file:/data/out"
STAGED = staging_uri(OUTPUT, "job1")


class Killed(BaseException):
    """The driver died here: no handler of the killed process runs any more filesystem step."""


class FakeFS:
    """HadoopFS's operations over whole folders held as values; `kill_at`: the step (1-based) at which the
    process dies, and every step after it fails too. rename onto an existing folder moves into it, as Hadoop's."""

    def __init__(self, folders: dict[str, str], kill_at: int | None = None, fail_rename_from: str | None = None):
        self.folders, self.kill_at, self.fail_rename_from, self.steps = dict(folders), kill_at, fail_rename_from, 0

    def _step(self) -> None:
        self.steps += 1
        if self.kill_at is not None and self.steps >= self.kill_at:
            raise Killed

    def exists(self, uri: str) -> bool:
        self._step()
        return uri in self.folders

    def delete(self, uri: str) -> None:
        self._step()
        self.folders.pop(uri, None)

    def rename(self, source: str, target: str) -> None:
        self._step()
        if source == self.fail_rename_from or source not in self.folders:
            raise OSError(f"could not rename {source} to {target}")
        if target in self.folders:
            target = f"{target}/{source.rpartition('/')[2]}"
        self.folders[target] = self.folders.pop(source)

    def list_names(self, uri: str) -> list[str]:
        self._step()
        prefix = uri.rstrip("/") + "/"
        return [u[len(prefix):] for u in self.folders if u.startswith(prefix) and "/" not in u[len(prefix):]]


def _publish_steps() -> int:
    fs = FakeFS({OUTPUT: "old", STAGED: "new"})
    publish(fs, STAGED, OUTPUT, overwrite=True)
    assert fs.folders == {OUTPUT: "new"}
    return fs.steps


@pytest.mark.parametrize("kill_at", range(1, _publish_steps() + 1))
def test_a_publish_killed_at_any_step_keeps_the_old_output_and_the_next_job_recovers(kill_at):
    fs = FakeFS({OUTPUT: "old", STAGED: "new"}, kill_at=kill_at)
    with pytest.raises(Killed):
        publish(fs, STAGED, OUTPUT, overwrite=True)
    assert "old" in fs.folders.values() or fs.folders.get(OUTPUT) == "new", fs.folders
    kept = {uri: value for uri, value in fs.folders.items() if value in ("old", "new")}
    assert len(kept) == len(fs.folders), f"something moved inside another folder: {fs.folders}"

    after = FakeFS(fs.folders)  # the next job, on what the killed one left
    recover_output(after, OUTPUT)
    assert after.folders in ({OUTPUT: "old", STAGED: "new"}, {OUTPUT: "old"}, {OUTPUT: "new"}), after.folders


def test_recovery_restores_the_old_output_when_the_kill_came_before_the_new_one_went_in():
    fs = FakeFS({OUTPUT: "old", STAGED: "new"}, kill_at=3)  # after moving the old output aside
    with pytest.raises(Killed):
        publish(fs, STAGED, OUTPUT, overwrite=True)
    assert OUTPUT not in fs.folders and fs.folders[STAGED.removesuffix(".tmp") + ".old"] == "old"
    after = FakeFS(fs.folders)
    recover_output(after, OUTPUT)
    assert after.folders == {OUTPUT: "old"}  # the unpublished staging of the killed job is removed too


def test_recovery_deletes_the_old_output_once_the_new_one_is_in_place():
    fs = FakeFS({OUTPUT: "old", STAGED: "new"}, kill_at=4)  # after renaming the new output in
    with pytest.raises(Killed):
        publish(fs, STAGED, OUTPUT, overwrite=True)
    after = FakeFS(fs.folders)
    recover_output(after, OUTPUT)
    assert after.folders == {OUTPUT: "new"}


def test_a_failed_rename_puts_the_old_output_back_and_raises():
    fs = FakeFS({OUTPUT: "old", STAGED: "new"}, fail_rename_from=STAGED)
    with pytest.raises(OSError, match="could not rename"):
        publish(fs, STAGED, OUTPUT, overwrite=True)
    assert fs.folders == {OUTPUT: "old", STAGED: "new"}


def test_when_the_old_output_cannot_be_put_back_the_error_says_where_it_is():
    class Stuck(FakeFS):
        def rename(self, source, target):
            if source == STAGED or target == OUTPUT:
                raise OSError("disk gone")
            super().rename(source, target)

    fs = Stuck({OUTPUT: "old", STAGED: "new"})
    with pytest.raises(InputError, match=r"the old output is at .*\.out\.spark_cnn-job1\.old: rename it back"):
        publish(fs, STAGED, OUTPUT, overwrite=True)


def test_recovery_leaves_other_names_alone():
    folders = {OUTPUT: "mine", "file:/data/.out2.spark_cnn-x.old": "other", "file:/data/.out.spark_cnn-y.tmp": "w"}
    fs = FakeFS(folders)
    recover_output(fs, OUTPUT)
    assert fs.folders == folders
