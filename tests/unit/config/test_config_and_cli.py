"""ClassifyConfig validation, CLI flags -> config, and the sidecar stats accumulator."""

from __future__ import annotations

import copy

import pytest

from spark_cnn.cli import build_parser
from spark_cnn.cli.classify import classify_config
from spark_cnn.config import DEFAULT_REQUEST_ROWS, ClassifyConfig, InferenceOptions, parse_batch_size
from spark_cnn.errors import ConfigError
from spark_cnn.imaging.limits import DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS, DecodeOptions
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark.accumulators import SidecarStatsParam
from spark_cnn.task.client import sidecar_key


def _config(**changes) -> ClassifyConfig:
    """A valid ClassifyConfig with `changes`: paths at the top, the rest InferenceOptions fields."""
    paths = {k: changes.pop(k) for k in ("input", "output") if k in changes}
    return ClassifyConfig(**{"input": "in", "output": "out", **paths},
                          inference=InferenceOptions(ModelSpec("resnet18"), **changes))


def _parse(*flags: str) -> ClassifyConfig:
    return classify_config(build_parser().parse_args(["classify", "imgs/", "out.parquet", *flags]))


# --- ClassifyConfig -------------------------------------------------------------------------------------------

def test_defaults_are_valid():
    options = _config().inference
    assert (options.device, options.on_error, options.batch_size, options.top_k) == ("auto", "record", None, None)
    assert options.request_rows == DEFAULT_REQUEST_ROWS


@pytest.mark.parametrize("device", ["auto", "cpu", "cuda", "cuda:0", "cuda:12"])
def test_valid_devices(device):
    assert _config(device=device).inference.device == device


@pytest.mark.parametrize("changes, flag", [
    ({"device": "gpu"}, "--device gpu"),
    ({"device": "cuda:"}, "--device cuda:"),
    ({"device": "CPU"}, "--device CPU"),
    ({"device": "cuda:0 "}, "--device cuda:0 "),
    ({"on_error": "skip"}, "--on-error skip"),
    ({"batch_size": 0}, "--batch-size 0"),
    ({"batch_size": -8}, "--batch-size -8"),
    ({"top_k": 0}, "--top-k 0"),
    ({"input": ""}, "INPUT is empty"),
    ({"output": ""}, "OUTPUT is empty"),
    ({"request_rows": 0}, "request rows"),
    ({"max_in_flight": 0}, "requests in flight"),
    ({"idle_timeout_s": 0.0}, "idle timeout"),
    ({"max_pixels": 0}, "--max-pixels 0"),
    ({"max_pixels": 10**12}, "--max-pixels 1000000000000"),
    ({"max_file_bytes": 0}, "--max-file-bytes 0"),
])
def test_invalid_config_names_the_flag(changes, flag):
    with pytest.raises(ConfigError) as info:
        _config(**changes)
    assert flag in str(info.value)


def test_config_is_frozen():
    config = _config()
    with pytest.raises(AttributeError):
        config.quiet = True
    with pytest.raises(AttributeError):
        config.inference.device = "cpu"


@pytest.mark.parametrize("text, value", [("auto", None), ("1", 1), ("256", 256), ("0", 0)])
def test_parse_batch_size(text, value):
    assert parse_batch_size(text) == value


@pytest.mark.parametrize("text", ["", "big", "1.5", "Auto"])
def test_parse_batch_size_refuses_non_integers(text):
    with pytest.raises(ConfigError, match=f"--batch-size {text}: expected auto or a positive integer"):
        parse_batch_size(text)


# --- CLI flags -> ClassifyConfig ------------------------------------------------------------------------------

def test_cli_defaults():
    config = _parse()
    options = config.inference
    assert (config.input, config.output) == ("imgs/", "out.parquet")
    assert options.model == ModelSpec("resnet50")
    assert options.model.preprocessing is None  # the model's own, decided when it is resolved
    assert options.batch_size is None
    assert (options.device, options.on_error) == ("auto", "record")
    assert not (options.logits or options.embeddings or config.overwrite or config.quiet)
    assert options.decode_options == DecodeOptions()  # the documented guard-rail defaults
    assert (options.max_pixels, options.max_file_bytes) == (DEFAULT_MAX_PIXELS, DEFAULT_MAX_FILE_BYTES)


def test_cli_maps_every_flag(tmp_path):
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"not read here")
    config = _parse("--model", "mobilenet_v3_small", "--weights", str(weights), "--labels", "labels.txt",
                    "--top-k", "3", "--master", "local[2]", "--batch-size", "64", "--device", "cuda:1",
                    "--on-error", "fail", "--logits", "--embeddings", "--summary", "s.json", "--overwrite",
                    "--quiet", "--max-pixels", "1000000", "--max-file-bytes", "2048")
    options = config.inference
    assert options.model == ModelSpec("mobilenet_v3_small", weights=str(weights))
    assert (options.labels, options.top_k, config.master, options.batch_size) == ("labels.txt", 3, "local[2]", 64)
    assert (options.device, options.on_error, config.summary) == ("cuda:1", "fail", "s.json")
    assert options.logits and options.embeddings and config.overwrite and config.quiet
    assert options.decode_options == DecodeOptions(max_pixels=1_000_000, max_file_bytes=2048)


def test_cli_preprocessing_flags_are_overrides_only():
    assert _parse().inference.model.preprocessing is None
    assert _parse("--crop", "32").inference.model.preprocessing == {"crop": 32}
    assert _parse("--resize", "40", "--crop", "32").inference.model.preprocessing == {"resize": 40, "crop": 32}


def test_cli_overrides_apply_over_the_default_preprocessing():
    spec = _parse("--mean", "0.5,0.5,0.5", "--std", "0.25,0.5,1").inference.model
    assert spec.preprocessing_over(Preprocessing()) == Preprocessing(mean=(0.5, 0.5, 0.5), std=(0.25, 0.5, 1.0))
    assert spec.preprocessing_over(DIGITS_PREPROCESSING).crop == 32


@pytest.mark.parametrize("flags, message", [
    (("--mean", "0.5,0.5"), "three values"),
    (("--std", "0.5,0,0.5"), "std values must be positive"),
    (("--batch-size", "0"), "--batch-size 0"),
    (("--device", "tpu"), "--device tpu"),
    (("--max-pixels", "-1"), "--max-pixels -1: expected a positive integer"),
    (("--max-file-bytes", "0"), "--max-file-bytes 0: expected a positive integer"),
])
def test_cli_bad_values_are_config_errors(flags, message):
    with pytest.raises(ConfigError, match=message):
        _parse(*flags)


def test_cli_weights_must_exist(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        _parse("--weights", str(tmp_path / "missing.pth"))


def test_cli_refuses_a_batch_size_that_is_not_one_in_one_line(capsys):
    with pytest.raises(SystemExit):
        _parse("--batch-size", "lots")
    assert "argument --batch-size: lots: expected auto or a positive integer" in capsys.readouterr().err


def test_cli_rejects_an_unknown_on_error_choice(capsys):
    with pytest.raises(SystemExit):
        _parse("--on-error", "ignore")
    assert "invalid choice: 'ignore'" in capsys.readouterr().err


def test_cli_partial_override_keeps_the_models_declared_preprocessing():
    from spark_cnn.models.resolve import resolve_endpoint

    config = _parse("--model", DIGITS_FACTORY, "--mean", "0.5,0.5,0.5")
    assert resolve_endpoint(config.inference.model).endpoint.preprocessing == DIGITS_PREPROCESSING


# --- SidecarStatsParam ----------------------------------------------------------------------------------------

def _snapshot(pid: int, requests: int, rows: int) -> dict:
    return {"host": "node-1", "pid": pid, "requests": requests, "rows": rows}


def test_stats_zero_is_empty():
    assert SidecarStatsParam().zero({"a": _snapshot(1, 1, 1)}) == {}


def test_stats_merge_keeps_the_snapshot_with_more_requests():
    param = SidecarStatsParam()
    old, new = _snapshot(10, 3, 48), _snapshot(10, 7, 112)
    key = sidecar_key(old)
    assert key == "node-1:10"

    assert param.addInPlace({key: old}, {key: new}) == {key: new}
    assert param.addInPlace({key: new}, {key: old}) == {key: new}  # a stale snapshot arriving late loses


def test_stats_merge_keeps_every_sidecar():
    param = SidecarStatsParam()
    a, b = _snapshot(10, 3, 48), _snapshot(11, 1, 16)
    merged = param.addInPlace(param.zero({}), {sidecar_key(a): a})
    merged = param.addInPlace(merged, {sidecar_key(b): b})
    assert merged == {"node-1:10": a, "node-1:11": b}


def test_stats_merge_is_idempotent():
    param = SidecarStatsParam()
    update = {"node-1:10": _snapshot(10, 5, 80), "node-2:4": _snapshot(4, 2, 32)}
    once = param.addInPlace({}, copy.deepcopy(update))
    twice = param.addInPlace(copy.deepcopy(once), copy.deepcopy(update))  # a retried task adds it again
    assert once == twice == update
