"""Framing over a socket pair, and the Arrow payloads of INFER and RESULT."""

from __future__ import annotations

import json
import socket
import threading

import numpy as np
import pyarrow as pa
import pytest

from spark_cnn.errors import SidecarError
from spark_cnn.task import protocol
from spark_cnn.task.protocol import (
    HEADER,
    MAX_PAYLOAD_BYTES,
    PIXELS_COLUMN,
    ConnectionClosed,
    Kind,
    decode_outputs,
    decode_pixels,
    encode_outputs,
    encode_pixels,
    recv_frame,
    send_frame,
    send_json,
)

JOIN_S = 5.0


@pytest.fixture
def pair():
    a, b = socket.socketpair()
    a.settimeout(JOIN_S)
    b.settimeout(JOIN_S)
    yield a, b
    a.close()
    b.close()


def _send_in_thread(fn, *args) -> threading.Thread:
    # Payloads larger than the socket buffer would block a sender that shares the thread with the receiver.
    thread = threading.Thread(target=fn, args=args, daemon=True)
    thread.start()
    return thread


# --- frames ---------------------------------------------------------------------------------------------------

def test_json_frame_round_trip(pair):
    a, b = pair
    data = {"token": "t0k", "endpoint": "{}", "job": "j", "nested": [1, 2.5, None], "text": "ünïcode"}
    send_json(a, Kind.HELLO, 0, data)
    frame = recv_frame(b)
    assert frame.kind is Kind.HELLO
    assert frame.request_id == 0
    assert frame.json() == data


def test_binary_frame_round_trip_keeps_every_byte(pair):
    a, b = pair
    payload = np.random.default_rng(0).bytes(3 * (1 << 20))  # larger than a socket buffer
    sender = _send_in_thread(send_frame, a, Kind.INFER, 2**40 + 7, payload)
    frame = recv_frame(b)
    sender.join(JOIN_S)
    assert frame.kind is Kind.INFER
    assert frame.request_id == 2**40 + 7
    assert bytes(frame.payload) == payload


def test_empty_payload_frame(pair):
    a, b = pair
    send_frame(a, Kind.STATS, 5)
    send_frame(a, Kind.READY, 6, b"x")  # the next frame starts right after an empty one
    first, second = recv_frame(b), recv_frame(b)
    assert (first.kind, first.request_id, bytes(first.payload)) == (Kind.STATS, 5, b"")
    assert (second.kind, second.request_id, bytes(second.payload)) == (Kind.READY, 6, b"x")


def test_frames_in_sequence_keep_their_order(pair):
    a, b = pair
    for i, kind in enumerate(Kind, start=1):
        send_frame(a, kind, i, bytes([i]) * i)
    for i, kind in enumerate(Kind, start=1):
        frame = recv_frame(b)
        assert (frame.kind, frame.request_id, bytes(frame.payload)) == (kind, i, bytes([i]) * i)


def test_header_declaring_an_oversized_payload_is_refused(pair):
    a, b = pair
    a.sendall(HEADER.pack(int(Kind.INFER), 1, MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(SidecarError, match="exceeds"):
        recv_frame(b)


def test_unknown_kind_is_refused(pair):
    a, b = pair
    a.sendall(HEADER.pack(99, 1, 0))
    with pytest.raises(SidecarError, match="unknown message kind 99"):
        recv_frame(b)


def test_peer_closing_mid_payload_raises_connection_closed(pair):
    a, b = pair
    a.sendall(HEADER.pack(int(Kind.RESULT), 3, 100) + b"0123456789")
    a.close()
    with pytest.raises(ConnectionClosed):
        recv_frame(b)


def test_peer_closing_mid_header_raises_connection_closed(pair):
    a, b = pair
    a.sendall(HEADER.pack(int(Kind.RESULT), 3, 0)[:5])
    a.close()
    with pytest.raises(ConnectionClosed):
        recv_frame(b)


def test_connection_closed_is_a_sidecar_error():
    assert issubclass(ConnectionClosed, SidecarError)


# --- pixels ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(1, 224, 224, 3), (5, 32, 32, 3), (3, 7, 5, 3)])
def test_pixels_round_trip_exactly(shape):
    pixels = np.random.default_rng(1).integers(0, 256, size=shape, dtype=np.uint8)
    decoded = decode_pixels(encode_pixels(pixels))
    assert decoded.dtype == np.uint8
    assert decoded.shape == shape
    assert np.array_equal(decoded, pixels)


def test_pixels_round_trip_through_a_frame(pair):
    a, b = pair
    pixels = np.random.default_rng(2).integers(0, 256, size=(4, 224, 224, 3), dtype=np.uint8)
    sender = _send_in_thread(send_frame, a, Kind.INFER, 9, encode_pixels(pixels))
    frame = recv_frame(b)
    sender.join(JOIN_S)
    assert np.array_equal(decode_pixels(frame.payload), pixels)


def test_encode_pixels_accepts_a_non_contiguous_view():
    base = np.random.default_rng(3).integers(0, 256, size=(4, 16, 16, 3), dtype=np.uint8)
    view = base[::2, :, ::-1]  # every other image, mirrored: not C-contiguous
    assert not view.flags.c_contiguous
    assert np.array_equal(decode_pixels(encode_pixels(view)), view)


def _ipc(batch: pa.RecordBatch) -> pa.Buffer:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    return sink.getvalue()


def _fixed_binary_batch(name: str, row_bytes: int, rows: int, meta: dict | None) -> pa.RecordBatch:
    column = pa.array([bytes(row_bytes)] * rows, type=pa.binary(row_bytes))
    schema = pa.schema([pa.field(name, column.type)], metadata=meta)
    return pa.RecordBatch.from_arrays([column], schema=schema)


def _shape_meta(shape) -> dict:
    return {b"shape": json.dumps(list(shape)).encode()}


@pytest.mark.parametrize("batch", [
    pytest.param(pa.RecordBatch.from_arrays([pa.array([1, 2])], names=[PIXELS_COLUMN]), id="int-column"),
    pytest.param(_fixed_binary_batch("images", 12, 2, _shape_meta((2, 2, 3))), id="wrong-name"),
    pytest.param(pa.RecordBatch.from_arrays([pa.array([b"abc"]), pa.array([b"def"])],
                                            names=[PIXELS_COLUMN, "extra"]), id="two-columns"),
])
def test_decode_pixels_rejects_a_wrong_schema(batch):
    with pytest.raises(SidecarError, match="fixed-size binary column"):
        decode_pixels(_ipc(batch))


@pytest.mark.parametrize("row_bytes, meta", [
    pytest.param(12, _shape_meta((2, 3, 3)), id="shape-bytes-mismatch"),
    pytest.param(16, _shape_meta((2, 2, 4)), id="four-channels"),
    pytest.param(12, _shape_meta((12,)), id="flat-shape"),
    pytest.param(12, None, id="no-metadata"),
    pytest.param(12, {b"other": b"1"}, id="no-shape-key"),
])
def test_decode_pixels_rejects_mismatched_shape_metadata(row_bytes, meta):
    with pytest.raises(SidecarError, match="shape metadata"):
        decode_pixels(_ipc(_fixed_binary_batch(PIXELS_COLUMN, row_bytes, 2, meta)))


def test_payload_with_two_record_batches_is_refused():
    batch = _fixed_binary_batch(PIXELS_COLUMN, 12, 1, _shape_meta((2, 2, 3)))
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
        writer.write_batch(batch)
    with pytest.raises(SidecarError, match="one record batch"):
        decode_pixels(sink.getvalue())


# --- outputs --------------------------------------------------------------------------------------------------

def test_outputs_round_trip_with_scalars_and_vectors():
    rng = np.random.default_rng(4)
    outputs = {
        "label": rng.integers(0, 1000, size=6).astype(np.int64),
        "score": rng.random(6).astype(np.float32),
        "topk_label": rng.integers(0, 1000, size=(6, 5)).astype(np.int64),
        "topk_score": rng.random((6, 5)).astype(np.float32),
        "embedding": rng.standard_normal((6, 17)).astype(np.float32),
    }
    batch = decode_outputs(encode_outputs(outputs))

    assert batch.schema.names == list(outputs)
    assert batch.num_rows == 6
    for name, values in outputs.items():
        column = batch.column(name)
        if values.ndim == 1:
            assert column.type == pa.from_numpy_dtype(values.dtype)
            assert np.array_equal(column.to_numpy(), values)
        else:
            assert pa.types.is_fixed_size_list(column.type)
            assert column.type.list_size == values.shape[1]
            assert column.type.value_type == pa.from_numpy_dtype(values.dtype)
            assert np.array_equal(column.flatten().to_numpy().reshape(values.shape), values)


def test_outputs_accept_a_non_contiguous_matrix():
    matrix = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    batch = decode_outputs(encode_outputs({"m": matrix}))
    assert np.array_equal(np.stack(batch.column("m").to_numpy(zero_copy_only=False)), matrix)


def test_outputs_with_different_row_counts_are_refused():
    with pytest.raises(ValueError, match="same length"):
        encode_outputs({"a": np.zeros(3), "b": np.zeros((4, 2))})


def test_protocol_kinds_are_distinct_named_values():
    assert len({int(k) for k in Kind}) == len(Kind)
    assert protocol.CONNECTION_REQUEST_ID == 0
