"""Option resolution (flags > preset > spark.cnn.* > defaults), presets, Spark properties, ETL source-log reading."""

from __future__ import annotations

import argparse

import pytest

from spark_cnn.cli import build_parser, classify, etl
from spark_cnn.cli.presets import load_preset, parse_preset
from spark_cnn.cli.resolution import Option, given, option_table, resolve
from spark_cnn.cli.run import resolve_preset
from spark_cnn.config import DEFAULT_MAX_FILES_PER_TRIGGER, DEFAULT_REQUEST_ROWS
from spark_cnn.errors import ConfigError, InputError
from spark_cnn.spark.conf import parse_properties
from spark_cnn.spark.etl_job import run_summary
from spark_cnn.spark.etl_log import hadoop_path, source_log_file, source_log_paths, source_offset


def _classify_flags(*flags: str) -> dict:
    return given(build_parser().parse_args(["classify", "in", "out", *flags]))


def _resolve(*flags: str, preset=None, conf=None) -> dict:
    return resolve(classify.option_table(), flags=_classify_flags(*flags), preset=preset, spark_conf=conf)


# --- the table is derived, not listed ---------------------------------------------------------------------------

def test_every_declared_classify_field_is_an_option():
    table = classify.option_table()
    assert {"input", "output", "request_rows", "max_in_flight", "idle_timeout_s"} <= set(table)
    assert table["request_rows"].default == DEFAULT_REQUEST_ROWS and table["request_rows"].convert is int
    assert table["idle_timeout_s"].convert is float
    assert table["request_rows"].flag is None  # declared without a flag: a preset and spark.cnn.* key only


def test_an_option_declared_in_a_config_is_known_everywhere():
    from dataclasses import dataclass

    from spark_cnn.cli.flags import add_options
    from spark_cnn.options import option

    @dataclass(frozen=True)
    class Config:
        max_pixels: int = option(10, help="pixels")

    table = option_table(Config, command="x")
    assert table["max_pixels"].default == 10
    values = resolve(table, flags={}, preset={"max-pixels": "20"}, spark_conf={"spark.cnn.maxPixels": "30"})
    assert values["max_pixels"] == 20
    assert resolve(table, flags={}, spark_conf={"spark.cnn.maxPixels": "30"})["max_pixels"] == 30
    parser = argparse.ArgumentParser()
    add_options(parser, table)
    assert resolve(table, flags=given(parser.parse_args(["--max-pixels", "5"])), preset={"max_pixels": 7})[
        "max_pixels"] == 5
    assert "pixels (default: 10)" in parser.format_help()


def test_etl_options_are_the_classify_ones_plus_its_own():
    table = etl.option_table()
    assert set(classify.option_table()) < set(table)
    assert {"checkpoint", "max_files_per_trigger"} <= set(table)
    assert "classify" not in table  # the nested ClassifyConfig is not a value one can write
    assert table["max_files_per_trigger"].default == DEFAULT_MAX_FILES_PER_TRIGGER


@pytest.mark.parametrize("name, conf_key, preset_key", [
    ("batch_size", "spark.cnn.batchSize", "batch-size"), ("top_k", "spark.cnn.topK", "top-k"),
    ("device", "spark.cnn.device", "device"), ("idle_timeout_s", "spark.cnn.idleTimeoutS", "idle-timeout-s")])
def test_names(name, conf_key, preset_key):
    assert (Option(name).conf_key, Option(name).preset_key) == (conf_key, preset_key)


# --- the order ----------------------------------------------------------------------------------------------

def test_defaults_when_nothing_is_given():
    values = _resolve()
    assert (values["batch_size"], values["device"], values["top_k"], values["quiet"]) == (None, "auto", None, False)


def test_flags_over_preset_over_spark_conf_over_defaults():
    conf = {"spark.cnn.batchSize": "16", "spark.cnn.device": "cpu", "spark.cnn.topK": "2", "spark.app.name": "x"}
    preset = {"batch-size": 64, "device": "cuda"}
    values = _resolve("--batch-size", "8", preset=preset, conf=conf)
    assert values["batch_size"] == 8  # flag
    assert values["device"] == "cuda"  # preset over Spark conf
    assert values["top_k"] == 2  # Spark conf over default, converted like the flag
    assert values["precision"] == "auto"  # default


def test_a_flag_equal_to_the_default_still_wins_over_the_preset():
    assert _resolve("--device", "auto", preset={"device": "cuda"})["device"] == "auto"


def test_config_from_resolved_values_builds_the_same_config_as_flags():
    flags = ("--model", "mobilenet_v3_small", "--top-k", "3", "--batch-size", "32", "--crop", "200", "--logits")
    preset = {"model": "mobilenet_v3_small", "top-k": 3, "batch-size": 32, "crop": 200, "logits": True}
    from_flags = classify.config_from(_resolve(*flags))
    from_preset = classify.config_from(resolve(classify.option_table(), flags={"input": "in", "output": "out"},
                                               preset=preset))
    assert from_flags == from_preset
    assert from_flags.inference.batch_size == 32 and from_flags.inference.model.preprocessing == {"crop": 200}


# --- values from presets and Spark conf are checked like flags -------------------------------------------------

@pytest.mark.parametrize("name, preset, conf, value", [
    ("logits", {"logits": "yes"}, None, True), ("logits", {"logits": False}, None, False),
    ("logits", None, {"spark.cnn.logits": "true"}, True), ("mean", {"mean": [0.5, 0.5, 0.5]}, None, (0.5, 0.5, 0.5)),
    ("mean", None, {"spark.cnn.mean": "0.1,0.2,0.3"}, (0.1, 0.2, 0.3)),
    ("channels_last", {"channels-last": False}, None, False), ("labels", {"labels": None}, None, None),
    ("request_rows", None, {"spark.cnn.requestRows": "8"}, 8), ("batch_size", {"batch_size": 32}, None, 32),
    ("batch_size", None, {"spark.cnn.batchSize": "auto"}, None)])
def test_values_are_converted(name, preset, conf, value):
    assert _resolve(preset=preset, conf=conf)[name] == value


@pytest.mark.parametrize("preset, conf, message", [
    ({"top-k": "many"}, None, "preset: top-k: 'many' is not a valid value"),
    ({"on-error": "skip"}, None, "'skip' is not one of record, fail"),
    (None, {"spark.cnn.precision": "fp64"}, "spark.cnn.precision: 'fp64' is not one of"),
    ({"quiet": "sometimes"}, None, "expected true or false"),
    ({"model": {"name": "x"}}, None, "expected a single value")])
def test_bad_values_name_where_they_came_from(preset, conf, message):
    with pytest.raises(ConfigError, match=message):
        _resolve(preset=preset, conf=conf)


def test_an_unknown_preset_key_is_an_error_listing_the_valid_ones():
    with pytest.raises(ConfigError) as info:
        _resolve(preset={"batchsize": 8})
    text = str(info.value)
    assert "unknown key 'batchsize' in preset" in text and "batch-size" in text and "top-k" in text


def test_an_unknown_spark_cnn_key_is_an_error_other_spark_keys_are_not():
    with pytest.raises(ConfigError) as info:
        _resolve(conf={"spark.cnn.batch_size": "8"})
    assert "unknown Spark conf key spark.cnn.batch_size" in str(info.value)
    assert "spark.cnn.batchSize" in str(info.value)
    assert _resolve(conf={"spark.executor.memory": "2g"})["batch_size"] is None


def test_bad_final_values_are_still_rejected_by_the_config():
    with pytest.raises(ConfigError, match="--device tpu"):
        classify.config_from(_resolve(conf={"spark.cnn.device": "tpu"}))


# --- presets and `spark-cnn run` --------------------------------------------------------------------------------

def _preset(tmp_path, text: str) -> str:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return str(path)


def test_run_resolves_a_preset_with_overrides(tmp_path):
    path = _preset(tmp_path, "job: etl\ninput: /in\noutput: /out\ncheckpoint: /ck\nbatch-size: 16\ntop-k: 3\n")
    job, values = resolve_preset(path, ["--top-k", "1", "--max-files-per-trigger", "50"], {"spark.cnn.topK": "2"})
    assert job == "etl"
    assert (values["input"], values["checkpoint"], values["batch_size"], values["top_k"]) == ("/in", "/ck", 16, 1)
    assert etl.etl_config(values).max_files_per_trigger == 50


def test_run_takes_input_and_output_after_the_preset(tmp_path):
    path = _preset(tmp_path, "job: classify\nmodel: resnet18\n")
    _, values = resolve_preset(path, ["/a", "/b", "--device", "cpu"], None)
    assert (values["input"], values["output"], values["model"], values["device"]) == ("/a", "/b", "resnet18", "cpu")
    with pytest.raises(ConfigError, match="gives no INPUT or OUTPUT"):
        resolve_preset(path, [], None)


@pytest.mark.parametrize("text, message", [
    ("job: train\n", "unknown job 'train'; valid jobs: classify, detect, etl, segment, to-petastorm"),
    ("model: resnet50\n", "needs `job: NAME`"),
    ("- job\n", "expected a mapping"),
    ("job: classify\ninput: [unclosed\n", "not valid YAML"),
    ("job: classify\ninput: /a\noutput: /b\ncheckpoint: /c\n", "unknown key 'checkpoint'"),
    ("job: classify\n!!python/object:os.system x: 1\n", "not valid YAML")])
def test_bad_presets(tmp_path, text, message):
    with pytest.raises(ConfigError, match=message):
        resolve_preset(_preset(tmp_path, text), [], None)


def test_missing_preset_file(tmp_path):
    with pytest.raises(InputError, match="No such file"):
        load_preset(str(tmp_path / "nope.yaml"))


def test_shipped_presets_resolve(tmp_path):
    import glob
    import os

    presets = sorted(glob.glob(os.path.join(os.path.dirname(__file__), "..", "..", "..", "conf", "*.yaml")))
    assert len(presets) >= 2
    for path in presets:
        job, values = resolve_preset(path, [], None)
        assert job in ("classify", "etl") and values["input"] and values["output"]


def test_parse_preset_keeps_options_apart_from_the_job():
    assert parse_preset({"job": "classify", "top-k": 2}, "p") == ("classify", {"top-k": 2})


# --- spark-defaults.conf ---------------------------------------------------------------------------------------

def test_parse_properties():
    text = "# comment\n! also\nspark.cnn.batchSize   32\nspark.cnn.device=cpu\nspark.cnn.topK: 3\n\nspark.x\n"
    assert parse_properties(text) == {"spark.cnn.batchSize": "32", "spark.cnn.device": "cpu", "spark.cnn.topK": "3",
                                      "spark.x": ""}


# --- the ETL's reading of an earlier version's stream source log ------------------------------------------

def test_source_log_file_finds_a_batch_before_and_after_compaction():
    assert source_log_file(["0", "1", ".1.crc"], 1) == "1"
    assert source_log_file(["9.compact", "10", "19.compact", "20"], 3) == "9.compact"
    assert source_log_file(["9.compact", "10", "19.compact", "20"], 12) == "19.compact"
    assert source_log_file(["0"], 5) is None


def test_source_log_paths_are_spelled_as_the_binary_file_source_spells_them():
    text = ('v1\n{"path":"file:///d/a%20b/p%2520c%23d.jpg","timestamp":1,"batchId":4}\n'
            '{"path":"hdfs://nn:8020/x/y.jpg","timestamp":1,"batchId":4}\n'
            '{"path":"file:///d/other.jpg","timestamp":1,"batchId":3}\n')
    assert source_log_paths(text, 4) == ["file:/d/a b/p%20c#d.jpg", "hdfs://nn:8020/x/y.jpg"]
    with pytest.raises(ConfigError, match="not in a format"):
        source_log_paths("{}", 0)


def test_source_offset_is_the_last_line_of_an_offsets_file():
    assert source_offset('v1\n{"batchWatermarkMs":0,"conf":{}}\n{"logOffset":7}\n') == 7
    with pytest.raises(ConfigError, match="offsets log"):
        source_offset("v1\n")


def test_hadoop_path():
    assert hadoop_path("file:///tmp/x.jpg") == "file:/tmp/x.jpg"
    assert hadoop_path("s3a://bucket/a%20b.png") == "s3a://bucket/a b.png"


def test_run_summary_adds_up_the_batches():
    batches = [{"batch": 0, "images": 10, "errors": 1, "elapsed_s": 1.0},
               {"batch": 1, "images": 5, "errors": 0, "elapsed_s": 1.0}]
    sidecars = [{"host": "h", "executor": "1", "batch_size": 8}, {"host": "h", "executor": "0", "batch_size": 16}]
    summary = run_summary(batches, 3.0, None, sidecars)
    assert (summary["images"], summary["ok"], summary["errors"], summary["images_per_s"]) == (15, 14, 1, 5.0)
    assert summary["batch_size"] == 16 and [s["executor"] for s in summary["sidecars"]] == ["0", "1"]
    assert run_summary([], 1.0, None, [])["images_per_s"] is None
