"""Fuzzing the wire protocol against a live sidecar (hypothesis): malformed Arrow, wrong schemas, mutated
payloads, oversized lengths, truncated streams, unknown kinds, bad handshakes.

A bad payload must get an ERROR for that request id only (the connection goes on); a broken frame must end
that connection only (an ERROR with request id 0, or just EOF). After every case, a client connected before all
of them and a fresh one both still get exact results, and the sidecar process lives.
"""

from __future__ import annotations

import io
import json
import socket
import struct
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from PIL import Image

from spark_cnn.task import protocol
from spark_cnn.task.client import SidecarClient, map_ordered
from spark_cnn.task.procs import ProcessId, is_alive
from spark_cnn.task.protocol import Kind
from spark_cnn.task.schema import ERROR, reply_schema
from tests.sidecar_harness import PIXEL_SHAPE, check_against_reference, random_pixels

# Fuzzes a running sidecar process. conftest.py gives the sidecar fixtures: a private runtime directory, the demo
# model, one shared running sidecar.
pytestmark = pytest.mark.slow

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
REPLY_WAIT_S = 30.0


@pytest.fixture(scope="module")
def bystander(shared, endpoint) -> Iterator[SidecarClient]:
    """A client connected before any bad input; it must be served after each case."""
    _, info = shared
    with SidecarClient(info.socket, info.token, endpoint, job="bystander") as client:
        yield client


@pytest.fixture
def still_serving(shared, endpoint, reference, bystander):
    """Call after a case: the bystander and a fresh client get exact results; the sidecar process lives."""
    _, info = shared
    rng = np.random.default_rng(7)

    def check() -> None:
        pixels = random_pixels(rng, 2)
        [(_, reply)] = list(map_ordered(bystander, [(0, pixels)]))
        check_against_reference(reference, pixels, reply)
        with SidecarClient(info.socket, info.token, endpoint, job="fresh") as fresh:
            [(_, reply)] = list(map_ordered(fresh, [(0, pixels)]))
        check_against_reference(reference, pixels, reply)
        assert is_alive(ProcessId(info.pid, 0))

    return check


def raw_connection(info, endpoint, *, handshake: bool = True, decode: str = "task") -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(REPLY_WAIT_S)
    sock.connect(info.socket)
    if handshake:
        protocol.send_json(sock, Kind.HELLO, 1, {"token": info.token, "endpoint": endpoint.to_json(), "job": "fuzz",
                                                 "decode": decode})
        ready = protocol.recv_frame(sock)
        assert ready.kind == Kind.READY and ready.json()["decode"] == decode
    return sock


def ends_connection(sock: socket.socket) -> str:
    """Read until EOF; the message of an ERROR with request id 0 if one came ('' if the sidecar just closed)."""
    message = ""
    try:
        while True:
            frame = protocol.recv_frame(sock)
            assert (frame.kind, frame.request_id) == (Kind.ERROR, protocol.CONNECTION_REQUEST_ID), frame.kind
            message = frame.json()["message"]
    except protocol.ConnectionClosed:
        return message
    except ConnectionResetError:
        return message


def one_reply(sock: socket.socket, request_id: int) -> protocol.Frame:
    frame = protocol.recv_frame(sock)
    assert frame.request_id == request_id and frame.kind in (Kind.RESULT, Kind.ERROR), (frame.kind, frame.request_id)
    return frame


def png(pixels: np.ndarray) -> bytes:
    """A lossless file of pixels at the model's input size: the sidecar decodes it to exactly these pixels."""
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def ipc(batch: pa.RecordBatch) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


# --- request-level: a clear ERROR for that request, the connection goes on --------------------------------------

def _column(draw, name: str) -> pa.Array:
    rows = draw(st.integers(0, 4))
    kind = draw(st.sampled_from(["binary", "fixed", "int32", "string", "list"]))
    if kind == "binary":
        return pa.array(draw(st.lists(st.binary(max_size=64), min_size=rows, max_size=rows)), pa.binary())
    if kind == "fixed":
        width = draw(st.sampled_from([1, 3, 12, int(np.prod(PIXEL_SHAPE)), int(np.prod(PIXEL_SHAPE)) + 3]))
        return pa.array([bytes(width)] * rows, pa.binary(width))
    if kind == "int32":
        return pa.array(draw(st.lists(st.integers(-2**31, 2**31 - 1), min_size=rows, max_size=rows)), pa.int32())
    if kind == "string":
        return pa.array(draw(st.lists(st.text(max_size=8), min_size=rows, max_size=rows)), pa.string())
    return pa.array([[1, 2]] * rows, pa.list_(pa.int64()))


@st.composite
def wrong_schema_payloads(draw) -> bytes:
    """Arrow IPC streams of other shapes than an INFER: other names, types, several columns, bad metadata."""
    names = draw(st.lists(st.sampled_from([protocol.PIXELS_COLUMN, protocol.ENCODED_COLUMN, "x", ""]),
                          min_size=1, max_size=3))
    columns = [_column(draw, name) for name in names]
    rows = min(len(c) for c in columns)
    columns = [c.slice(0, rows) for c in columns]
    shape = draw(st.sampled_from([None, b"[32, 32, 3]", b"[4, 1, 3]", b"[-1, 32, 3]", b"{}", b"not json",
                                  b"[1e9, 1e9, 3]"]))
    schema = pa.schema([pa.field(n, c.type) for n, c in zip(names, columns, strict=True)],
                       metadata={b"shape": shape} if shape else None)
    return ipc(pa.RecordBatch.from_arrays(columns, schema=schema))


@st.composite
def mutated_payloads(draw) -> tuple[bytes, str]:
    """A valid INFER payload with bytes flipped, cut or inserted (Arrow metadata, lengths, offsets, data), and
    where the connection it goes on decodes: pixels where the tasks decode, files where the sidecar does."""
    files = draw(st.booleans())
    data = bytearray(protocol.encode_images([b"\xff\xd8\xff" * 10, b"abc"]).to_pybytes() if files
                     else protocol.encode_pixels(np.zeros((2, *PIXEL_SHAPE), np.uint8)).to_pybytes())
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data) - 1))
        action = draw(st.sampled_from(["flip", "cut", "insert"]))
        if action == "flip":
            data[at] ^= draw(st.integers(1, 255))
        elif action == "cut":
            del data[at:]
            if not data:
                data = bytearray(b"\0")
        else:
            data[at:at] = draw(st.binary(min_size=1, max_size=16))
    return bytes(data), "sidecar" if files else "task"


def _send_bad_infer_then_good(info, endpoint, reference, payload: bytes, decode: str = "task") -> protocol.Frame:
    """Send `payload`, then a good request of what the connection agreed to (pixels, or files the sidecar
    decodes), which must be answered in full."""
    pixels = random_pixels(np.random.default_rng(len(payload)), 1)
    with raw_connection(info, endpoint, decode=decode) as sock:
        protocol.send_frame(sock, Kind.INFER, 2, payload)
        reply = one_reply(sock, 2)
        good_payload = protocol.encode_pixels(pixels) if decode == "task" else protocol.encode_images([png(pixels[0])])
        protocol.send_frame(sock, Kind.INFER, 3, good_payload)  # the same connection goes on
        good = one_reply(sock, 3)
    assert good.kind == Kind.RESULT, good.json()
    outputs = protocol.decode_outputs(good.payload)
    if decode == "task":
        check_against_reference(reference, pixels, outputs)
    else:
        assert outputs.column(ERROR).to_pylist() == [None] and outputs.column("label").null_count == 0
    if reply.kind == Kind.ERROR:
        assert reply.json()["message"].startswith("bad request: "), reply.json()
    return reply


@FUZZ
@given(payload=st.binary(max_size=512))
def test_random_bytes_as_infer_payload_fail_that_request_only(shared, endpoint, reference, payload):
    reply = _send_bad_infer_then_good(shared[1], endpoint, reference, payload)
    assert reply.kind == Kind.ERROR


@FUZZ
@given(payload=wrong_schema_payloads(), decode=st.sampled_from(["task", "sidecar"]))
def test_wrong_schemas_fail_that_request_only(shared, endpoint, reference, payload, decode):
    reply = _send_bad_infer_then_good(shared[1], endpoint, reference, payload, decode)
    if reply.kind == Kind.RESULT:  # only an `encoded` column of files the sidecar decodes: one row each, in place
        outputs = protocol.decode_outputs(reply.payload)
        assert decode == "sidecar"
        assert outputs.schema.equals(reply_schema(logits=endpoint.logits, embeddings=endpoint.embeddings))
        assert outputs.column(ERROR).null_count == 0  # random bytes are no image


@FUZZ
@given(case=mutated_payloads())
def test_mutated_arrow_payloads_fail_that_request_only(shared, endpoint, reference, case):
    payload, decode = case
    _send_bad_infer_then_good(shared[1], endpoint, reference, payload, decode)


@pytest.mark.parametrize("decode", ["task", "sidecar"])
def test_a_request_unlike_the_agreed_decode_place_fails_that_request_only(shared, endpoint, reference, decode):
    pixels = random_pixels(np.random.default_rng(11), 2)
    unlike = protocol.encode_images([png(p) for p in pixels]) if decode == "task" else protocol.encode_pixels(pixels)
    reply = _send_bad_infer_then_good(shared[1], endpoint, reference, unlike.to_pybytes(), decode)
    assert reply.kind == Kind.ERROR
    assert f"agreed to decode in {decode!r}" in reply.json()["message"]


def test_files_the_sidecar_decodes_come_back_one_row_each_in_place(shared, endpoint, reference):
    pixels = random_pixels(np.random.default_rng(12), 2)
    files = [png(pixels[0]), b"", b"not an image", png(pixels[1])]
    with raw_connection(shared[1], endpoint, decode="sidecar") as sock:
        protocol.send_frame(sock, Kind.INFER, 2, protocol.encode_images(files))
        reply = one_reply(sock, 2)
    assert reply.kind == Kind.RESULT, reply.json()
    outputs = protocol.decode_outputs(reply.payload)
    assert outputs.schema.equals(reply_schema(logits=endpoint.logits, embeddings=endpoint.embeddings))
    errors = outputs.column(ERROR).to_pylist()
    assert errors[0] is None and errors[3] is None and errors[1] and errors[2]
    assert outputs.column("label").is_null().to_pylist() == [False, True, True, False]
    check_against_reference(reference, pixels, outputs.take([0, 3]))


def test_request_level_cases_left_the_sidecar_serving(still_serving):
    still_serving()


# --- connection-level: that connection ends, the others go on ---------------------------------------------------

@pytest.mark.parametrize("case", ["unknown kind before HELLO", "unknown kind after HELLO", "oversized HELLO",
                                  "oversized INFER", "reply kind from a client", "second HELLO", "request id 0",
                                  "HELLO not JSON", "HELLO without endpoint", "STATS not JSON"])
def test_broken_frames_end_that_connection_only(shared, endpoint, still_serving, case):
    _, info = shared
    before_hello = case in ("unknown kind before HELLO", "oversized HELLO", "HELLO not JSON", "HELLO without endpoint")
    with raw_connection(info, endpoint, handshake=not before_hello) as sock:
        if case.startswith("unknown kind"):
            sock.sendall(protocol.HEADER.pack(99, 2, 0))
        elif case == "oversized HELLO":
            sock.sendall(protocol.HEADER.pack(Kind.HELLO, 1, protocol.MAX_HANDSHAKE_BYTES + 1))
        elif case == "oversized INFER":
            sock.sendall(protocol.HEADER.pack(Kind.INFER, 2, protocol.MAX_PAYLOAD_BYTES + 1))
        elif case == "reply kind from a client":
            protocol.send_json(sock, Kind.READY, 2, {})
        elif case == "second HELLO":
            protocol.send_json(sock, Kind.HELLO, 2, {"token": info.token, "endpoint": endpoint.to_json()})
        elif case == "request id 0":
            protocol.send_frame(sock, Kind.INFER, 0, protocol.encode_pixels(random_pixels(np.random.default_rng(), 1)))
        elif case == "HELLO not JSON":
            protocol.send_frame(sock, Kind.HELLO, 1, b"\xff{not json")
        elif case == "HELLO without endpoint":
            protocol.send_json(sock, Kind.HELLO, 1, {"token": info.token, "job": "x"})
        else:
            protocol.send_frame(sock, Kind.STATS, 2, b"{")
        message = ends_connection(sock)
    assert message, f"{case}: the sidecar closed without saying why"
    still_serving()


@FUZZ
@given(data=st.data())
def test_truncated_streams_end_that_connection_only(shared, endpoint, data):
    """A header cut short, or a payload shorter than its header says, then the client goes away."""
    _, info = shared
    payload = protocol.encode_pixels(np.zeros((1, *PIXEL_SHAPE), np.uint8)).to_pybytes()
    frame = protocol.HEADER.pack(Kind.INFER, 2, len(payload)) + payload
    cut = data.draw(st.integers(1, len(frame) - 1))
    handshake = data.draw(st.booleans())
    with raw_connection(info, endpoint, handshake=handshake) as sock:
        sock.sendall(frame[:cut])
        sock.shutdown(socket.SHUT_WR)  # the stream ends mid-frame
        ends_connection(sock)
    assert is_alive(ProcessId(info.pid, 0))


def test_truncated_streams_left_the_sidecar_serving(still_serving):
    still_serving()


@FUZZ
@given(hello=st.dictionaries(st.sampled_from(["token", "endpoint", "job", "decode", "options"]),
                             st.one_of(st.none(), st.integers(), st.text(max_size=12), st.lists(st.integers()),
                                       st.dictionaries(st.text(max_size=5), st.integers(), max_size=3))))
def test_malformed_hellos_are_refused(shared, endpoint, hello):
    """Without the real token nothing else in a HELLO is looked at; with it, bad fields are named."""
    _, info = shared
    with raw_connection(info, endpoint, handshake=False) as sock:
        protocol.send_json(sock, Kind.HELLO, 1, hello)
        message = ends_connection(sock)
    assert message
    if hello.get("token") != info.token:
        assert message == "refused: wrong sidecar token"


def test_malformed_hellos_left_the_sidecar_serving(still_serving):
    still_serving()


def test_header_length_limit_is_checked_before_reading():
    """The limits hold for any length a header can carry, up to 2**64 - 1."""
    left, right = socket.socketpair()
    with left, right:
        left.sendall(struct.pack("!BQQ", Kind.INFER, 1, 2**64 - 1))
        with pytest.raises(protocol.SidecarError, match="exceeds"):
            protocol.recv_frame(right)


def test_stats_reply_carries_no_token(shared, endpoint):
    _, info = shared
    with SidecarClient(info.socket, info.token, endpoint, job="bystander") as client:
        stats = client.stats("bystander")
    assert info.token not in json.dumps(stats)
