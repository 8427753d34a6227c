"""Images at their own sizes on the wire: what the task sends is what the sidecar reads, rows checked."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from spark_cnn.errors import SidecarError
from spark_cnn.task import protocol
from spark_cnn.task.protocol import SizedImages


def _images(rng) -> SizedImages:
    shapes = [(5, 7), (7, 5), (5, 7), (1, 1)]
    return SizedImages([rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in shapes],
                       [(50, 70), (700, 500), (5, 7), (3, 3)])


def test_sized_images_round_trip_each_at_its_own_size():
    sent = _images(np.random.default_rng(0))
    got = protocol.decode_request(protocol.encode_sized(sent))
    assert isinstance(got, SizedImages) and len(got) == len(sent)
    assert got.sources == sent.sources and got.sizes == sent.sizes
    for a, b in zip(got.images, sent.images, strict=True):
        np.testing.assert_array_equal(a, b)


def test_slices_and_concat_keep_images_and_sources_in_step():
    sent = _images(np.random.default_rng(1))
    parts = [sent[0:1], sent[1:3], sent[3:]]
    joined = SizedImages.concat(parts)
    assert joined.sources == sent.sources and joined.sizes == sent.sizes
    assert [len(p) for p in parts] == [1, 2, 1]


def _payload(data: list[bytes], heights, widths, sources=((4, 4),)) -> bytes:
    sources = list(sources) * len(data)
    batch = pa.RecordBatch.from_arrays(
        [pa.array(data, pa.large_binary()), pa.array(heights, pa.int32()), pa.array(widths, pa.int32()),
         pa.array([s[0] for s in sources], pa.int32()), pa.array([s[1] for s in sources], pa.int32())],
        names=[protocol.SIZED_IMAGE_COLUMN, *protocol.SIZED_COLUMNS])
    return protocol.encode_outputs(batch)


@pytest.mark.parametrize("data, heights, widths", [
    ([b"\0" * 11], [2], [2]),  # 11 bytes for 2x2x3
    ([b"\0" * 12], [0], [6]),  # no rows of pixels
    ([None], [2], [2]),         # a null image
], ids=["bytes", "empty-size", "null"])
def test_a_row_that_does_not_match_its_size_is_refused(data, heights, widths):
    with pytest.raises(SidecarError):
        protocol.decode_request(_payload(data, heights, widths))


def test_a_sized_payload_needs_the_sized_columns():
    batch = pa.RecordBatch.from_arrays([pa.array([b"\0" * 12], pa.large_binary())],
                                       names=[protocol.SIZED_IMAGE_COLUMN])
    with pytest.raises(SidecarError, match="must have columns"):
        protocol.decode_request(protocol.encode_outputs(batch))
