"""The flags, preset keys, spark.cnn.* keys and docs/options.md are generated from the option declarations."""

from __future__ import annotations

import argparse

import pytest

from spark_cnn.cli import build_parser, options_doc, resolution
from spark_cnn.cli.flags import help_text
from spark_cnn.errors import ConfigError

COMMANDS = tuple(options_doc.COMMAND_TABLES)


def _parsers() -> dict:
    return build_parser()._subparsers._group_actions[0].choices  # argparse has no public walk


def _actions(command: str) -> dict[str, argparse.Action]:
    return {action.dest: action for action in _parsers()[command]._actions if action.dest != "help"}


@pytest.mark.parametrize("command", COMMANDS)
def test_every_declared_option_is_a_flag_with_its_default_and_choices(command):
    table = options_doc.COMMAND_TABLES[command]()
    actions = _actions(command)
    assert set(actions) == {name for name, option in table.items() if option.flag or option.positional}
    for name, option in table.items():
        if name not in actions:
            continue
        action = actions[name]
        assert action.default is argparse.SUPPRESS  # the resolver fills defaults, after the preset and conf
        assert action.help == help_text(option)
        if option.flag:
            assert option.flag in action.option_strings
            assert tuple(action.choices or ()) == (option.choices or ())
            if option.shown_default is not None:
                assert f"(default: {option.shown_default})" in action.help.replace("%%", "%")


@pytest.mark.parametrize("command", COMMANDS)
def test_every_option_has_a_preset_key_and_a_conf_key_checked_like_its_flag(command):
    table = options_doc.COMMAND_TABLES[command]()
    for option in table.values():
        if not option.choices:
            continue
        value = option.choices[-1]
        assert resolution.resolve(table, flags={}, preset={option.preset_key: value})[option.name] == value
        assert resolution.resolve(table, flags={}, spark_conf={option.conf_key: str(value)})[option.name] == value
        with pytest.raises(ConfigError) as info:
            resolution.resolve(table, flags={}, preset={option.preset_key: "no-such-choice"})
        assert "\n" not in str(info.value) and option.preset_key in str(info.value)


@pytest.mark.parametrize("argv, message", [
    (["classify", "in", "out", "--decode", "cpu"], "argument --decode: invalid choice: 'cpu'"),
    (["classify", "in", "out", "--batch-size", "many"], "argument --batch-size: many: expected auto or a positive"),
    (["etl", "in", "out", "--max-bytes-per-trigger", "lots"], "argument --max-bytes-per-trigger: 'lots' is not a size"),
    (["to-petastorm", "in", "out", "--codec", "gif"], "argument --codec: invalid choice: 'gif'")])
def test_a_bad_flag_value_is_refused_in_one_line(argv, message, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(argv)
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert message in error


def test_a_default_is_declared_once_and_shown_from_there():
    from spark_cnn.imaging.limits import DEFAULT_MAX_FILE_BYTES
    from spark_cnn.task.run_options import DEFAULT_DECODE_PLACE

    for command in ("classify", "to-petastorm"):
        table = options_doc.COMMAND_TABLES[command]()
        assert table["max_file_bytes"].default == DEFAULT_MAX_FILE_BYTES
    assert options_doc.COMMAND_TABLES["classify"]()["decode"].default == DEFAULT_DECODE_PLACE
    assert options_doc.COMMAND_TABLES["detect"]()["model"].default != options_doc.COMMAND_TABLES["classify"]()[
        "model"].default


def test_to_petastorm_takes_presets_and_spark_conf(tmp_path):
    from spark_cnn.cli.run import resolve_preset
    from spark_cnn.cli.to_petastorm import config_from

    path = tmp_path / "p.yaml"
    path.write_text("job: to-petastorm\ninput: /in\noutput: /out\ncodec: jpeg\n")
    job, values = resolve_preset(str(path), ["--jpeg-quality", "70"],
                                 {"spark.cnn.rowGroupMb": "8", "spark.cnn.batchSize": "32"})
    config = config_from(values)
    assert job == "to-petastorm" and (config.codec, config.jpeg_quality, config.row_group_mb) == ("jpeg", 70, 8)


def test_the_options_doc_is_current():
    with open(options_doc.DOC_PATH, encoding="utf-8") as f:
        assert f.read() == options_doc.render(), "run: python -m spark_cnn.cli.options_doc --write"
