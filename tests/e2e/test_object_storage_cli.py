"""`spark-cnn classify` on an object store that does not answer: one line, exit status 2, before Spark starts."""

from __future__ import annotations

from spark_cnn.models.digits import DIGITS_FACTORY


def test_a_store_that_does_not_answer_is_one_line_before_spark_starts(spark_cnn, tmp_path):
    result = spark_cnn("classify", "s3://images/in", str(tmp_path / "out"), "--model", DIGITS_FACTORY,
                       "--storage-option", "endpoint=http://127.0.0.1:1",
                       "--storage-option", "region=us-east-1,anonymous=true")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr  # no JVM was started: no Spark log, no Py4J trace
    assert lines[0].startswith("spark-cnn classify: error: s3://images/in: cannot reach the storage endpoint (")
    assert lines[0].endswith("; set AWS_ENDPOINT_URL or --storage-option endpoint=http://HOST:PORT")
    assert not (tmp_path / "out").exists()
