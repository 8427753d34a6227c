"""The task side of detect and segment: each image decoded upright, sized by the model's rule, sent with its
source size; Spark image structs the same; a bad file is its row's error, never a request's."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from PIL import Image

from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.imaging.sizing import SizeRule
from spark_cnn.models.spec import Endpoint
from spark_cnn.task.launcher import LaunchOptions
from spark_cnn.task.protocol import SizedImages
from spark_cnn.task.stream import INPUT_COLUMNS, InferencePlan, PendingBatch, pending_batch, request
from tests.sample_images import encode, sample_photo

RULE = SizeRule(min_size=64, max_size=96)


def _plan() -> InferencePlan:
    endpoint = Endpoint(source="m", weights=None, preprocessing=Preprocessing(), top_k=1, task="detect",
                        sizing=RULE)
    return InferencePlan(endpoint=endpoint, launch=LaunchOptions(app_id="app"), job_id="job", request_rows=2)


def _requests(paths: list[str], contents: pa.Array) -> tuple[list, PendingBatch]:
    """(rows, images) of each request made from one input batch, and that batch's PendingBatch."""
    batch = pa.RecordBatch.from_arrays([pa.array(paths, pa.string()), contents], names=list(INPUT_COLUMNS))
    pending = pending_batch(_plan(), batch)
    return [(sent.rows, priced.images) for sent, priced in request(_plan(), pending, batch, decode_here=True)], pending


def test_files_go_at_their_own_size_with_their_upright_source_size():
    exif = Image.Exif()
    exif[0x0112] = 8  # stored rotated: upright it is 120 wide, 200 tall
    files = [encode(sample_photo().resize((300, 200)), "PNG"), b"",
             encode(sample_photo().resize((200, 120)), "JPEG", exif=exif),
             encode(sample_photo().convert("L").resize((50, 40)), "PNG"),
             encode(sample_photo().convert("RGBA").resize((64, 64)), "PNG"), b"not an image"]
    paths = [f"f{i}" for i in range(len(files))]
    requests, pending = _requests(paths, pa.array(files, pa.binary()))
    assert [rows for rows, _ in requests] == [[0, 2], [3, 4]]  # two rows per request; rows 1 and 5 failed
    sized = SizedImages.concat([images for _, images in requests])
    assert sized.sources == [(200, 300), (200, 120), (40, 50), (64, 64)]
    assert sized.sizes == [RULE.target(*source) for source in sized.sources] == [(64, 96), (96, 57), (64, 80),
                                                                                (64, 64)]
    assert sorted(pending.failed) == [1, 5]  # kept out of the requests, put back by assemble
    assert "empty file" in pending.failed[1]
    assert pending.sources == {0: (200, 300), 2: (200, 120), 3: (40, 50), 4: (64, 64)}


def test_spark_image_structs_are_sized_like_files():
    bgr = np.zeros((30, 200, 3), np.uint8)
    bgr[:, :, 2] = 255  # red, in OpenCV's channel order
    struct = {"origin": "o", "height": 30, "width": 200, "nChannels": 3, "mode": 16, "data": bgr.tobytes()}
    column = pa.array([struct], pa.struct([("origin", pa.string()), ("height", pa.int32()), ("width", pa.int32()),
                                           ("nChannels", pa.int32()), ("mode", pa.int32()), ("data", pa.binary())]))
    requests, _ = _requests(["o"], column)
    (rows, images), = requests
    assert images.sources == [(30, 200)] and images.sizes == [(14, 96)]
    assert (images.images[0][..., 0] == 255).all() and (images.images[0][..., 1:] == 0).all()
