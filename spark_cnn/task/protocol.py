"""The wire protocol between Spark tasks and the sidecar: framed messages over a Unix stream socket.

Every message is a fixed header (kind, request id, payload length) and a payload. Control messages carry JSON;
INFER and RESULT carry one Arrow IPC stream holding one record batch, so pixels and outputs cross the socket
without per-value serialisation. A connection starts with HELLO (token + endpoint) and READY; then the client
may keep several INFER requests in flight, each answered by a RESULT or an ERROR with the same request id. A
client that asks for it in its HELLO also gets PROGRESS messages while it waits (request id 0, never a reply).
"""

from __future__ import annotations

import json
import math
import socket
import struct
from dataclasses import asdict, dataclass, fields
from enum import Enum, IntEnum
from typing import NamedTuple

import numpy as np
import pyarrow as pa

from spark_cnn.errors import ConfigError, SidecarError
from spark_cnn.imaging.limits import DEFAULT_DECODE, DecodeOptions
from spark_cnn.models.spec import Endpoint
from spark_cnn.options import check_choice
from spark_cnn.task.run_options import DECODE_CHOICES, DEFAULT_RUN, PIXELS_DECODE_PLACE, RunOptions


class Kind(IntEnum):
    HELLO = 1        # client -> sidecar, JSON: Hello.to_json() (token, endpoint, job, decode, run/decode options)
    READY = 2        # sidecar -> client, JSON: {"pid", "device", "batch_size", "decode" (where images decode),
                     # "max_in_flight" (requests a connection may have unanswered), "batches" (as in PROGRESS)}
    INFER = 3        # client -> sidecar, Arrow: column "pixels" (uint8 HxWx3 per row), "encoded" (file bytes) or
                     # "image" (uint8 pixels of each row's own size, with SIZED_COLUMNS)
    RESULT = 4       # sidecar -> client, Arrow: one row per request row, same order (schema.reply_schema)
    ERROR = 5        # sidecar -> client, JSON: {"message", "kind": ErrorKind}; request id 0: the connection failed
    STATS = 6        # client -> sidecar, JSON: {"job"}
    STATS_REPLY = 7  # sidecar -> client, JSON: sidecar identity and counters for that job
    PROGRESS = 8     # sidecar -> client, JSON: {"batches": device batches the whole sidecar has completed}, request
                     # id 0; every PROGRESS_INTERVAL_S to a connection with requests unanswered, if its HELLO asked


# How often a sidecar tells a waiting client how many batches it has completed. Far below any useful request
# timeout (tests use 2-3 s, the default is 300 s), so a healthy sidecar's progress arrives well before a client
# gives up; one ~40-byte message per waiting connection per second costs nothing beside the replies.
PROGRESS_INTERVAL_S = 1.0


# Requests one connection may have unanswered. The sidecar stops reading a connection beyond it, so a client that
# sends without reading is held back by its socket; a client that keeps more in flight while it sends waits on a
# sidecar that waits for it to read its replies (both sockets full once replies are large, as a detector's are).
# The sidecar says its bound in READY; clients keep within it (client.map_ordered).
MAX_REQUESTS_IN_FLIGHT = 32


class ErrorKind(str, Enum):
    """What an ERROR reply blames: only REQUEST is the request's own input; every other kind fails the task."""

    REQUEST = "request"  # this request (its payload, its images): its rows carry the error
    MODEL = "model"      # the model raised, or returned outputs that do not fit its rows
    DEVICE = "device"    # the device failed this batch (out of memory at one image); the device still works
    STICKY = "sticky"    # the device is unusable until its process exits (a CUDA error): the sidecar retires
    SIDECAR = "sidecar"  # the sidecar could not build or send the reply


def error_reply(message: str, kind: ErrorKind) -> dict:
    """An ERROR's JSON payload."""
    return {"message": message, "kind": kind.value}


def error_kind(data: object) -> ErrorKind:
    """The kind an ERROR payload names; one that names none or an unknown one is the sidecar's fault, so a
    sidecar that cannot say what failed fails the task rather than writing error rows."""
    try:
        return ErrorKind(data.get("kind")) if isinstance(data, dict) else ErrorKind.SIDECAR
    except ValueError:
        return ErrorKind.SIDECAR


HEADER = struct.Struct("!BQQ")  # kind, request id, payload length
# Requests are at most a few hundred images of a few hundred KB; anything far above is a broken peer.
MAX_PAYLOAD_BYTES = 1 << 30
# Before a client has shown its token it may send only a HELLO, which is small: an unauthenticated peer
# must not make the sidecar allocate a gigabyte.
MAX_HANDSHAKE_BYTES = 1 << 20
PIXELS_COLUMN = "pixels"    # uint8 HxWx3 per row, decoded by the client
ENCODED_COLUMN = "encoded"  # image file bytes per row, decoded by the sidecar
SIZED_IMAGE_COLUMN = "image"  # uint8 h x w x 3 per row, each at its own size (detectors, segmenters)
# With SIZED_IMAGE_COLUMN: each row's sent size, and its source image's (the coordinates outputs go back to).
SIZED_COLUMNS = ("height", "width", "source_height", "source_width")
CONNECTION_REQUEST_ID = 0


@dataclass(frozen=True)
class Frame:
    """One message as read off the socket; `payload` is JSON or an Arrow IPC stream, by `kind`."""

    kind: Kind
    request_id: int
    payload: bytes | memoryview

    def json(self) -> dict:
        return json.loads(bytes(self.payload).decode("utf-8"))


@dataclass(frozen=True)
class Hello:
    """The first message of a connection: the client's token, the model it wants (endpoint), its job id, where
    its images are decoded (`task`: requests carry pixels; `sidecar`/`gpu`: files; `auto`: the sidecar picks),
    how the model runs and the guard rails for the files it decodes. The one place these options cross the wire:
    `to_json` in the client, `from_json` in the sidecar."""

    token: str
    endpoint: Endpoint
    job: str
    decode: str = PIXELS_DECODE_PLACE
    run_options: RunOptions = DEFAULT_RUN
    decode_options: DecodeOptions = DEFAULT_DECODE
    # Asks for PROGRESS messages. Opt-in, so a client that does not know them (an older one, a raw test client)
    # never receives a kind it cannot read; a sidecar that does not know them ignores the field.
    progress: bool = False

    def __post_init__(self) -> None:
        check_choice("--decode", self.decode, DECODE_CHOICES)

    def to_json(self) -> dict:
        return {"token": self.token, "endpoint": self.endpoint.to_json(), "job": self.job, "decode": self.decode,
                "options": asdict(self.run_options), "decode_options": asdict(self.decode_options),
                "progress": self.progress}

    @classmethod
    def from_json(cls, data: dict) -> Hello:
        """A HELLO as the sidecar reads it; errors name the field that is wrong."""
        if not isinstance(data, dict) or "endpoint" not in data:
            raise SidecarError("HELLO without an endpoint: expected {token, endpoint, job, ...}")
        return cls(token=str(data.get("token", "")), endpoint=Endpoint.from_json(data["endpoint"]),
                   job=str(data.get("job", "")), decode=data.get("decode") or PIXELS_DECODE_PLACE,
                   run_options=options_from_json(RunOptions, data.get("options"), "run"),
                   decode_options=options_from_json(DecodeOptions, data.get("decode_options"), "decode"),
                   progress=data.get("progress") is True)


def options_from_json(kind: type, data: dict | None, what: str):
    """Frozen options of dataclass `kind` from their JSON fields (absent: the defaults); unknown fields are
    refused, so a client newer than its sidecar fails loudly instead of being half understood."""
    if data is not None and not isinstance(data, dict):
        raise ConfigError(f"{what} options must be a JSON object, got {type(data).__name__}")
    known = {f.name for f in fields(kind)}
    if unknown := set(data or {}) - known:
        raise ConfigError(f"unknown {what} option(s) {sorted(unknown)}; expected {sorted(known)}")
    return kind(**(data or {}))


class ConnectionClosed(SidecarError):
    """The peer closed the socket (cleanly or not)."""


def send_frame(sock: socket.socket, kind: Kind, request_id: int, payload=b"") -> None:
    view = memoryview(payload)
    sock.sendall(HEADER.pack(int(kind), request_id, view.nbytes))
    if view.nbytes:
        sock.sendall(view)


def send_json(sock: socket.socket, kind: Kind, request_id: int, data: dict) -> None:
    send_frame(sock, kind, request_id, json.dumps(data).encode("utf-8"))


def recv_frame(sock: socket.socket, max_bytes: int = MAX_PAYLOAD_BYTES) -> Frame:
    kind, request_id, length = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if length > max_bytes:
        raise SidecarError(f"message of {length} bytes exceeds the {max_bytes}-byte limit")
    try:
        kind = Kind(kind)
    except ValueError as e:
        raise SidecarError(f"unknown message kind {kind}") from e
    return Frame(kind, request_id, _recv_exact(sock, length) if length else b"")


def _recv_exact(sock: socket.socket, size: int) -> memoryview:
    buf = bytearray(size)
    view = memoryview(buf)
    got = 0
    while got < size:
        n = sock.recv_into(view[got:], size - got)
        if n == 0:
            raise ConnectionClosed("the peer closed the connection")
        got += n
    return view


# --- Arrow payloads -------------------------------------------------------------------------------------------

# INFER schema metadata: the CPU seconds the task's thread spent making the request's images (reading and
# decoding them), which the sidecar adds up per job (JobStats.request: task_decode_cpu_s).
TASK_CPU_KEY = b"task_cpu_s"


class PricedImages(NamedTuple):
    """One request's images and the CPU seconds the task spent making them (TASK_CPU_KEY)."""

    images: np.ndarray | list[bytes] | SizedImages
    task_cpu_s: float = 0.0


def encode_request(request: PricedImages | np.ndarray | list[bytes] | SizedImages) -> pa.Buffer:
    """An INFER payload: pixels, files or SizedImages (as the type says), with the task's CPU when priced."""
    images, cpu_s = request if isinstance(request, PricedImages) else (request, 0.0)
    if isinstance(images, SizedImages):
        batch = sized_batch(images)
    elif isinstance(images, np.ndarray):
        batch = pixels_batch(images)
    else:
        batch = pa.RecordBatch.from_arrays([pa.array(images, pa.binary())], names=[ENCODED_COLUMN])
    if cpu_s:
        batch = batch.replace_schema_metadata({**(batch.schema.metadata or {}),
                                               TASK_CPU_KEY: f"{cpu_s:.6f}".encode()})
    return _to_ipc(batch)


def _to_ipc(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _from_ipc(payload) -> pa.RecordBatch:
    reader = pa.ipc.open_stream(pa.py_buffer(payload))
    batches = list(reader)
    if len(batches) != 1:
        raise SidecarError(f"expected one record batch per message, got {len(batches)}")
    # The IPC reader checks the framing, not the data: offsets and lengths that point outside their buffers
    # would make a later read go out of bounds. A peer's payload is checked in full before any use.
    batches[0].validate(full=True)
    return batches[0]


def encode_pixels(pixels: np.ndarray) -> pa.Buffer:
    """(N, H, W, 3) uint8 -> Arrow IPC payload, zero-copy from the array."""
    return _to_ipc(pixels_batch(pixels))


def pixels_batch(pixels: np.ndarray) -> pa.RecordBatch:
    """(N, H, W, 3) uint8 -> the INFER record batch, zero-copy from the array."""
    pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
    n, row_bytes = pixels.shape[0], int(np.prod(pixels.shape[1:]))
    column = pa.FixedSizeBinaryArray.from_buffers(pa.binary(row_bytes), n, [None, pa.py_buffer(pixels)])
    meta = {b"shape": json.dumps(list(pixels.shape[1:])).encode()}
    schema = pa.schema([pa.field(PIXELS_COLUMN, column.type)], metadata=meta)
    return pa.RecordBatch.from_arrays([column], schema=schema)


def encode_images(images: list[bytes]) -> pa.Buffer:
    """Encoded image files -> Arrow IPC payload, for the sidecar to decode."""
    return encode_request(list(images))


def decode_request(payload) -> np.ndarray | list[bytes] | SizedImages:
    """An INFER payload: (N, H, W, 3) uint8 pixels, a list of encoded image files, or SizedImages."""
    return decode_priced_request(payload).images


def decode_priced_request(payload) -> PricedImages:
    """An INFER payload's images (as decode_request) and the task's CPU seconds for them (0 when not given)."""
    batch = _from_ipc(payload)
    try:
        cpu_s = float((batch.schema.metadata or {}).get(TASK_CPU_KEY, b"0"))
    except ValueError:
        cpu_s = math.nan
    if not (math.isfinite(cpu_s) and cpu_s >= 0):
        raise SidecarError(f"INFER metadata {TASK_CPU_KEY.decode()} is not a number of seconds")
    if batch.schema.names == [ENCODED_COLUMN] and pa.types.is_binary(batch.schema.types[0]):
        return PricedImages(batch.column(0).to_pylist(), cpu_s)
    if batch.schema.names and batch.schema.names[0] == SIZED_IMAGE_COLUMN:
        return PricedImages(_sized_from(batch), cpu_s)
    return PricedImages(_pixels_from(batch), cpu_s)


class SizedImages:
    """Images of different sizes, one request's or one device batch's: `images[i]` is an (h, w, 3) uint8 array
    (or tensor, once on the device) and `sources[i]` the (height, width) of the image it was resized from.
    Slices and `concat` keep the two in step, as the batcher splits and merges requests."""

    __slots__ = ("images", "sources")

    def __init__(self, images: list, sources: list[tuple[int, int]]):
        if len(images) != len(sources):
            raise SidecarError(f"{len(images)} images but {len(sources)} source sizes")
        self.images, self.sources = list(images), [tuple(s) for s in sources]

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, rows: slice) -> SizedImages:
        return SizedImages(self.images[rows], self.sources[rows])

    @property
    def sizes(self) -> list[tuple[int, int]]:
        """The (height, width) each image is sent at."""
        return [tuple(image.shape[:2]) for image in self.images]

    @staticmethod
    def concat(parts: list[SizedImages]) -> SizedImages:
        return SizedImages([i for p in parts for i in p.images], [s for p in parts for s in p.sources])


def encode_sized(images: SizedImages) -> pa.Buffer:
    """SizedImages -> Arrow IPC payload: the pixels of each row as one binary value, and SIZED_COLUMNS."""
    return _to_ipc(sized_batch(images))


def sized_batch(images: SizedImages) -> pa.RecordBatch:
    """SizedImages -> the INFER record batch (encode_sized)."""
    arrays = [np.ascontiguousarray(image, dtype=np.uint8) for image in images.images]
    if any(a.ndim != 3 or a.shape[2] != 3 for a in arrays):
        raise SidecarError("sized images must be (height, width, 3) uint8 arrays")
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.nbytes for a in arrays], out=offsets[1:])
    data = np.concatenate([a.reshape(-1) for a in arrays]) if arrays else np.zeros(0, np.uint8)
    column = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(arrays),
                                              [None, pa.py_buffer(offsets), pa.py_buffer(data)])
    geometry = [[a.shape[0] for a in arrays], [a.shape[1] for a in arrays],
                [s[0] for s in images.sources], [s[1] for s in images.sources]]
    return pa.RecordBatch.from_arrays([column, *(pa.array(v, pa.int32()) for v in geometry)],
                                      names=[SIZED_IMAGE_COLUMN, *SIZED_COLUMNS])


def _sized_from(batch: pa.RecordBatch) -> SizedImages:
    """SizedImages viewing the received bytes, each row checked against its declared size."""
    expected = [SIZED_IMAGE_COLUMN, *SIZED_COLUMNS]
    if batch.schema.names != expected or not pa.types.is_large_binary(batch.schema.types[0]) or any(
            not pa.types.is_int32(t) for t in batch.schema.types[1:]):
        raise SidecarError(f"a sized INFER payload must have columns {expected} (large_binary, then int32), got "
                           f"{batch.schema}")
    if any(column.null_count for column in batch.columns):
        raise SidecarError("a sized INFER payload with null values")
    heights, widths, source_h, source_w = (batch.column(name).to_numpy() for name in SIZED_COLUMNS)
    column = batch.column(0)
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int64)[column.offset:column.offset + len(column) + 1]
    data = np.frombuffer(column.buffers()[2], dtype=np.uint8)
    images = []
    for i in range(len(column)):
        h, w = int(heights[i]), int(widths[i])
        if h < 1 or w < 1 or source_h[i] < 1 or source_w[i] < 1 or offsets[i + 1] - offsets[i] != h * w * 3:
            raise SidecarError(f"row {i} of a sized INFER payload: {offsets[i + 1] - offsets[i]} bytes for "
                               f"{h}x{w}x3 pixels (source {source_h[i]}x{source_w[i]})")
        images.append(data[offsets[i]:offsets[i + 1]].reshape(h, w, 3))
    return SizedImages(images, list(zip(source_h.tolist(), source_w.tolist(), strict=True)))


def _pixels_from(batch: pa.RecordBatch) -> np.ndarray:
    """(N, H, W, 3) uint8, viewing the received bytes without copying."""
    if batch.schema.names != [PIXELS_COLUMN] or not pa.types.is_fixed_size_binary(batch.schema.types[0]):
        raise SidecarError(f"INFER payload must have one fixed-size binary column {PIXELS_COLUMN!r} or one "
                           f"binary column {ENCODED_COLUMN!r}, got {batch.schema}")
    shape = tuple(json.loads((batch.schema.metadata or {}).get(b"shape", b"null")) or ())
    column = batch.column(0)
    row_bytes = column.type.byte_width
    if len(shape) != 3 or shape[2] != 3 or int(np.prod(shape)) != row_bytes:
        raise SidecarError(f"INFER payload shape metadata {shape} does not match rows of {row_bytes} bytes")
    flat = np.frombuffer(column.buffers()[1], dtype=np.uint8, count=len(column) * row_bytes,
                         offset=column.offset * row_bytes)
    return flat.reshape((len(column), *shape))


def encode_outputs(batch: pa.RecordBatch) -> pa.Buffer:
    """A RESULT's rows (sidecar/reply.py builds them) -> Arrow IPC payload."""
    return _to_ipc(batch)


def decode_outputs(payload) -> pa.RecordBatch:
    """A RESULT payload -> its rows, checked in full; the task checks them against the request."""
    return _from_ipc(payload)
