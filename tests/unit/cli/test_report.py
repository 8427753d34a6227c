"""The short table a person reads at the end of a classify or ETL run."""

from __future__ import annotations

from spark_cnn.cli import classify, etl

SIDECARS = [{"executor": "0", "host": "127.0.0.1", "pid": 4242, "device": "cpu", "requests": 12, "batches": 5,
             "mean_batch_size": 19.2},
            {"executor": "1", "host": "127.0.0.1", "pid": 77, "device": "cuda:0", "requests": 3, "batches": 1,
             "mean_batch_size": 48.0}]
SUMMARY = {"images": 100, "errors": 2, "images_per_s": 45.5, "elapsed_s": 2.2, "batch_size": 32, "accuracy": 0.97,
           "sidecars": SIDECARS, "output": "file:///data/out"}


def _field(text: str, name: str) -> str:
    return next(line[12:] for line in text.splitlines() if line.startswith(name.ljust(12)))


def test_classify_report_has_totals_one_line_per_sidecar_and_the_output():
    text = classify.report(SUMMARY)
    assert (_field(text, "images"), _field(text, "errors"), _field(text, "batch size")) == ("100", "2", "32")
    assert _field(text, "images/s") == "45.5  (2.2 s)" and _field(text, "output") == "file:///data/out"
    assert _field(text, "sidecars") == "2"
    header, first, second = [line.split() for line in text.splitlines() if line.startswith("  ")]
    assert header[:6] == ["executor", "host", "pid", "device", "requests", "batches"]
    assert first == ["0", "127.0.0.1", "4242", "cpu", "12", "5", "19.2"]
    assert second == ["1", "127.0.0.1", "77", "cuda:0", "3", "1", "48.0"]


def test_sidecar_columns_line_up():
    lines = classify.sidecar_table(SIDECARS)
    assert len({line.index(" 12 ") if " 12 " in line else line.index(" 3 ") for line in lines[1:]}) == 1
    assert classify.sidecar_table([]) == []


def test_report_without_a_rate_or_accuracy():
    text = classify.report({**SUMMARY, "images": 0, "images_per_s": None, "accuracy": None, "sidecars": [],
                            "batch_size": None})
    assert _field(text, "images/s").startswith("n/a") and _field(text, "accuracy") == "n/a"
    assert _field(text, "batch size") == "auto" and _field(text, "sidecars") == "0"


def test_etl_report_names_the_batches_and_the_checkpoint():
    summary = {**SUMMARY, "micro_batches": [{"batch": 4}, {"batch": 5}], "checkpoint": "file:///data/ck"}
    text = etl.report(summary)
    assert _field(text, "new images") == "100" and _field(text, "batches") == "2 (4, 5)"
    assert _field(text, "checkpoint") == "file:///data/ck"
    assert _field(etl.report({**summary, "micro_batches": [], "images": 0}), "batches") == "0"


def test_a_sidecar_whose_batches_disagreed_with_the_profile_says_so_after_the_table():
    from spark_cnn.sidecar.prediction_check import PredictionCheck

    check = PredictionCheck({8: 40.0}, window=2, sustained=1)
    check.observe(8, 20.0), check.observe(8, 21.0)
    agreeing = {**SIDECARS[1], "prediction": PredictionCheck({8: 40.0}).summary()}
    lines = classify.sidecar_table([{**SIDECARS[0], "prediction": {**check.summary(), "action": "marked stale"}},
                                    agreeing])
    assert len(lines) == 4 and lines[-1].startswith("  executor 0: batches ran 1.9") and "marked stale" in lines[-1]


def test_etl_report_counts_the_isolated_files_only_when_there_are_some():
    summary = {**SUMMARY, "micro_batches": [{"batch": 4}], "checkpoint": "file:///data/ck"}
    assert "isolated" not in etl.report({**summary, "isolated": []})
    assert _field(etl.report({**summary, "isolated": ["file:/in/bad.png"]}), "isolated").startswith("1  (")
