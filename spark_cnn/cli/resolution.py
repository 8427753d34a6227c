"""Where a job's options come from, in one order: flags over preset over Spark conf (`spark.cnn.*`) over defaults.

Pure: no files, no Spark. The set of options is derived, not listed: every optional and positional argument of a
command's argparse parser, plus the fields of its config dataclasses that have no flag (e.g. `request_rows`),
nested ones included (ClassifyConfig.inference, .inputs) under flat names: `--batch-size` fills
ClassifyConfig.inference.batch_size. An option added to the parser or to a config dataclass is therefore known to
presets and to Spark conf without edits here.

Names, for the option behind `--batch-size` (dest `batch_size`):
  flag           --batch-size 32
  preset (YAML)  batch-size: 32      (batch_size: 32 is accepted too)
  Spark conf     spark.cnn.batchSize=32   (camelCase of the dest, as Spark's own keys are spelled)

A key that names no option, in a preset or under `spark.cnn.`, is an error that names it and the valid ones.

>>> import argparse
>>> parser = argparse.ArgumentParser()
>>> _ = parser.add_argument("--batch-size", default="auto")
>>> table = option_table(parser)
>>> resolve(table, flags={}, preset={"batch-size": 64}, spark_conf={"spark.cnn.batchSize": "16"})["batch_size"]
'64'
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_cnn.config import COMMAND_ONLY, NESTED, OPTION_NAME
from spark_cnn.errors import ConfigError

SPARK_CONF_PREFIX = "spark.cnn."
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
# argparse bookkeeping in a parsed Namespace that is not an option.
NOT_OPTIONS = frozenset({"run", "command", "help"})


@dataclass(frozen=True)
class Option:
    """One job option, whichever way it is given."""

    name: str  # argparse dest / dataclass field, e.g. batch_size
    default: Any = None
    convert: Callable[[str], Any] | None = None  # text -> value (argparse `type`); None keeps the text
    choices: tuple | None = None
    switch: bool = False  # takes no value on the command line (store_true, --x/--no-x): true or false elsewhere
    flag: str | None = None  # --batch-size; None for config fields without a flag

    @property
    def preset_key(self) -> str:
        return self.name.replace("_", "-")

    @property
    def conf_key(self) -> str:
        head, *rest = self.name.split("_")
        return SPARK_CONF_PREFIX + head + "".join(part[:1].upper() + part[1:] for part in rest)


def option_table(parser: argparse.ArgumentParser, *configs: type) -> dict[str, Option]:
    """Every option of `parser` (defaults as declared before `flags_only`), then every field of the `configs`
    dataclasses (nested ones included, under their flat names) that the parser does not cover, typed from its
    annotation."""
    table: dict[str, Option] = {}
    for action in parser._actions:  # argparse offers no public walk over its arguments
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)) or action.dest in NOT_OPTIONS:
            continue
        default = _declared_defaults(parser).get(action.dest, action.default)
        table[action.dest] = Option(
            name=action.dest, default=None if default is argparse.SUPPRESS else default, convert=action.type,
            choices=tuple(action.choices) if action.choices else None, switch=action.nargs == 0,
            flag=action.option_strings[-1] if action.option_strings else None)
    for config in configs:
        for name, leaf in config_fields(config).items():
            kind = _scalar_type(leaf.hint)
            if name in table or kind is None or leaf.field.metadata.get(COMMAND_ONLY):
                continue  # covered by a flag, not a value one can write (e.g. the ModelSpec), or the command's
            default = leaf.field.default if leaf.field.default is not dataclasses.MISSING else None
            table[name] = Option(name=name, default=default, switch=kind is bool,
                                 convert=kind if kind in (int, float) else None)
    return table


@dataclass(frozen=True)
class ConfigField:
    """One leaf field of a config dataclass: `path` from the top config (("inference", "batch_size"))."""

    path: tuple[str, ...]
    field: dataclasses.Field
    hint: Any


def config_fields(config: type) -> dict[str, ConfigField]:
    """{flat option name: field} for every init field of `config`, descending into NESTED fields.

    >>> from spark_cnn.config import ClassifyConfig
    >>> config_fields(ClassifyConfig)["batch_size"].path
    ('inference', 'batch_size')
    >>> config_fields(ClassifyConfig)["input_format"].path
    ('inputs', 'format')
    """
    found: dict[str, ConfigField] = {}
    hints = typing.get_type_hints(config)
    for field in dataclasses.fields(config):
        if not field.init:
            continue
        if field.metadata.get(NESTED):
            inner = {name: dataclasses.replace(leaf, path=(field.name, *leaf.path))
                     for name, leaf in config_fields(hints[field.name]).items()}
        else:
            inner = {field.metadata.get(OPTION_NAME, field.name): ConfigField((field.name,), field, hints[field.name])}
        clash = set(inner) & set(found)
        if clash:  # one flat name must mean one field, or a flag would fill two places
            raise TypeError(f"{config.__name__}: option name(s) {sorted(clash)} name two fields")
        found.update(inner)
    return found


def build(config: type, values: Mapping[str, Any]) -> Any:
    """`config` from flat option values: each field takes the value of its flat name, NESTED fields are built the
    same way. A name that is absent or None leaves the field's default.

    >>> from spark_cnn.config import ClassifyConfig
    >>> from spark_cnn.models.spec import ModelSpec
    >>> build(ClassifyConfig, {"input": "in", "output": "out", "model": ModelSpec("resnet18"),
    ...                        "batch_size": 8, "input_format": "images"}).inference.batch_size
    8
    """
    hints = typing.get_type_hints(config)
    kwargs = {}
    for field in dataclasses.fields(config):
        if not field.init:
            continue
        if field.metadata.get(NESTED):
            kwargs[field.name] = build(hints[field.name], values)
        elif values.get(name := field.metadata.get(OPTION_NAME, field.name)) is not None:
            kwargs[field.name] = values[name]
    return config(**kwargs)


def flags_only(parser: argparse.ArgumentParser) -> None:
    """Make `parser` return only the options given on the command line (defaults come from `resolve`).

    The declared defaults are kept aside for `option_table`, so `--help` and the resolver still know them."""
    declared = {}
    for action in parser._actions:
        optional = action.option_strings or action.nargs == argparse.OPTIONAL
        if optional and not isinstance(action, argparse._HelpAction):
            declared[action.dest] = action.default
            action.default = argparse.SUPPRESS
    parser.spark_cnn_defaults = declared


def given(namespace: argparse.Namespace) -> dict[str, Any]:
    """The options in a namespace parsed by a `flags_only` parser."""
    return {k: v for k, v in vars(namespace).items() if k not in NOT_OPTIONS}


def resolve(table: Mapping[str, Option], *, flags: Mapping[str, Any], preset: Mapping[str, Any] | None = None,
            preset_name: str = "preset", spark_conf: Mapping[str, str] | None = None) -> dict[str, Any]:
    """All options of `table`: flags over preset over `spark.cnn.*` entries of `spark_conf` over defaults.

    Preset values may be YAML-typed (64, true, [0.5, 0.5, 0.5]); Spark conf values are text. Both go through the
    option's own conversion and choices, so a preset is checked as strictly as a flag."""
    values = {name: option.default for name, option in table.items()}
    by_conf_key = {option.conf_key: option for option in table.values()}
    for key, text in (spark_conf or {}).items():
        if not key.startswith(SPARK_CONF_PREFIX):
            continue
        option = by_conf_key.get(key)
        if option is None:
            raise ConfigError(f"unknown Spark conf key {key}; valid {SPARK_CONF_PREFIX}* keys: "
                              f"{', '.join(sorted(by_conf_key))}")
        values[option.name] = convert(option, text, where=key)
    by_preset_key = {option.preset_key: option for option in table.values()}
    for key, value in (preset or {}).items():
        option = by_preset_key.get(str(key).replace("_", "-"))
        if option is None:
            raise ConfigError(f"unknown key {key!r} in {preset_name}; valid keys: job, "
                              f"{', '.join(sorted(by_preset_key))}")
        values[option.name] = convert(option, value, where=f"{preset_name}: {key}")
    values.update(flags)  # argparse has converted and checked them already
    return values


def convert(option: Option, value: Any, *, where: str) -> Any:
    """A preset or Spark conf value as the flag would have given it; ConfigError naming `where` if it is not one."""
    if value is None:
        return None
    if option.switch:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in _TRUE or text in _FALSE:
            return text in _TRUE
        raise ConfigError(f"{where}: expected true or false, got {value!r}")
    if isinstance(value, Mapping) and getattr(option.convert, "accepts_mapping", False):  # KEY=VALUE pairs
        text = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        text = ",".join(str(v) for v in value)  # a YAML list stands for the flag's comma-separated value
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, (str, int, float)):
        text = str(value)
    else:
        raise ConfigError(f"{where}: expected a single value, got {value!r}")
    try:
        result = option.convert(text) if option.convert else text
    except (ValueError, TypeError, ConfigError) as e:
        raise ConfigError(f"{where}: {text!r} is not a valid value ({e})") from e
    if option.choices and result not in option.choices:
        raise ConfigError(f"{where}: {text!r} is not one of {', '.join(map(str, option.choices))}")
    return result


def _declared_defaults(parser: argparse.ArgumentParser) -> dict[str, Any]:
    return getattr(parser, "spark_cnn_defaults", {})


def _scalar_type(hint: Any) -> type | None:
    """int for `int`, `int | None`, ...; None when the field is not a plain scalar."""
    candidates = [t for t in typing.get_args(hint) or (hint,) if t is not type(None)]
    for kind in (bool, int, float, str):
        if kind in candidates:
            return kind
    return None
