"""The ETL's checkpoint: which files each micro-batch took, which batches are committed, which files wait.

Layout under CHECKPOINT (any Hadoop URI):
  batches/N          batch N's files, written before the batch runs: `v1`, one JSON line per file, `end K`
  batches/N.compact  every file of batches 0..N (all committed), which replaces their own files
  done/N             written once OUTPUT/batch=N is in place
  waiting.json       files seen but not settled yet, with when they were first seen unchanged
  absent.json        taken files missing from the latest listings, with when they were first missed
  forgotten.json     files forgotten since the compact file was written, with the last batch planned then
  attempts.json      how many times the last planned batch has been tried (`etl_isolate`)
  input.json         the INPUT this checkpoint belongs to, as its first run spelled it

Every file but `done/N` is written under a hidden temporary name and renamed into place, so a kill leaves the
old file or the new one, never half of one; a torn file all the same (an earlier version's, a disk's) is read as
incomplete, with a warning, never as an error.

A batch file without its `end` line was cut short by a kill before its batch could start: it is dropped and
its files are planned again. A planned batch without `done/N` is replayed with the same files. The set of
taken files (all batches) is held in memory. It stays the size of what INPUT holds, not of every file ever
taken: a taken file that no listing has found for FORGET_AFTER_MS is forgotten (Spark's file source forgets
files older than its `maxFileAge` window the same way, but by modification time), and stays forgotten from
then on (`forgotten.json`), so a file that later appears under its path is new. The batch files are folded
into one compact file once they are many or hold more entries than it does, and it is rewritten once half of
its entries are forgotten, so what a run reads at its start stays within about twice what INPUT holds, however
many runs came before.

A checkpoint left by the Structured Streaming ETL of earlier versions (`offsets/`, `commits/`, `sources/0/`) is
read once: its committed files become a compacted batch, its logged but uncommitted files the batch to replay.
"""

from __future__ import annotations

import json
import logging
from urllib.parse import unquote, urlparse

from spark_cnn.errors import ConfigError
from spark_cnn.spark.etl_listing import ListedFile, Waiting
from spark_cnn.spark.locations import location
from spark_cnn.spark.storage import HadoopFS

BATCHES, DONE, WAITING, ABSENT = "batches", "done", "waiting.json", "absent.json"
FORGOTTEN, ATTEMPTS, INPUT = "forgotten.json", "attempts.json", "input.json"
TEMP_SUFFIX = ".tmp"  # `.NAME.tmp`: hidden, so no listing of the checkpoint takes it for a batch file
# What reading a file cut short by a kill raises: Hadoop's checksummed local filesystem, or bytes that stop in
# the middle of a character. Any other read error (a store out of reach) is not taken for a torn file.
TORN_MARKERS = ("ChecksumException", "Checksum error")
VERSION = "v1"
COMPACT_EVERY = 100  # committed batch files beyond this many are folded into one `.compact` file
# ... or, whatever their number, once they hold more entries than the compact file and at least this many: the
# compact rewrite costs what reading them costs, so each entry is rewritten a bounded number of times.
COMPACT_MIN_ENTRIES = 10_000
# A taken file missing from every listing this long is forgotten: Spark's maxFileAge default. A folder that
# could not be reached for less than a week (a mount that was down, a listing cut short) forgets nothing, so
# its files are never taken twice.
FORGET_AFTER_MS = 7 * 24 * 3600 * 1000
LEGACY_SOURCE_LOG, LEGACY_OFFSETS, LEGACY_COMMITS = "sources/0", "offsets", "commits"

_log = logging.getLogger(__name__)


class EtlLog:
    """Read and write one ETL checkpoint."""

    def __init__(self, fs: HadoopFS, checkpoint_uri: str):
        self.fs, self.root = fs, checkpoint_uri.rstrip("/")
        if not self.fs.exists(f"{self.root}/{BATCHES}") and self.fs.exists(f"{self.root}/{LEGACY_SOURCE_LOG}"):
            self._import_legacy()
        self.taken: set[str] = set()
        self.last_batch = -1  # the highest batch planned
        self._compacted = -1  # batches up to here live in one .compact file
        self._compact_entries = 0  # entries in that file
        self._batch_entries = 0  # entries in the batch files after it
        # files forgotten since that file was written -> the last batch planned then: entries of that batch or
        # earlier ones are not taken any more; a later batch that took the path again took a new file
        self.forgotten: dict[str, int] = self._read_json(FORGOTTEN)
        self.absent: dict[str, int] = self._read_json(ABSENT)
        self._load()

    # ---- reading --------------------------------------------------------------------------------------------

    def _load(self) -> None:
        names = self._names(BATCHES)
        compacts = sorted(int(n.split(".")[0]) for n in names if n.endswith(".compact") and n.split(".")[0].isdigit())
        for k in reversed(compacts):  # the newest complete one; an older one is kept until a newer one is whole
            paths = self._read_entries(f"{BATCHES}/{k}.compact")
            if paths is not None:
                self.taken.update(self._still_taken(paths, k))
                self._compacted = self.last_batch = k
                self._compact_entries = len(paths)
                break
        for n in sorted(int(n) for n in names if n.isdigit()):
            entries = self._read_planned(n)
            if entries is None:  # cut short by a kill while it was written: its batch never started
                self._delete(f"{BATCHES}/{n}")
                continue
            self.taken.update(self._still_taken(entries, n))
            self.last_batch = max(self.last_batch, n)
            if n > self._compacted:
                self._batch_entries += len(entries)

    def _still_taken(self, entries: list[dict], n: int) -> set[str]:
        """The paths of a batch (or compact) file covering batches up to `n`, less those forgotten since."""
        return {e["path"] for e in entries if self.forgotten.get(e["path"], -1) < n}

    def _names(self, folder: str) -> list[str]:
        """The entries of a checkpoint folder, with the name of each file whose rename into place a kill cut
        short (only its temporary file is there: `_read_text` reads that)."""
        names = self.fs.list_names(f"{self.root}/{folder}")
        orphans = [n[1:-len(TEMP_SUFFIX)] for n in names if n.startswith(".") and n.endswith(TEMP_SUFFIX)]
        return names + [n for n in orphans if n not in names]

    def _read_text(self, name: str) -> str | None:
        """A checkpoint file's text (its temporary file's when only that is there); None when neither is there,
        or when a kill tore it (logged)."""
        uri = f"{self.root}/{name}"
        if not self.fs.exists(uri):
            uri = temp_name(uri)
            if not self.fs.exists(uri):
                return None
        try:
            return self.fs.read_text(uri)
        except Exception as e:
            if not torn(e):
                raise
            _log.warning("spark-cnn: the checkpoint file %s is torn (a run was killed while writing it): read as "
                         "incomplete (%s)", uri, str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
            return None

    def _read_planned(self, n: int) -> list[dict] | None:
        """Batch n's entries; None when a kill cut its file short (only possible before its batch was done)."""
        if self.fs.exists(f"{self.root}/{DONE}/{n}"):
            entries = self._read_entries(f"{BATCHES}/{n}")
            if entries is None:
                raise ConfigError(f"the checkpoint file {self.root}/{BATCHES}/{n} is incomplete but its batch is "
                                  "done: the checkpoint was changed; start a new one (and OUTPUT) with --checkpoint")
            return entries
        try:
            return self._read_entries(f"{BATCHES}/{n}")
        except ConfigError:
            raise
        except Exception:  # its checksum file too was cut short (Hadoop's local filesystem)
            return None

    def _read_entries(self, name: str) -> list[dict] | None:
        """The entries of a batch or compact file; None when it is torn or lacks its end line (a kill while
        writing)."""
        text = self._read_text(name)
        if text is None:
            return None
        lines = [line for line in text.splitlines() if line.strip()]
        if len(lines) < 2 or lines[-1] != f"end {len(lines) - 2}":
            return None
        if lines[0] != VERSION:
            raise ConfigError(f"the checkpoint file {self.root}/{name} is not in a format this version reads; "
                              "start a new checkpoint (and OUTPUT) with --checkpoint")
        return [json.loads(line) for line in lines[1:-1]]

    def pending_batch(self) -> tuple[int, list[ListedFile]] | None:
        """The last planned batch when it was never committed (a killed run): its number and files."""
        n = self.last_batch
        if n < 0 or n <= self._compacted or self.fs.exists(f"{self.root}/{DONE}/{n}"):
            return None
        entries = self._read_planned(n) or []
        return n, [ListedFile(e["path"], e.get("size", 0), e.get("mtime_ms", 0)) for e in entries]

    def waiting(self) -> dict[str, Waiting]:
        try:
            return {path: Waiting(*values) for path, values in self._read_json(WAITING).items()}
        except TypeError:  # not this version's layout: those files wait one settle time more
            return {}

    def _read_json(self, name: str) -> dict:
        """A small JSON file of the checkpoint; {} when missing or cut short by a kill (its files then wait, or
        are missed, from this run on)."""
        text = self._read_text(name)
        if text is None:
            return {}
        try:
            value = json.loads(text)
        except ValueError:
            return {}
        return value if isinstance(value, dict) else {}

    # ---- writing --------------------------------------------------------------------------------------------

    def plan(self, files: list[ListedFile]) -> int:
        """Record a new batch's files before it runs; returns its number."""
        n = self.last_batch + 1
        self._write_entries(f"{BATCHES}/{n}", [{"path": f.path, "size": f.size, "mtime_ms": f.mtime_ms}
                                               for f in files])
        self.last_batch = n
        self._batch_entries += len(files)
        self.taken.update(f.path for f in files)
        return n

    def forget_gone(self, missing: set[str], now_ms: int, *, forget_after_ms: int = FORGET_AFTER_MS) -> int:
        """`missing`: the taken files this run's listing did not find (`etl_listing.gone`). Each is recorded with
        when it was first missed; one missed by every listing for `forget_after_ms` leaves the taken set (and the
        next compact file). A file found again is no longer absent. Returns how many were forgotten."""
        absent = {path: int(self.absent.get(path, now_ms)) for path in missing}
        expired = {path for path, since in absent.items() if now_ms - since >= forget_after_ms}
        for path in expired:
            del absent[path]
        if expired:  # before absent.json drops them: a kill between the two only forgets them a run early
            self.forgotten.update({path: self.last_batch for path in expired})
            self._write(FORGOTTEN, json.dumps(self.forgotten, separators=(",", ":")))
        self.taken -= expired
        if absent != self.absent:
            if absent:
                self._write(ABSENT, json.dumps(absent, separators=(",", ":")))
            else:
                self._delete(ABSENT)
            self.absent = absent
        return len(expired)

    def commit(self, n: int) -> None:
        self.fs.write_text(f"{self.root}/{DONE}/{n}", "")

    def set_waiting(self, waiting: dict[str, Waiting]) -> None:
        if waiting:
            self._write(WAITING, json.dumps({p: [w.size, w.mtime_ms, w.since_ms] for p, w in waiting.items()}))
        else:
            self._delete(WAITING)

    def attempts(self, n: int) -> int:
        """How many times planned batch `n` has been started (a kill or a failure ended each one not done): its
        batch file, written just before it first ran, counts as the first, so a batch that runs once costs no
        write here."""
        record = self._read_json(ATTEMPTS)
        return int(record.get("attempts", 1)) if record.get("batch") == n else 1

    def start_attempt(self, n: int) -> int:
        """Record one more attempt at batch `n` before it runs (so a killed driver's attempt counts too);
        returns how many there have been, this one included."""
        attempts = self.attempts(n) + 1
        self._write(ATTEMPTS, json.dumps({"batch": n, "attempts": attempts}))
        return attempts

    def claim_input(self, input_uri: str) -> None:
        """Record `input_uri` as this checkpoint's INPUT on its first run (or its first since INPUT was
        recorded); refuse any other spelling later: the taken files are the paths its listings spelled."""
        recorded = self._read_json(INPUT).get("uri")
        if recorded is None:
            self._write(INPUT, json.dumps({"uri": input_uri, "location": list(location(input_uri))}))
        elif recorded.rstrip("/") != input_uri.rstrip("/"):
            raise ConfigError(input_mismatch(self.root, recorded, input_uri))

    def needs_compaction(self, batch_files: int) -> bool:
        """More than COMPACT_EVERY batch files; or batch files holding more entries than the compact file (and
        at least COMPACT_MIN_ENTRIES); or half of the compact file's entries forgotten."""
        return (batch_files > COMPACT_EVERY
                or self._batch_entries >= max(COMPACT_MIN_ENTRIES, self._compact_entries)
                or (self.forgotten and 2 * len(self.forgotten) >= self._compact_entries))

    def compact(self) -> None:
        """Fold the committed batches' files, less the forgotten ones, into one file when `needs_compaction`."""
        names = self.fs.list_names(f"{self.root}/{BATCHES}")
        if not self.needs_compaction(sum(name.isdigit() for name in names)) or self.pending_batch() is not None:
            return
        k = self.last_batch
        if k < 0:
            return
        self._write_entries(f"{BATCHES}/{k}.compact", [{"path": p} for p in sorted(self.taken)])
        for name in names:  # only now that the compact file is whole (and temporary files a kill left)
            temp = name.startswith(".") and name.endswith(TEMP_SUFFIX)
            number = (name[1:] if temp else name).split(".")[0]
            if number.isdigit() and int(number) <= k and name != f"{k}.compact":
                self.fs.delete(f"{self.root}/{BATCHES}/{name}")
                self.fs.delete(f"{self.root}/{DONE}/{number}")
        if self.forgotten:  # the compact file leaves them out
            self._delete(FORGOTTEN)
            self.forgotten = {}
        self._compacted = k
        self._compact_entries, self._batch_entries = len(self.taken), 0

    def _write_entries(self, name: str, entries: list[dict]) -> None:
        lines = [VERSION, *(json.dumps(e, separators=(",", ":")) for e in entries), f"end {len(entries)}"]
        self._write(name, "\n".join(lines) + "\n")

    def _write(self, name: str, text: str) -> None:
        """Write a checkpoint file whole or not at all: into its temporary file, renamed over the old one."""
        uri = f"{self.root}/{name}"
        temp = temp_name(uri)
        self.fs.write_text(temp, text)
        try:
            self.fs.rename(temp, uri)
        except Exception:
            if not self.fs.exists(uri):
                raise
            # A filesystem that renames onto no existing file (HDFS): free the name first. Until the rename,
            # readers take the temporary file, whole by now, for it (`_names`, `_read_text`).
            self.fs.delete(uri)
            self.fs.rename(temp, uri)

    def _delete(self, name: str) -> None:
        uri = f"{self.root}/{name}"
        self.fs.delete(uri)
        self.fs.delete(temp_name(uri))

    # ---- the Structured Streaming checkpoint of earlier versions ----------------------------------------------

    def _import_legacy(self) -> None:
        commits = [int(n) for n in self.fs.list_names(f"{self.root}/{LEGACY_COMMITS}") if n.isdigit()]
        committed = max(commits, default=-1)
        done_offset = self._legacy_offset(committed) if committed >= 0 else -1
        log_names = self.fs.list_names(f"{self.root}/{LEGACY_SOURCE_LOG}")
        last_entry = max((int(n.split(".")[0]) for n in log_names if n.split(".")[0].isdigit()), default=-1)
        done, replay = [], []
        texts: dict[str, str] = {}
        for entry in range(last_entry + 1):
            name = source_log_file(log_names, entry)
            if name is None:
                raise ConfigError(f"the checkpoint's source log {self.root}/{LEGACY_SOURCE_LOG} has no entry {entry}: "
                                  "start a new checkpoint (and OUTPUT) with --checkpoint")
            if name not in texts:
                texts[name] = self.fs.read_text(f"{self.root}/{LEGACY_SOURCE_LOG}/{name}")
            (done if entry <= done_offset else replay).extend(source_log_paths(texts[name], entry))
        if committed >= 0:
            self._write_entries(f"{BATCHES}/{committed}.compact", [{"path": p} for p in done])
        if replay:  # logged by a run killed before committing them: the next batch number replays them
            self._write_entries(f"{BATCHES}/{committed + 1}", [{"path": p} for p in replay])

    def _legacy_offset(self, batch_id: int) -> int:
        return source_offset(self.fs.read_text(f"{self.root}/{LEGACY_OFFSETS}/{batch_id}"))


def temp_name(uri: str) -> str:
    """Where a checkpoint file is written before it is renamed to `uri`: beside it, hidden."""
    folder, _, name = uri.rpartition("/")
    return f"{folder}/.{name}{TEMP_SUFFIX}"


def torn(error: Exception) -> bool:
    """Whether reading a file failed because a kill cut it short (not because its filesystem failed)."""
    return isinstance(error, UnicodeDecodeError) or any(marker in str(error) for marker in TORN_MARKERS)


def input_mismatch(checkpoint: str, recorded: str, given: str) -> str:
    """One line for a run whose INPUT is not the one its checkpoint recorded."""
    if location(recorded) == location(given):
        return (f"checkpoint {checkpoint} belongs to INPUT {recorded}; {given} is the same folder spelled another "
                f"way, which would take every file again (the checkpoint knows files by their paths): run with "
                f"INPUT {recorded}")
    return (f"checkpoint {checkpoint} belongs to INPUT {recorded}, not {given}: run with INPUT {recorded}, or give "
            f"{given} a checkpoint (and OUTPUT) of its own")


def source_offset(text: str) -> int:
    """The file source's end offset in an offsets log file: a version line, the batch metadata, then one line
    per source (`{"logOffset": K}`)."""
    lines = [line for line in text.splitlines() if line.strip()]
    try:
        return int(json.loads(lines[-1])["logOffset"])
    except (IndexError, ValueError, KeyError, TypeError) as e:
        raise ConfigError("the checkpoint's offsets log is not in a format this version reads; start a new "
                          "checkpoint") from e


def source_log_file(names: list[str], batch_id: int) -> str | None:
    """Which file of the source log holds entry `batch_id`: its own file, or (after compaction) the first
    `K.compact` with K >= batch_id."""
    if str(batch_id) in names:
        return str(batch_id)
    compacted = sorted(int(n.split(".")[0]) for n in names if n.endswith(".compact") and n.split(".")[0].isdigit())
    return next((f"{k}.compact" for k in compacted if k >= batch_id), None)


def source_log_paths(text: str, batch_id: int) -> list[str]:
    """The files of source log entry `batch_id` in a source log file (a version line, then one JSON entry per
    file), spelled as Spark's binaryFile `path` column spells them."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("v"):
        raise ConfigError("the checkpoint's source log is not in a format this version reads; start a new one")
    paths = []
    for line in lines[1:]:
        if line.strip():
            entry = json.loads(line)
            if entry.get("batchId") == batch_id:
                paths.append(hadoop_path(entry["path"]))
    return paths


def hadoop_path(uri: str) -> str:
    """The log's URL-encoded URI (file:///a%20b) as Hadoop's Path prints it (file:/a b)."""
    parsed = urlparse(uri)
    path = unquote(parsed.path)
    return f"{parsed.scheme}://{parsed.netloc}{path}" if parsed.netloc else f"{parsed.scheme}:{path}"
