"""The result layout (task/schema.py): the contracts users see, derived from one declaration, and the one check
that every input row gets exactly one result row."""

from __future__ import annotations

import pyarrow as pa
import pytest

from spark_cnn.errors import SidecarError
from spark_cnn.task.schema import (
    ERROR,
    UDF_OUTPUTS,
    class_names,
    failed_rows,
    output_schema,
    place_rows,
    reply_schema,
    spark_ddl,
    spark_type,
    task_output_schema,
    udf_output_type,
)


def test_classify_output_ddl_is_the_documented_contract():
    assert spark_ddl(output_schema()) == ("path string, label int, label_name string, score float, "
                                          "topk array<struct<label:int,score:float>>, error string")
    assert spark_ddl(output_schema(logits=True, embeddings=True)).endswith(
        ", error string, logits array<float>, embedding array<float>")
    assert output_schema(embeddings=True).names == ["path", "label", "label_name", "score", "topk", ERROR,
                                                    "embedding"]


def test_udf_structs_are_the_documented_contract():
    assert {output: spark_type(udf_output_type(output)) for output in UDF_OUTPUTS} == {
        "top1": "struct<label:int,label_name:string,score:float,error:string>",
        "topk": "struct<topk:array<struct<label:int,label_name:string,score:float>>,error:string>",
        "logits": "struct<logits:array<float>,error:string>",
        "embedding": "struct<embedding:array<float>,error:string>",
        "raw": "struct<raw:array<float>,shape:array<int>,error:string>",
        "detections": "struct<detections:array<struct<label:int,label_name:string,score:float,box:array<float>>>,"
                      "error:string>",
        "segments": "struct<mask:binary,classes:array<struct<label:int,label_name:string,pixels:bigint>>,"
                    "error:string>",
    }


def test_detect_and_segment_outputs_are_the_documented_contract():
    assert spark_ddl(task_output_schema("detect")) == (
        "path string, detections array<struct<label:int,label_name:string,score:float,box:array<float>>>, "
        "error string")
    assert spark_ddl(task_output_schema("segment")) == (
        "path string, mask binary, classes array<struct<label:int,label_name:string,pixels:bigint>>, error string")


def test_the_reply_holds_the_output_columns_but_those_the_task_adds():
    output, reply = output_schema(logits=True), reply_schema(logits=True)
    assert reply.names == ["label", "score", "topk", ERROR, "logits"]
    assert all(reply.field(name).type == output.field(name).type for name in reply.names)


def test_a_type_spark_ddl_cannot_name_is_refused():
    with pytest.raises(TypeError, match="no Spark DDL name"):
        spark_type(pa.float16())


def _labels(*labels) -> pa.RecordBatch:
    """Fine reply rows with these labels (other outputs left null)."""
    schema = reply_schema()
    return pa.RecordBatch.from_pydict({name: labels if name == "label" else [None] * len(labels)
                                       for name in schema.names}, schema=schema)


@pytest.mark.parametrize("pyarrow_has_concat_batches", [True, False], ids=["pyarrow>=19", "pyarrow-18"])
def test_rows_are_placed_at_their_positions_failed_rows_included(pyarrow_has_concat_batches, monkeypatch):
    if not pyarrow_has_concat_batches:  # as on pyarrow 18, the oldest allowed: no pa.concat_batches
        monkeypatch.delattr(pa, "concat_batches", raising=False)
    schema = reply_schema()
    parts = [([3, 0], _labels(30, 0)), ([1], failed_rows(["cannot decode image"], schema)), ([2], _labels(20))]

    placed = place_rows(parts, 4, schema)

    assert placed.schema.equals(schema)
    assert placed.column("label").to_pylist() == [0, None, 20, 30]
    assert placed.column(ERROR).to_pylist() == [None, "cannot decode image", None, None]
    assert placed.column("topk").to_pylist()[1] is None
    assert place_rows([], 0, schema).num_rows == 0


@pytest.mark.parametrize("parts, rows, match", [
    pytest.param([([0, 1], "1 row")], 2, "a reply of 1 rows for a request of 2 rows", id="short-reply"),
    pytest.param([([0], "1 row"), ([0], "1 row")], 2, "not one row for each", id="a-row-twice"),
    pytest.param([([0], "1 row")], 2, "1 result rows for 2 input rows", id="a-row-missing"),
    pytest.param([([0], "other columns")], 1, "columns", id="other-columns"),
])
def test_a_result_that_is_not_one_row_per_input_row_is_refused(parts, rows, match):
    batches = {"1 row": _labels(1), "other columns": pa.RecordBatch.from_pydict({"label": [1]})}
    with pytest.raises(SidecarError, match=match):
        place_rows([(positions, batches[kind]) for positions, kind in parts], rows, reply_schema())


def test_class_names_follow_labels_and_nulls():
    labels = pa.array([2, None, 0], pa.int32())
    assert class_names(labels, ("cat", "dog", "fox")).to_pylist() == ["fox", None, "cat"]
    assert class_names(labels, None).to_pylist() == [None, None, None]
