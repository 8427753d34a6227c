"""Framing over a socket pair, and the Arrow payloads of INFER and RESULT."""

from __future__ import annotations

import json
import socket
import threading

import numpy as np
import pyarrow as pa
import pytest

from spark_cnn.errors import SidecarError
from spark_cnn.sidecar.reply import reply_batch
from spark_cnn.task import protocol
from spark_cnn.task.protocol import (
    HEADER,
    MAX_PAYLOAD_BYTES,
    PIXELS_COLUMN,
    TASK_CPU_KEY,
    ConnectionClosed,
    Kind,
    PricedImages,
    SizedImages,
    decode_outputs,
    decode_priced_request,
    decode_request,
    encode_outputs,
    encode_pixels,
    encode_request,
    recv_frame,
    send_frame,
    send_json,
)
from spark_cnn.task.schema import ERROR, TOPK_ITEM, VECTOR_TYPE, reply_schema

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

def decode_pixels(payload) -> np.ndarray:
    """An INFER payload of pixels as the sidecar reads it: (N, H, W, 3) uint8."""
    pixels = decode_request(payload)
    assert isinstance(pixels, np.ndarray), f"expected pixels, got {type(pixels).__name__}"
    return pixels


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


def test_a_priced_request_carries_the_tasks_cpu_beside_its_images_of_each_kind():
    pixels = np.random.default_rng(2).integers(0, 256, size=(2, 4, 4, 3), dtype=np.uint8)
    sized = SizedImages([pixels[0], pixels[1, :2]], [(8, 8), (4, 8)])
    for images in (pixels, [b"file one", b"two"], sized):
        got = decode_priced_request(encode_request(PricedImages(images, 0.0125)))
        assert got.task_cpu_s == 0.0125
        if isinstance(images, SizedImages):
            assert got.images.sources == images.sources and got.images.sizes == images.sizes
        else:
            assert np.array_equal(np.asarray(got.images), np.asarray(images))
        assert decode_priced_request(encode_request(images)).task_cpu_s == 0.0  # unpriced: nothing said


@pytest.mark.parametrize("value", [b"lots", b"nan", b"inf", b"-1"])
def test_a_request_whose_cpu_is_not_a_number_of_seconds_is_refused(value):
    batch = pa.RecordBatch.from_arrays([pa.array([b"x"], pa.binary())], names=["encoded"])
    batch = batch.replace_schema_metadata({TASK_CPU_KEY: value})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as writer:
        writer.write_batch(batch)
    with pytest.raises(SidecarError, match="task_cpu_s is not a number of seconds"):
        decode_priced_request(sink.getvalue())


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


# --- outputs: one reply row per request row -------------------------------------------------------------------

def test_outputs_round_trip_in_the_reply_layout_with_topk_pairs_and_vectors():
    rng = np.random.default_rng(4)
    outputs = {
        "label": rng.integers(0, 1000, size=6).astype(np.int64),
        "score": rng.random(6).astype(np.float32),
        "topk_label": rng.integers(0, 1000, size=(6, 5)).astype(np.int64),
        "topk_score": rng.random((6, 5)).astype(np.float32),
        "embedding": rng.standard_normal((6, 17)).astype(np.float32),
    }
    schema = reply_schema(embeddings=True)
    batch = decode_outputs(encode_outputs(reply_batch(outputs, None, schema)))

    assert batch.schema.equals(schema)
    assert batch.num_rows == 6
    assert np.array_equal(batch.column("label").to_numpy(), outputs["label"])
    assert np.array_equal(batch.column("score").to_numpy(), outputs["score"])
    assert batch.column("topk").type == pa.list_(TOPK_ITEM)
    pairs = batch.column("topk").flatten()
    assert np.array_equal(pairs.field("label").to_numpy().reshape(6, 5), outputs["topk_label"])
    assert np.array_equal(pairs.field("score").to_numpy().reshape(6, 5), outputs["topk_score"])
    assert batch.column("embedding").type == VECTOR_TYPE
    assert np.array_equal(batch.column("embedding").flatten().to_numpy().reshape(6, 17), outputs["embedding"])
    assert batch.column(ERROR).null_count == 6


def _outputs(rows: int, **vectors) -> dict[str, np.ndarray]:
    return {"label": np.arange(rows), "score": np.ones(rows, np.float32),
            "topk_label": np.zeros((rows, 2), np.int32), "topk_score": np.zeros((rows, 2), np.float32), **vectors}


def test_outputs_accept_a_non_contiguous_matrix():
    matrix = np.arange(24, dtype=np.float32).reshape(4, 6)[:, ::2]
    batch = decode_outputs(encode_outputs(reply_batch(_outputs(4, logits=matrix), None, reply_schema(logits=True))))
    assert np.array_equal(np.stack(batch.column("logits").to_numpy(zero_copy_only=False)), matrix)


def test_outputs_with_different_row_counts_are_refused():
    with pytest.raises(SidecarError, match="different numbers of rows"):
        reply_batch(_outputs(3, logits=np.zeros((4, 2))), None, reply_schema(logits=True))


def test_outputs_of_other_shapes_than_one_value_or_vector_per_row_are_refused():
    with pytest.raises(SidecarError, match="shape"):
        reply_batch(_outputs(3, logits=np.zeros((3, 2, 2))), None, reply_schema(logits=True))
    with pytest.raises(SidecarError, match="shape"):
        reply_batch({**_outputs(3), "label": np.zeros((3, 1))}, None, reply_schema())


def test_protocol_kinds_are_distinct_named_values():
    assert len({int(k) for k in Kind}) == len(Kind)
    assert protocol.CONNECTION_REQUEST_ID == 0
