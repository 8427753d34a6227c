"""--storage-option: repeatable on the command line, a mapping in a preset, k=v,k=v under spark.cnn.storageOptions."""

from __future__ import annotations

import re

import pytest

from spark_cnn.cli import build_parser, classify, resolution
from spark_cnn.errors import ConfigError

ARGV = ["classify", "s3://bucket/in", "out/", "--model", "resnet18"]


def _inputs(argv=(), preset=None, conf=None):
    args = build_parser().parse_args([*ARGV, *argv])
    return classify.classify_config(args, preset=preset, spark_conf=conf).inputs


def test_flags_add_up_and_win_over_preset_and_conf():
    inputs = _inputs(["--storage-option", "endpoint=http://127.0.0.1:9000", "--storage-option", "region=eu-west-1"],
                     preset={"storage-options": {"anonymous": True}})
    assert inputs.storage_options == (("endpoint", "http://127.0.0.1:9000"), ("region", "eu-west-1"))
    assert _inputs(preset={"storage-options": {"anonymous": True, "region": "eu-west-1"}}).storage_options == \
        (("anonymous", "true"), ("region", "eu-west-1"))
    assert _inputs(conf={"spark.cnn.storageOptions": "endpoint=http://minio:9000,anonymous=true"}).storage_options \
        == (("anonymous", "true"), ("endpoint", "http://minio:9000"))
    assert _inputs().storage_options == ()


def test_bad_pairs_are_refused_where_they_were_given(capsys):
    with pytest.raises(ConfigError, match="spark.cnn.storageOptions: 'colour=blue' is not a valid value .*unknown key"):
        _inputs(conf={"spark.cnn.storageOptions": "colour=blue"})
    for argv, message in ((["--storage-option", "endpoint"], "--storage-option: endpoint: expected KEY=VALUE"),
                          (["--storage-option", "region=a", "--storage-option", "region=b"],
                           r"--storage-option: \['region'\] given twice")):
        with pytest.raises(SystemExit):
            build_parser().parse_args([*ARGV, *argv])
        assert re.search(message, capsys.readouterr().err)
    table = classify.option_table()
    with pytest.raises(ConfigError, match="expected a single value"):  # only the pairs option takes a mapping
        resolution.convert(table["glob"], {"a": "b"}, where="preset: glob")
