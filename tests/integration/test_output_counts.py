"""The counts a job observes while it writes (spark/output_counts.py), on a real Spark session."""

from __future__ import annotations

from py4j import java_gateway

from spark_cnn.spark.output_counts import count_columns

# Class names as users' label files have them: quotes, backslashes, commas, non-ASCII, a JSON-looking one.
NAMES = ["cat", "it's", 'say "hi"', "back\\slash", "a,b", "café", "[1]", "0"]


def test_labelled_and_correct_count_class_names_exactly_whatever_their_characters(spark):
    rows = [("p1", 1, "it's", None, "it's"),         # labelled, correct
            ("p2", 2, 'say "hi"', None, "back\\slash"),  # labelled, wrong
            ("p3", 3, "café", None, "not a class"),   # not labelled
            ("p4", 4, "a,b", None, None),             # no true label
            ("p5", 5, "[1]", "bad image", "[1]"),     # an error row: not ok, so neither
            ("p6", 0, "0", None, "0")]                # labelled, correct
    frame = spark.createDataFrame(rows, "path string, label int, label_name string, error string, true_label string")
    totals = frame.agg(*count_columns(frame.columns, NAMES)).first().asDict()
    assert totals == {"images": 6, "ok": 5, "labelled": 3, "correct": 2}


def test_without_class_names_true_labels_are_class_indices(spark):
    rows = [("p1", 3, None, "3"),      # labelled, correct
            ("p2", 3, None, "4"),      # labelled, wrong
            ("p3", 3, None, "cat"),    # not an index: not labelled
            ("p4", 3, "bad", "3"),     # an error row
            ("p5", 12, None, "12")]    # labelled, correct
    frame = spark.createDataFrame(rows, "path string, label int, error string, true_label string")
    totals = frame.agg(*count_columns(frame.columns, None)).first().asDict()
    assert totals == {"images": 5, "ok": 4, "labelled": 3, "correct": 2}


def test_a_thousand_class_names_cost_a_handful_of_py4j_calls(spark):
    """`isin` over ImageNet's 1,000 names made ~4,000 py4j calls, and the aggregates built from `functions` ~190
    more: the JVM's CPU on every job."""
    calls = [0]
    send = java_gateway.GatewayClient.send_command

    def counting(self, *args, **kwargs):
        calls[0] += 1
        return send(self, *args, **kwargs)

    java_gateway.GatewayClient.send_command = counting
    try:
        count_columns(["path", "label", "label_name", "error", "true_label"], [f"class {i}" for i in range(1000)])
    finally:
        java_gateway.GatewayClient.send_command = send
    assert calls[0] < 30, calls[0]
