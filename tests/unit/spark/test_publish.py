"""publish (spark/job_io.py) never loses the old output: killed after any filesystem operation, on HDFS (a folder's
rename is atomic) or on an object store (a folder's rename copies and deletes object by object), the next job's
`recover_output` leaves OUTPUT holding the whole old output or the whole new one, never a part or nothing."""

from __future__ import annotations

import pytest

from spark_cnn.errors import InputError
from spark_cnn.spark.job_io import COMPLETE_MARKER, publish, recover_output, staging_uri

OUTPUT = "s3://bkt/data/out"
STAGED = staging_uri(OUTPUT, "job1")
OLD = {"part-0.parquet": "old 0", "part-1.parquet": "old 1", "label=3/part-2.parquet": "old 2", "_summary.json": "o"}
NEW = {"part-0.parquet": "new 0", "label=7/part-1.parquet": "new 1", "label=8/part-9.parquet": "new 2",
       "_SUCCESS": ""}


class Killed(BaseException):
    """The driver died here: no handler of the killed process runs any more filesystem step."""


class FakeStore:
    """HadoopFS's operations over files (path -> content); a folder exists while a file lies below it, as on
    object stores. `atomic`: a folder's rename moves it whole (HDFS; onto an existing folder it moves into it);
    else it copies then deletes file by file, in name order or (`backwards`) the reverse. `kill_at`: the
    operation (1-based) at which the process dies."""

    def __init__(self, files: dict[str, str], *, atomic: bool = False, backwards: bool = False,
                 kill_at: int | None = None):
        self.files, self.atomic, self.backwards, self.kill_at, self.ops = dict(files), atomic, backwards, kill_at, 0

    def _op(self) -> None:
        self.ops += 1
        if self.kill_at is not None and self.ops >= self.kill_at:
            raise Killed

    def _below(self, uri: str) -> list[str]:
        prefix = uri.rstrip("/") + "/"
        return sorted((p for p in self.files if p.startswith(prefix)), reverse=self.backwards)

    def exists(self, uri: str) -> bool:
        self._op()
        return uri in self.files or bool(self._below(uri))

    def delete(self, uri: str) -> None:
        for path in ([uri] if uri in self.files else self._below(uri)):
            self._op()
            del self.files[path]

    def rename(self, source: str, target: str) -> None:
        if not self.exists(source):
            raise OSError(f"could not rename {source} to {target}")
        if source in self.files:  # one object: copied whole, then deleted
            self._op()
            self.files[target] = self.files[source]
            self._op()
            del self.files[source]
            return
        if self.atomic:
            self._op()
            if self._below(target):
                target = f"{target}/{source.rpartition('/')[2]}"
            for path in self._below(source):
                self.files[target + path[len(source):]] = self.files.pop(path)
            return
        for path in self._below(source):
            self._op()
            self.files[target + path[len(source):]] = self.files[path]
            self._op()
            del self.files[path]

    def write_text(self, uri: str, text: str) -> None:
        self._op()
        self.files[uri] = text

    def list_names(self, uri: str) -> list[str]:
        self._op()
        prefix = uri.rstrip("/") + "/"
        return sorted({p[len(prefix):].split("/")[0] for p in self.files if p.startswith(prefix)})

    def list_files(self, uri: str) -> list[str]:
        self._op()
        prefix = uri.rstrip("/") + "/"
        return [p[len(prefix):] for p in self._below(uri)]

    def output(self) -> dict[str, str] | None:
        """OUTPUT's files without the marker; None when there is no OUTPUT."""
        files = {p[len(OUTPUT) + 1:]: v for p, v in self.files.items() if p.startswith(OUTPUT + "/")}
        files.pop(COMPLETE_MARKER, None)
        return files or None


def _folder(root: str, files: dict[str, str]) -> dict[str, str]:
    return {f"{root}/{name}": content for name, content in files.items()}


# The old output as this version leaves it (marked complete), as earlier versions did (no marker), or none.
OLD_OUTPUTS = {"marked": {**OLD, COMPLETE_MARKER: ""}, "unmarked": OLD, "none": {}}


def _start(old: str) -> dict[str, str]:
    return {**_folder(OUTPUT, OLD_OUTPUTS[old]), **_folder(STAGED, NEW), "s3://bkt/data/photos/a.jpg": "input"}


def _ops_to_publish(old: str, **kind) -> int:
    fs = FakeStore(_start(old), **kind)
    publish(fs, STAGED, OUTPUT, overwrite=True)
    assert fs.output() == NEW and fs.files[f"{OUTPUT}/{COMPLETE_MARKER}"] == ""
    assert set(fs.files) == set(_folder(OUTPUT, {**NEW, COMPLETE_MARKER: ""})) | {"s3://bkt/data/photos/a.jpg"}
    return fs.ops


KINDS = {"store, files in name order": {}, "store, files in reverse order": {"backwards": True},
         "hdfs": {"atomic": True}}


@pytest.mark.parametrize("old", list(OLD_OUTPUTS))
@pytest.mark.parametrize("kind", list(KINDS))
def test_a_publish_killed_after_any_operation_leaves_the_whole_old_or_the_whole_new_output(kind, old):
    wholes = ({**OLD}, NEW) if old != "none" else (None, NEW)
    for kill_at in range(1, _ops_to_publish(old, **KINDS[kind]) + 1):
        killed = FakeStore(_start(old), kill_at=kill_at, **KINDS[kind])
        with pytest.raises(Killed):
            publish(killed, STAGED, OUTPUT, overwrite=True)

        after = FakeStore(killed.files, **KINDS[kind])  # the next job, on what the killed one left
        recover_output(after, OUTPUT)
        assert after.output() in wholes, f"killed at operation {kill_at}: OUTPUT is {after.output()}"
        assert not any(".aside" in path for path in after.files), f"killed at operation {kill_at}: {after.files}"
        assert after.files["s3://bkt/data/photos/a.jpg"] == "input"
        if after.output() == NEW:
            assert f"{OUTPUT}/{COMPLETE_MARKER}" in after.files

        # A recovery killed in its turn leaves a state the one after it recovers from.
        for recovery_killed_at in range(1, after.ops + 1):
            twice = FakeStore(killed.files, kill_at=recovery_killed_at, **KINDS[kind])
            with pytest.raises(Killed):
                recover_output(twice, OUTPUT)
            last = FakeStore(twice.files, **KINDS[kind])
            recover_output(last, OUTPUT)
            assert last.output() in wholes, f"killed at {kill_at}, then at {recovery_killed_at}: {last.output()}"


def test_a_publish_onto_no_output_killed_midway_leaves_no_part_of_the_new_one():
    start = {k: v for k, v in _start("none").items()}
    total = _ops_to_publish("none")
    for kill_at in range(1, total):
        killed = FakeStore(start, kill_at=kill_at)
        with pytest.raises(Killed):
            publish(killed, STAGED, OUTPUT, overwrite=False)
        after = FakeStore(killed.files)
        recover_output(after, OUTPUT)
        assert after.output() in (None, NEW), f"killed at operation {kill_at}: OUTPUT is {after.output()}"


def test_a_failed_rename_puts_the_old_output_back_and_raises():
    class Refusing(FakeStore):
        def rename(self, source, target):
            if source == STAGED:
                raise OSError(f"could not rename {source} to {target}")
            super().rename(source, target)

    fs = Refusing(_start("marked"))
    with pytest.raises(OSError, match="could not rename"):
        publish(fs, STAGED, OUTPUT, overwrite=True)
    assert fs.output() == OLD and not any(".aside" in path for path in fs.files)


def test_when_the_old_output_cannot_be_put_back_the_error_says_where_it_is():
    class Stuck(FakeStore):
        def rename(self, source, target):
            if source == STAGED or target == OUTPUT:
                raise OSError("disk gone")
            super().rename(source, target)

    fs = Stuck(_start("marked"), atomic=True)
    with pytest.raises(InputError, match=r"the old output is at .*\.out\.spark_cnn-job1\.aside: the next job"):
        publish(fs, STAGED, OUTPUT, overwrite=True)


@pytest.mark.parametrize("output_there", [False, True])
def test_an_old_output_an_earlier_version_left_aside_is_restored_or_deleted(output_there):
    legacy = "s3://bkt/data/.out.spark_cnn-old1.old"
    fs = FakeStore({**_folder(legacy, OLD), **(_folder(OUTPUT, NEW) if output_there else {})}, atomic=True)
    recover_output(fs, OUTPUT)
    assert fs.output() == (NEW if output_there else OLD) and not any(".old" in path for path in fs.files)


def test_recovery_leaves_other_names_alone():
    files = {**_folder(OUTPUT, {"a": "mine"}), "s3://bkt/data/.out2.spark_cnn-x.aside/a": "other",
             "s3://bkt/data/.out.spark_cnn-y.tmp/a": "being written"}
    fs = FakeStore(files)
    recover_output(fs, OUTPUT)
    assert fs.files == files
