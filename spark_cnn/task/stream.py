"""The Spark task side of inference: a mapInArrow function that streams a partition through the sidecar.

Each task decodes its images to uint8 pixels (Spark runs tasks in parallel processes, so decoding scales with
cores) or, with `decode` set to `sidecar` or `gpu`, sends the files for the sidecar to decode. Requests of a
few rows go to the executor's sidecar with several in flight, and the replies become output rows: one row
per input row, in input order (each reply row at its input position), with `error` set where an image
failed. Only an image's own fault (undecodable, too large, a guard rail, a request the sidecar refused for its
input) is a row's error; a model, device or sidecar fault (client.SidecarFault) fails the task, whatever
`on_error` says, so Spark retries it and the job fails when the retries run out. No torch here: tasks stay light.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
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
from spark_cnn.task.protocol import SizedImages
from spark_cnn.task.run_options import DEFAULT_RUN, RunOptions
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
    decode: str = "auto"  # auto | task | sidecar | gpu (auto: the sidecar picks, see perf/placement.py)
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


@dataclass
class _BatchState:
    """One input record batch on its way through the sidecar. `paths` name the rows in error messages (file
    paths, or row labels where the input has none); `replies` gather (input positions, rows in the reply
    layout) per request, and for the rows that failed here or got an ERROR instead of a reply."""

    paths: list[str]
    carried: dict[str, pa.Array] = field(default_factory=dict)
    replies: list[tuple[list[int], pa.RecordBatch]] = field(default_factory=list)
    sources: dict[int, tuple[int, int]] = field(default_factory=dict)  # sized images: row -> source (h, w)


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
        inputs = ((batch.column(INPUT_COLUMNS[0]).to_pylist(), batch.column(INPUT_COLUMNS[1]), batch)
                  for batch in batches)
        if not self.stats_in_output:
            for state in infer_batches(self.plan, inputs, self.stats, self.environment):
                yield self.assemble(state)
            return
        snapshots: list[dict] = []
        states = infer_batches(self.plan, inputs, _Collected(snapshots), self.environment)
        yield from stats_on_last_batch((self.assemble(state) for state in states), snapshots)

    def assemble(self, state: _BatchState) -> pa.RecordBatch:
        """The classify output rows of one input batch: every reply row at its input position (place_rows
        checks one row per input row), with `path`, `label_name` (classes) and the carried columns added."""
        endpoint = self.plan.endpoint
        replies = place_rows(state.replies, len(state.paths), _reply_schema(self.plan))
        schema = task_output_schema(endpoint.task, **layout_of(endpoint))
        columns = dict(zip(replies.schema.names, replies.columns, strict=True))
        columns["path"] = pa.array(state.paths, pa.string())
        if endpoint.task != "classify":
            columns = dense_output_columns(endpoint.task, columns, state.sources, self.plan.label_names)
        elif "label_name" in schema.names:  # a raw output has no classes to name
            columns["label_name"] = class_names(columns["label"], self.plan.label_names)
        for name, values in state.carried.items():
            schema = schema.append(pa.field(name, values.type))
            columns[name] = values
        return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)


SIDECAR_STATS_COLUMN = "_sidecar_stats"


def with_stats_column(schema: pa.Schema) -> pa.Schema:
    """The output schema of a PartitionInference with `stats_in_output`."""
    return schema.append(pa.field(SIDECAR_STATS_COLUMN, pa.string()))


class _Collected:
    """An accumulator stand-in that keeps the snapshots a task adds."""

    def __init__(self, snapshots: list[dict]):
        self._snapshots = snapshots

    def add(self, update: dict) -> None:
        self._snapshots.extend(update.values())


def stats_on_last_batch(batches: Iterator[pa.RecordBatch], snapshots: list[dict]) -> Iterator[pa.RecordBatch]:
    """`batches` with SIDECAR_STATS_COLUMN added: JSON of the last of `snapshots` (filled by the time `batches`
    ends) on the first row of the last non-empty batch, null elsewhere. That batch is held back until then."""
    held = None
    for rows in batches:
        if rows.num_rows == 0:
            yield _stats_on_first_row(rows, None)
            continue
        if held is not None:
            yield _stats_on_first_row(held, None)
        held = rows
    if held is not None:
        yield _stats_on_first_row(held, json.dumps(snapshots[-1]) if snapshots else None)


def _stats_on_first_row(rows: pa.RecordBatch, stats: str | None) -> pa.RecordBatch:
    values = pa.array([stats] + [None] * (rows.num_rows - 1) if rows.num_rows else [], pa.string())
    return rows.append_column(pa.field(SIDECAR_STATS_COLUMN, pa.string()), values)


def _reply_schema(plan: InferencePlan) -> pa.Schema:
    return task_reply_schema(plan.endpoint.task, **layout_of(plan.endpoint))


def infer_batches(plan: InferencePlan, inputs: Iterator[tuple[list[str], pa.Array]], stats_accumulator=None,
                  environment: TaskEnvironment = TaskEnvironment()) -> Iterator[_BatchState]:
    """Stream input batches (row names, image column) through this executor's sidecar; one state per batch.

    The image column is binary (files: decoded here, or by the sidecar when `plan.decode` says so; with
    `auto` the sidecar says which in its READY) or decoded pixels (Spark image structs or rows, NumPy arrays:
    always resized here). An empty partition never starts a sidecar. Shared by mapInArrow (PartitionInference)
    and the pandas UDF.
    """
    inputs = iter(inputs)
    first = next(inputs, None)
    if first is None:
        return
    pixels_given = pa.types.is_struct(first[1].type) or plan.encoding not in FILE_ENCODINGS
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
        work = _work_items(plan, itertools.chain([first], inputs), decode_here=client.decode == "task")
        for (state, rows), reply in map_ordered(client, work, plan.max_in_flight):
            if rows is None:
                yield state
            elif isinstance(reply, RequestFailed):  # the request's own input: its rows carry the error
                if plan.on_error == "fail":
                    raise SidecarError(f"{state.paths[rows[0]]} (and {len(rows) - 1} more): {reply}")
                state.replies.append((rows, failed_rows([str(reply)] * len(rows), _reply_schema(plan))))
            elif not isinstance(reply, pa.RecordBatch):  # a model, device or sidecar fault is never a row
                raise SidecarError(f"unexpected reply {reply!r} for {state.paths[rows[0]]}; the task fails")
            else:
                _take_reply(plan, state, rows, reply)
        if stats_accumulator is not None:
            snapshot = client.stats(plan.job_id)
            stats_accumulator.add({sidecar_key(snapshot): snapshot})


def _take_reply(plan: InferencePlan, state: _BatchState, rows: list[int], reply: pa.RecordBatch) -> None:
    """Keep one request's reply, its rows in the request's order; with on_error=fail, a failed row ends the task."""
    if plan.on_error == "fail" and ERROR in reply.schema.names:
        # A reply of other rows or columns than the request's fails in place_rows, where results are checked.
        for row, error in zip(rows, reply.column(ERROR).to_pylist(), strict=False):
            if error is not None:
                raise ImageError(f"{state.paths[row]}: {error}")
    state.replies.append((rows, reply))


def _work_items(plan: InferencePlan, inputs: Iterator[tuple], *, decode_here: bool):
    """((state, rows), images) per request; then ((state, None), None) to mark the end of each input batch.
    `inputs` yields (row names, image column[, the whole record batch]); the batch, when given, supplies image
    geometry (Spark image-source rows) and the columns `plan.carry` copies to the output.

    Images are uint8 pixels decoded here (`decode_here`: where the sidecar agreed they decode; always for
    decoded pixels), or the files themselves. Rows that fail here join the state, in the reply layout, before
    the end mark."""
    prep = plan.endpoint.preprocessing
    sizing = plan.endpoint.sizing  # images at their own sizes under this rule (detect, segment), else fixed crops
    decode_options = plan.decode_options
    pixels_given = plan.encoding not in FILE_ENCODINGS  # decoded pixels (image source, NumPy) never go as files
    read_here = plan.encoding == LOCAL_FILES  # the source listed the files; their bytes are read here
    for paths, contents, *whole in inputs:
        batch = whole[0] if whole else None
        structs = pa.types.is_struct(contents.type)
        geometry = ([batch.column(name).to_pylist() for name in ("height", "width", "channels")]
                    if pixels_given and batch is not None and "height" in batch.schema.names else None)
        carried = {name: batch.column(name) for name in plan.carry} if batch is not None else {}
        state = _BatchState(paths, carried)
        rows: list[int] = []
        images: list = []
        failed: list[int] = []
        errors: list[str] = []
        reads = _listed_reads(plan, paths, batch) if read_here else None
        for i, path in enumerate(paths):
            try:
                data = next(reads)[1]() if read_here else contents[i].as_py()
                if data is None:  # a table row without an image: still one output row
                    raise ImageError(NULL_IMAGE)
                if sizing is not None:
                    data, state.sources[i] = _sized(plan, data, structs, pixels_given,
                                                    [column[i] for column in geometry] if geometry else [])
                elif structs:
                    data = preprocess_image_struct(data, prep, decode_options)
                elif pixels_given:
                    shape = [column[i] for column in geometry] if geometry else []
                    data = preprocess_rgb(decoded_rgb(plan.encoding, data, *shape), prep)
                elif decode_here:
                    data = preprocess_pixels(data, prep, decode_options)
                else:
                    check_file_size(data, decode_options)  # refused here: never sent to the sidecar
            except ImageError as e:
                if plan.on_error == "fail":
                    raise ImageError(f"{path}: {e}") from e
                failed.append(i)
                errors.append(str(e))
                continue
            rows.append(i)
            images.append(data)
            if len(rows) == plan.request_rows:
                yield (state, rows), _request(state, rows, images, decode_here, sizing is not None)
                rows, images = [], []
        if rows:
            yield (state, rows), _request(state, rows, images, decode_here, sizing is not None)
        if failed:
            state.replies.append((failed, failed_rows(errors, _reply_schema(plan))))
        yield (state, None), None


def _request(state: _BatchState, rows: list[int], images: list, decode_here: bool, sized: bool):
    """One request's images: SizedImages (each at its own size), stacked fixed crops, or the files."""
    if sized:
        return SizedImages(images, [state.sources[i] for i in rows])
    return np.stack(images) if decode_here else images


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


def _listed_reads(plan: InferencePlan, paths: list[str], batch: pa.RecordBatch | None):
    """(row, result) per row of a batch of listed files, in order: objects fetched several at a time, ahead of
    decoding; local files read when their turn comes. A `size` column (the driver's listing) refuses files over
    --max-file-bytes before any read."""
    sizes = batch.column("size").to_pylist() if batch is not None and "size" in batch.schema.names else None

    def read(i: int) -> bytes:
        return read_listed_file(paths[i], plan.decode_options, storage=plan.storage,
                                size=sizes[i] if sizes is not None else None)

    if paths and is_store_uri(paths[0]):
        return prefetched(read, range(len(paths)))
    return ((i, functools.partial(read, i)) for i in range(len(paths)))


def _with_task_device(launch: LaunchOptions, gpu_addresses: Sequence[str]) -> LaunchOptions:
    """Use the GPU the scheduler gave this task, when it gave one and the job allows CUDA."""
    if not gpu_addresses or launch.device == "cpu":
        return launch
    return replace(launch, device=f"cuda:{gpu_addresses[0]}")
