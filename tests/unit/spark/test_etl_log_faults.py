"""The ETL checkpoint under the faults of the audit of issue 34: forgetting that lasts, files torn by a kill,
an INPUT spelled differently (ArrowFS on local files, injected clock values, no Spark)."""

from __future__ import annotations

import hashlib
import os

import pytest

from spark_cnn.errors import ConfigError
from spark_cnn.spark import etl_log
from spark_cnn.spark.etl_listing import ListedFile, Listing, Waiting, gone, micro_batches, settled
from spark_cnn.spark.etl_log import ABSENT, BATCHES, WAITING, EtlLog
from spark_cnn.spark.storage import ArrowFS

DAY_MS = 24 * 3600 * 1000
START_MS = 1_700_000_000_000


def _night(root: str, live: list[str], now_ms: int, fs: ArrowFS | None = None) -> list[str]:
    """One run as etl_job.run_etl does it, less Spark; returns the files it took."""
    log = EtlLog(fs or ArrowFS(), root)
    listing = Listing([ListedFile(path, 10, 0) for path in live])
    log.forget_gone(gone(log.taken, listing, None), now_ms)
    ready, _ = settled(listing.files, log.taken, {}, now_ms, 0)
    for files in micro_batches(ready, max_files=4, max_bytes=1 << 30):
        log.commit(log.plan(files))
    log.compact()
    return [f.path for f in ready]


# ---- a forgotten file stays forgotten, compacted or not ------------------------------------------------------

def test_a_file_forgotten_after_the_compact_file_was_written_is_taken_when_it_comes_back(tmp_path, monkeypatch):
    monkeypatch.setattr(etl_log, "COMPACT_EVERY", 0)  # the first run's batches go into a compact file at once
    root = f"file:{tmp_path}/checkpoint"
    files = [f"file:/in/{i}.png" for i in range(10)]
    assert len(_night(root, files, START_MS)) == 10
    assert any(n.endswith(".compact") for n in os.listdir(tmp_path / "checkpoint" / BATCHES))
    monkeypatch.setattr(etl_log, "COMPACT_EVERY", 100)  # so forgetting one file of ten compacts nothing
    for day in range(1, 10):  # 0.png deleted, and missing from every listing for over a week
        assert _night(root, files[1:], START_MS + day * DAY_MS) == []
    assert "file:/in/0.png" not in EtlLog(ArrowFS(), root).taken
    assert _night(root, files, START_MS + 10 * DAY_MS) == ["file:/in/0.png"]  # re-created: a new file
    assert _night(root, files, START_MS + 11 * DAY_MS) == []  # ... taken once


# ---- torn files: written whole or not at all, and a torn one read as incomplete ------------------------------

class _ChecksummedFS(ArrowFS):
    """Hadoop's local filesystem in miniature: each file has a `.name.crc` beside it, and reading a file whose
    bytes no longer match it raises Hadoop's ChecksumException (what a kill while writing leaves behind)."""

    @staticmethod
    def _crc(uri: str) -> str:
        folder, _, name = uri.rpartition("/")
        return f"{folder}/.{name}.crc"

    def write_text(self, uri: str, text: str) -> None:
        super().write_text(uri, text)
        super().write_text(self._crc(uri), hashlib.sha256(text.encode()).hexdigest())

    def read_text(self, uri: str) -> str:
        text = super().read_bytes(uri)
        if self.exists(self._crc(uri)) and super().read_text(self._crc(uri)) != hashlib.sha256(text).hexdigest():
            raise OSError(f"org.apache.hadoop.fs.ChecksumException: Checksum error: {uri} at 0")
        return text.decode("utf-8")

    def rename(self, source: str, target: str) -> None:
        super().rename(source, target)
        if self.exists(self._crc(source)):
            super().rename(self._crc(source), self._crc(target))

    def delete(self, uri: str) -> None:
        super().delete(uri)
        super().delete(self._crc(uri))


def _tear(path) -> None:
    """Cut a file in the middle and add bytes that are not UTF-8, its checksum left as it was."""
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2] + b"\xff\xfe")


@pytest.mark.parametrize("torn", ["compact", ABSENT, WAITING, "batch"])
def test_a_torn_checkpoint_file_of_any_kind_is_read_as_incomplete_and_the_next_run_proceeds(tmp_path, monkeypatch,
                                                                                            torn, caplog):
    fs, root = _ChecksummedFS(), f"file:{tmp_path}/checkpoint"
    files = [f"file:/in/{i}.png" for i in range(6)]
    assert len(_night(root, files, START_MS, fs)) == 6  # batches 0 and 1, done
    log = EtlLog(fs, root)
    log.forget_gone({files[0]}, START_MS + DAY_MS)  # absent.json
    log.set_waiting({"file:/in/late.png": Waiting(10, 0, START_MS)})  # waiting.json
    # a compaction killed before it deleted anything, then batch 2 planned and never run
    log._write_entries(f"{BATCHES}/1.compact", [{"path": p} for p in files])
    log.plan([ListedFile("file:/in/new.png", 10, 0)])
    name = {"compact": f"{BATCHES}/1.compact", "batch": f"{BATCHES}/2"}.get(torn, torn)
    _tear(tmp_path / "checkpoint" / name)

    reloaded = EtlLog(fs, root)
    reloaded.waiting()  # as a run reads it
    assert set(files) <= reloaded.taken
    assert "torn" in caplog.text or torn == "batch"  # a batch file never run was always simply planned again
    more = files + ["file:/in/new.png", "file:/in/6.png"]
    took = _night(root, more, START_MS + 2 * DAY_MS, fs)
    assert sorted(took) == (["file:/in/6.png", "file:/in/new.png"] if torn == "batch" else ["file:/in/6.png"])


class _KilledWhileWriting(ArrowFS):
    """Writes the first half of the file it is asked to write, then dies: a driver killed mid-write."""

    def write_text(self, uri: str, text: str) -> None:
        super().write_text(uri, text[:len(text) // 2])
        raise KeyboardInterrupt


def test_a_kill_while_rewriting_a_checkpoint_file_leaves_the_old_one_whole(tmp_path, monkeypatch):
    root = f"file:{tmp_path}/checkpoint"
    files = [f"file:/in/{i}.png" for i in range(6)]
    monkeypatch.setattr(etl_log, "COMPACT_EVERY", 0)
    _night(root, files, START_MS)  # 1.compact
    log = EtlLog(ArrowFS(), root)
    log.forget_gone({files[0]}, START_MS)
    log.set_waiting({"file:/in/late.png": Waiting(10, 0, START_MS)})

    killed = EtlLog(_KilledWhileWriting(), root)
    with pytest.raises(KeyboardInterrupt):
        killed.forget_gone({files[0], files[1]}, START_MS + DAY_MS)
    with pytest.raises(KeyboardInterrupt):
        killed.set_waiting({"file:/in/later.png": Waiting(10, 0, START_MS + DAY_MS)})
    killed.taken -= set(files[:4])  # more than half forgotten: the compact file 1.compact is rewritten
    killed.forgotten = {path: 1 for path in files[:4]}
    with pytest.raises(KeyboardInterrupt):
        killed.compact()

    reloaded = EtlLog(ArrowFS(), root)
    assert reloaded.taken == set(files)
    assert reloaded.absent == {files[0]: START_MS}
    assert reloaded.waiting() == {"file:/in/late.png": Waiting(10, 0, START_MS)}


# ---- the checkpoint belongs to one INPUT, spelled one way ----------------------------------------------------

def test_a_checkpoint_refuses_its_input_spelled_another_way_or_another_input(tmp_path):
    real = tmp_path / "landing"
    real.mkdir()
    os.symlink(real, tmp_path / "incoming")
    root = f"file:{tmp_path}/checkpoint"
    EtlLog(ArrowFS(), root).claim_input(f"file://{real}")
    EtlLog(ArrowFS(), root).claim_input(f"file://{real}")  # the same spelling: the same checkpoint

    with pytest.raises(ConfigError) as refused:  # the same folder through a symlink: every path would differ
        EtlLog(ArrowFS(), root).claim_input(f"file://{tmp_path}/incoming")
    message = str(refused.value)
    assert f"file://{real}" in message and "same folder" in message and "\n" not in message
    with pytest.raises(ConfigError, match="belongs to INPUT"):
        EtlLog(ArrowFS(), root).claim_input(f"file://{tmp_path}/elsewhere")


def test_a_checkpoint_from_before_inputs_were_recorded_adopts_the_current_input(tmp_path):
    root = f"file:{tmp_path}/checkpoint"
    _night(root, ["file:/in/0.png"], START_MS)  # runs of an earlier version recorded no INPUT
    EtlLog(ArrowFS(), root).claim_input("file:///in")
    with pytest.raises(ConfigError):
        EtlLog(ArrowFS(), root).claim_input("file:///other")
