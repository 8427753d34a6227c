"""The Spark task side of inference: a mapInArrow function that streams a partition through the sidecar.

Each task decodes its images to uint8 pixels (Spark runs tasks in parallel processes, so decoding scales with
cores) or, with `decode` set to `sidecar` or `gpu`, sends the files for the sidecar to decode. Requests of a
few rows go to the executor's sidecar with several in flight, and the replies become output rows: one row
per input row, in input order (each reply row at its input position), with `error` set where an image
failed. Only an image's own fault (undecodable, too large, a guard rail, a request the sidecar refused for its
input) is a row's error; a model, device or sidecar fault (client.SidecarFault) fails the task, whatever
`on_error` says, so Spark retries it and the job fails when the retries run out. No torch here: tasks stay light.

The stages, each a function below, in the order a row meets them: `decode_row` -> `request` (rows into requests,
a row that failed left out) -> submit/receive (client.map_ordered, several requests in flight) -> `receive`
(a reply as rows) -> `gathered` (each batch's replies, in input order) -> `assemble` (the one place failed rows
are put back, and the one output check). A `PendingBatch` carries one input batch through them.
"""

from __future__ import annotations

import functools
import itertools
import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import pyarrow as pa

from spark_cnn.errors import ImageError, SidecarError
from spark_cnn.formats.encodings import ENCODED, FILE_ENCODINGS, LOCAL_FILES, decoded_rgb
from spark_cnn.imaging.decode import check_file_size
from spark_cnn.imaging.image_struct import image_struct_rgb, preprocess_image_struct
from spark_cnn.imaging.limits import DEFAULT_DECODE, DecodeOptions
from spark_cnn.imaging.pixels import preprocess_rgb
from spark_cnn.imaging.preprocess import preprocess_pixels
from spark_cnn.imaging.sizing import sized_pixels, sized_rgb
from spark_cnn.models.spec import Endpoint
from spark_cnn.task.client import (
    DEFAULT_MAX_IN_FLIGHT,
    DEFAULT_REQUEST_ROWS,
    REPLY_TIMEOUT_S,
    RequestFailed,
    SidecarClient,
    map_ordered,
    sidecar_key,
)
from spark_cnn.task.dense_outputs import dense_output_columns
from spark_cnn.task.failover import FailoverClient
from spark_cnn.task.files import prefetched, read_listed_file
from spark_cnn.task.launcher import LaunchOptions, ensure_sidecar
from spark_cnn.task.object_store import NO_STORAGE, StorageOptions, is_store_uri
from spark_cnn.task.protocol import PricedImages, SizedImages
from spark_cnn.task.run_options import DEFAULT_DECODE_PLACE, DEFAULT_RUN, RunOptions
from spark_cnn.task.schema import (
    ERROR,
    class_names,
    failed_rows,
    layout_of,
    place_rows,
    task_output_schema,
    task_reply_schema,
)

INPUT_COLUMNS = ("path", "content")
NULL_IMAGE = "the row has no image (null)"


@dataclass(frozen=True)
class InferencePlan:
    """What every task needs, fixed on the driver and shipped in the closure."""

    endpoint: Endpoint
    launch: LaunchOptions
    job_id: str
    run_options: RunOptions = DEFAULT_RUN  # how the sidecar runs the model (sent in the HELLO)
    decode: str = DEFAULT_DECODE_PLACE  # auto | task | sidecar | gpu (auto: the sidecar picks, see perf/placement.py)
    on_error: str = "record"
    label_names: tuple[str, ...] | None = None
    decode_options: DecodeOptions = DEFAULT_DECODE  # the guard rails, here and in the sidecar (HELLO)
    request_rows: int = DEFAULT_REQUEST_ROWS
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    request_timeout_s: float = REPLY_TIMEOUT_S  # no reply nor progress for this long: it hangs (progress.py)
    encoding: str = ENCODED  # how input `content` holds images (formats.pixels); decoded pixels skip decoding
    carry: tuple[str, ...] = ()  # input columns copied to the output unchanged (e.g. true_label)
    storage: StorageOptions = NO_STORAGE  # how tasks open the object store the driver listed (LOCAL_FILES)


def _as_given(name: str) -> str:
    return name


def _no_gpus() -> Sequence[str]:
    return ()


@dataclass(frozen=True)
class TaskEnvironment:
    """What a task asks the engine that runs it: the local path of a file shipped with the job, and the GPU
    addresses the scheduler gave this task. `spark/executor.py` answers for Spark; the defaults (paths as
    given, no GPU) serve a task run in-process."""

    shipped_file: Callable[[str], str] = _as_given
    gpu_addresses: Callable[[], Sequence[str]] = _no_gpus


@dataclass(eq=False)  # compared and hashed by identity: one per input batch
class PendingBatch:
    """One input batch between its requests and its output rows.

    `paths` (Arrow strings) name the rows: the output's `path`, and the row in error messages (file paths, or row
    labels where the input has none). `failed` holds the rows that failed before sending, with why, and
    `sources` each sized image's source (height, width); both are filled while its requests are made, and final
    once every row is in a request or in `failed`."""

    paths: pa.Array
    carried: dict[str, pa.Array] = field(default_factory=dict)  # input columns copied to the output (plan.carry)
    failed: dict[int, str] = field(default_factory=dict)  # row -> why it has no image to send
    sources: dict[int, tuple[int, int]] = field(default_factory=dict)  # sized images: row -> source (h, w)

    @property
    def num_rows(self) -> int:
        return len(self.paths)

    def name(self, row: int) -> str:
        """How messages name row `row`."""
        return str(self.paths[row].as_py())


@dataclass(frozen=True)
class Request:
    """Which rows of which batch one INFER carries, in the order the sidecar replies to them."""

    batch: PendingBatch
    rows: list[int]


@dataclass
class SidecarCounters:
    """The sidecar's counters for the job, read once a partition's last reply is in (`infer_batches` fills
    `snapshot`); None before that, and for an empty partition, which never starts a sidecar."""

    snapshot: dict | None = None

    def add_to(self, accumulator) -> None:
        """Add the snapshot to a Spark accumulator of {sidecar: snapshot} (spark/accumulators.py), if any."""
        if accumulator is not None and self.snapshot is not None:
            accumulator.add({sidecar_key(self.snapshot): self.snapshot})


class PartitionInference:
    """Callable for `DataFrame.mapInArrow`: Iterator[RecordBatch(path, content)] -> Iterator[output batches].

    `content` is image file bytes or a Spark image struct (see imaging/image_struct.py). The sidecar's counters
    for the job go to `stats_accumulator` (`.add({key: snapshot})`), or with `stats_in_output` into the column
    SIDECAR_STATS_COLUMN (`with_stats_column`): JSON on the first row of the partition's last non-empty
    batch, null elsewhere, for engines without accumulators (Spark Connect), whose driver observes it."""

    def __init__(self, plan: InferencePlan, stats_accumulator=None, environment: TaskEnvironment = TaskEnvironment(),
                 *, stats_in_output: bool = False):
        self.plan = plan
        self.stats = stats_accumulator
        self.environment = environment
        self.stats_in_output = stats_in_output

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        counters = SidecarCounters() if self.stats_in_output or self.stats is not None else None
        outputs = infer_batches(self.plan, batches, self.environment, counters=counters)
        if self.stats_in_output:
            yield from stats_on_last_batch(outputs, counters)
            return
        yield from outputs
        if counters is not None:
            counters.add_to(self.stats)


SIDECAR_STATS_COLUMN = "_sidecar_stats"


def with_stats_column(schema: pa.Schema) -> pa.Schema:
    """The output schema of a PartitionInference with `stats_in_output`."""
    return schema.append(pa.field(SIDECAR_STATS_COLUMN, pa.string()))


def stats_on_last_batch(batches: Iterator[pa.RecordBatch], counters: SidecarCounters) -> Iterator[pa.RecordBatch]:
    """`batches` with SIDECAR_STATS_COLUMN added: JSON of `counters.snapshot` (filled by the time `batches` ends)
    on the first row of the last non-empty batch, null elsewhere. That batch is held back until then."""
    held = None
    for rows in batches:
        if rows.num_rows == 0:
            yield _stats_on_first_row(rows, None)
            continue
        if held is not None:
            yield _stats_on_first_row(held, None)
        held = rows
    if held is not None:
        snapshot = counters.snapshot
        yield _stats_on_first_row(held, json.dumps(snapshot) if snapshot is not None else None)


def _stats_on_first_row(rows: pa.RecordBatch, stats: str | None) -> pa.RecordBatch:
    values = pa.array([stats] + [None] * (rows.num_rows - 1) if rows.num_rows else [], pa.string())
    return rows.append_column(pa.field(SIDECAR_STATS_COLUMN, pa.string()), values)


def _reply_schema(plan: InferencePlan) -> pa.Schema:
    return task_reply_schema(plan.endpoint.task, **layout_of(plan.endpoint))


# --- the stages: decode_row -> request -> submit/receive (client.map_ordered) -> receive -> assemble -----------

def infer_batches(plan: InferencePlan, inputs: Iterable[pa.RecordBatch],
                  environment: TaskEnvironment = TaskEnvironment(), *, counters: SidecarCounters | None = None
                  ) -> Iterator[pa.RecordBatch]:
    """Stream input batches through this executor's sidecar: one batch of output rows per input batch, in order.

    Each input batch has INPUT_COLUMNS (path: row names; content: the images) and, as the input has them, `size`
    (listed files), height/width/channels (decoded pixels) and the columns `plan.carry` copies. `content` is
    binary (files: decoded here, or by the sidecar when `plan.decode` says so; with `auto` the sidecar says which
    in its READY) or decoded pixels (Spark image structs or rows, NumPy arrays: always resized here). An empty
    partition never starts a sidecar. With `counters`, the sidecar's counters for the job are read into it once
    the last reply is in. Shared by mapInArrow (PartitionInference) and the pandas UDF.
    """
    inputs = iter(inputs)
    first = next(inputs, None)
    if first is None:
        return
    pixels_given = pa.types.is_struct(first.column(INPUT_COLUMNS[1]).type) or plan.encoding not in FILE_ENCODINGS
    # Decoded pixels never go as files; nor do images at their own sizes, which only the tasks make.
    decode = "task" if pixels_given or plan.endpoint.sized else plan.decode
    endpoint = plan.endpoint.localised(environment.shipped_file)
    launch = _with_task_device(plan.launch, environment.gpu_addresses())

    agreed: list[str] = []  # where the first sidecar said images decode; a replacement is asked for the same

    def connect() -> SidecarClient:  # again after a sidecar died: ensure_sidecar then starts a new one
        info = ensure_sidecar(launch)
        client = SidecarClient(info.socket, info.token, endpoint, plan.job_id, run_options=plan.run_options,
                               decode=agreed[0] if agreed else decode, decode_options=plan.decode_options,
                               timeout_s=plan.request_timeout_s, pid=info.pid)
        agreed[:] = [client.decode]
        return client

    with FailoverClient(connect) as client:
        if (pixels_given or plan.endpoint.sized) and client.decode != "task":
            raise SidecarError(f"the sidecar agreed to decode in {client.decode!r}, but the tasks make these images "
                               "(decoded pixels, or images at their own sizes)")
        decode_here = client.decode == "task"
        begun: deque[PendingBatch] = deque()  # batches whose requests are being made, in input order

        def requests() -> Iterator[tuple[Request, object]]:
            for batch in itertools.chain([first], inputs):
                pending = pending_batch(plan, batch)
                begun.append(pending)
                yield from request(plan, pending, batch, decode_here=decode_here)

        replies = ((sent, receive(plan, sent, reply))
                   for sent, reply in map_ordered(client, requests(), plan.max_in_flight))
        for pending, parts in gathered(replies, begun):
            yield assemble(plan, pending, parts)
        if counters is not None:
            counters.snapshot = client.stats(plan.job_id)


def pending_batch(plan: InferencePlan, batch: pa.RecordBatch) -> PendingBatch:
    """An input batch's PendingBatch: its row names (kept in Arrow) and the columns `plan.carry` copies."""
    paths = batch.column(INPUT_COLUMNS[0])
    if not paths.type.equals(pa.string()):
        paths = paths.cast(pa.string())
    return PendingBatch(paths, {name: batch.column(name) for name in plan.carry})


def request(plan: InferencePlan, pending: PendingBatch, batch: pa.RecordBatch, *, decode_here: bool
            ) -> Iterator[tuple[Request, np.ndarray | list[bytes] | SizedImages]]:
    """Stage: one input batch's requests, (Request, images) with `plan.request_rows` rows each, decoded lazily so
    that decoding the next request overlaps the sidecar's work on earlier ones.

    Images are uint8 pixels decoded here (`decode_here`: where the sidecar agreed they decode; always for decoded
    pixels), or the files themselves. A row that fails here (decode_row's ImageError) goes to `pending.failed`
    and is never sent; with on_error=fail it ends the task."""
    contents = batch.column(INPUT_COLUMNS[1])
    struct = pa.types.is_struct(contents.type)
    geometry = ([batch.column(name).to_pylist() for name in ("height", "width", "channels")]
                if plan.encoding not in FILE_ENCODINGS and "height" in batch.schema.names else None)
    rows: list[int] = []
    images: list = []
    started = time.thread_time()  # this thread's CPU for the request's images: read, decoded, failed or not
    for row, data in _row_data(plan, pending, batch):
        try:
            image, source = decode_row(plan, data(), struct=struct, decode_here=decode_here,
                                       shape=[column[row] for column in geometry] if geometry else [])
        except ImageError as e:
            if plan.on_error == "fail":
                raise ImageError(f"{pending.name(row)}: {e}") from e
            pending.failed[row] = str(e)
            continue
        if source is not None:
            pending.sources[row] = source
        rows.append(row)
        images.append(image)
        if len(rows) == plan.request_rows:
            yield Request(pending, rows), _request_images(pending, rows, images, decode_here, plan.endpoint.sized,
                                                          time.thread_time() - started)
            rows, images = [], []
            started = time.thread_time()
    if rows:
        yield Request(pending, rows), _request_images(pending, rows, images, decode_here, plan.endpoint.sized,
                                                      time.thread_time() - started)


def decode_row(plan: InferencePlan, data, *, struct: bool, decode_here: bool, shape: Sequence[int] = ()
               ) -> tuple[np.ndarray | bytes, tuple[int, int] | None]:
    """Stage: one row's image as its request carries it, and its source (height, width) when sized by the model's
    rule (else None). `data` is the row's file bytes or decoded pixels (a Spark image struct with `struct`, or
    `plan.encoding`'s pixels of `shape`). Raises ImageError for the row's own fault: no image (null),
    undecodable, over a guard rail."""
    if data is None:  # a table row without an image: still one output row
        raise ImageError(NULL_IMAGE)
    prep, options = plan.endpoint.preprocessing, plan.decode_options
    pixels_given = plan.encoding not in FILE_ENCODINGS
    if plan.endpoint.sizing is not None:
        return _sized(plan, data, struct, pixels_given, list(shape))
    if struct:
        return preprocess_image_struct(data, prep, options), None
    if pixels_given:
        return preprocess_rgb(decoded_rgb(plan.encoding, data, *shape), prep), None
    if decode_here:
        return preprocess_pixels(data, prep, options), None
    check_file_size(data, options)  # refused here: never sent to the sidecar
    return data, None


def receive(plan: InferencePlan, sent: Request, reply) -> pa.RecordBatch:
    """Stage: one request's reply as rows in the reply layout: the sidecar's RESULT, or an error row per request
    row where the sidecar refused the request for its own input. With on_error=fail, a failed row ends the task;
    a model, device or sidecar fault is never a row (the client raised it already)."""
    if isinstance(reply, RequestFailed):
        if plan.on_error == "fail":
            raise SidecarError(f"{sent.batch.name(sent.rows[0])} (and {len(sent.rows) - 1} more): {reply}")
        return failed_rows([str(reply)] * len(sent.rows), _reply_schema(plan))
    if not isinstance(reply, pa.RecordBatch):
        raise SidecarError(f"unexpected reply {reply!r} for {sent.batch.name(sent.rows[0])}; the task fails")
    if plan.on_error == "fail" and ERROR in reply.schema.names:
        # A reply of other rows or columns than the request's fails in assemble, where results are checked.
        for row, error in zip(sent.rows, reply.column(ERROR).to_pylist(), strict=False):
            if error is not None:
                raise ImageError(f"{sent.batch.name(row)}: {error}")
    return reply


def gathered(replies: Iterable[tuple[Request, pa.RecordBatch]], begun: deque[PendingBatch]
             ) -> Iterator[tuple[PendingBatch, list[tuple[list[int], pa.RecordBatch]]]]:
    """Each batch of `begun` (taken from its left) with its replies (request rows, reply rows), in input order, as
    soon as every row of it is replied to or failed; a batch that sent nothing follows the one before it.
    Replies come in request order, so a batch's replies are all in by the time the next batch's come."""
    parts: dict[PendingBatch, list[tuple[list[int], pa.RecordBatch]]] = {}  # each batch's replies so far

    def whole() -> Iterator[tuple[PendingBatch, list]]:
        while begun and _answered(begun[0], parts.get(begun[0], ())):
            pending = begun.popleft()
            yield pending, parts.pop(pending, [])

    for sent, rows in replies:
        parts.setdefault(sent.batch, []).append((sent.rows, rows))
        yield from whole()
    yield from whole()
    while begun:  # rows lost on the way: assemble says how many, and the task fails
        pending = begun.popleft()
        yield pending, parts.pop(pending, [])


def _answered(pending: PendingBatch, parts: Iterable[tuple[list[int], pa.RecordBatch]]) -> bool:
    return len(pending.failed) + sum(len(rows) for rows, _ in parts) >= pending.num_rows


def assemble(plan: InferencePlan, pending: PendingBatch, parts: Sequence[tuple[Sequence[int], pa.RecordBatch]]
             ) -> pa.RecordBatch:
    """Stage: the output rows of one input batch, and the task's one output check. The rows that failed before
    sending are put back here, the only place: every reply row and every failed row at its input position
    (place_rows raises unless there is exactly one row per input row), then `path`, `label_name` (classes), the
    dense outputs (detect, segment) and the carried columns."""
    endpoint = plan.endpoint
    schema = _reply_schema(plan)
    failed = sorted(pending.failed)
    if failed:
        parts = [*parts, (failed, failed_rows([pending.failed[row] for row in failed], schema))]
    replies = place_rows(parts, pending.num_rows, schema)
    output = task_output_schema(endpoint.task, **layout_of(endpoint))
    columns = dict(zip(replies.schema.names, replies.columns, strict=True))
    columns["path"] = pending.paths
    if endpoint.task != "classify":
        columns = dense_output_columns(endpoint.task, columns, pending.sources, plan.label_names)
    elif "label_name" in output.names:  # a raw output has no classes to name
        columns["label_name"] = class_names(columns["label"], plan.label_names)
    for name, values in pending.carried.items():
        output = output.append(pa.field(name, values.type))
        columns[name] = values
    return pa.RecordBatch.from_arrays([columns[name] for name in output.names], schema=output)


def _request_images(pending: PendingBatch, rows: list[int], images: list, decode_here: bool, sized: bool,
                    cpu_s: float) -> PricedImages:
    """One request's images: SizedImages (each at its own size), stacked fixed crops, or the files; priced with
    the CPU seconds making them took (`cpu_s`), which the sidecar counts as the job's task-side decoding."""
    if sized:
        return PricedImages(SizedImages(images, [pending.sources[row] for row in rows]), cpu_s)
    return PricedImages(np.stack(images) if decode_here else images, cpu_s)


def _sized(plan: InferencePlan, data, struct: bool, pixels_given: bool, shape: list) -> tuple[np.ndarray, tuple]:
    """One image at its own size under the model's rule, and its source (height, width): decoded from a file, or
    from decoded pixels (a Spark image struct, a NumPy array), behind the same guard rails."""
    rule, options = plan.endpoint.sizing, plan.decode_options
    if not struct and not pixels_given:
        return sized_pixels(data, rule, options)
    rgb = image_struct_rgb(data) if struct else decoded_rgb(plan.encoding, data, *shape)
    if rgb.shape[0] * rgb.shape[1] > options.max_pixels:
        raise ImageError(f"image has {rgb.shape[0] * rgb.shape[1]} pixels, more than --max-pixels "
                         f"{options.max_pixels}")
    return sized_rgb(rgb, rule)


def _row_data(plan: InferencePlan, pending: PendingBatch, batch: pa.RecordBatch
              ) -> Iterator[tuple[int, Callable[[], object]]]:
    """(row, data) per row of a batch, in order: `data()` returns the row's content or raises its ImageError.
    Listed files (LOCAL_FILES) are read here: objects fetched several at a time, ahead of decoding; local files
    when their turn comes. A `size` column (the driver's listing) refuses files over --max-file-bytes before any
    read."""
    if plan.encoding != LOCAL_FILES:
        contents = batch.column(INPUT_COLUMNS[1])
        return ((row, functools.partial(_value, contents, row)) for row in range(pending.num_rows))
    sizes = batch.column("size").to_pylist() if "size" in batch.schema.names else None

    def read(row: int) -> bytes:
        return read_listed_file(pending.name(row), plan.decode_options, storage=plan.storage,
                                size=sizes[row] if sizes is not None else None)

    if pending.num_rows and is_store_uri(pending.name(0)):
        return prefetched(read, range(pending.num_rows))
    return ((row, functools.partial(read, row)) for row in range(pending.num_rows))


def _value(column: pa.Array, row: int):
    return column[row].as_py()


def _with_task_device(launch: LaunchOptions, gpu_addresses: Sequence[str]) -> LaunchOptions:
    """Use the GPU the scheduler gave this task, when it gave one and the job allows CUDA."""
    if not gpu_addresses or launch.device == "cpu":
        return launch
    return replace(launch, device=f"cuda:{gpu_addresses[0]}")
