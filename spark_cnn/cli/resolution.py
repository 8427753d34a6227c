"""Where a job's options come from, in one order: flags over preset over Spark conf (`spark.cnn.*`) over defaults.

Pure: no files, no Spark. The options are the declared fields of a command's config dataclasses
(`spark_cnn.options.option`), nested ones included (ClassifyConfig.inference, .inputs) under flat names:
`--batch-size` fills ClassifyConfig.inference.batch_size. An option declared in a config dataclass is therefore a
flag (cli/flags.py), a preset key and a spark.cnn.* key without edits here.

Names, for the option `batch_size`:
  flag           --batch-size 32
  preset (YAML)  batch-size: 32      (batch_size: 32 is accepted too)
  Spark conf     spark.cnn.batchSize=32   (camelCase of the name, as Spark's own keys are spelled)

A key that names no option, in a preset or under `spark.cnn.`, is an error that names it and the valid ones.

>>> from spark_cnn.config import ClassifyConfig
>>> table = option_table(ClassifyConfig, command="classify")
>>> resolve(table, flags={}, preset={"batch-size": 64}, spark_conf={"spark.cnn.batchSize": "16"})["batch_size"]
64
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from spark_cnn.errors import ConfigError
from spark_cnn.options import NESTED, VIA, Declared, declaration, option_name

SPARK_CONF_PREFIX = "spark.cnn."
_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")
# argparse bookkeeping in a parsed Namespace that is not an option.
NOT_OPTIONS = frozenset({"run", "command", "help"})


@dataclass(frozen=True)
class Option:
    """One job option of one command, whichever way it is given: its declaration, resolved for that command."""

    name: str  # dataclass field's flat name, e.g. batch_size (the argparse dest)
    default: Any = None
    convert: Callable[[str], Any] | None = None  # text -> value; None keeps the text
    choices: tuple | None = None
    switch: bool = False  # takes no value on the command line (--x, or --x/--no-x): true or false elsewhere
    flag: str | None = None  # --batch-size; None for a positional or an option without a flag in this command
    help: str = ""
    metavar: str | None = None
    group: str = "run"
    negatable: bool = False  # a switch that may be unset (None): --x/--no-x
    repeatable: bool = False
    default_text: str | None = None
    positional: bool = False  # INPUT, OUTPUT
    reaches: str | None = None  # where the value is read (spark_cnn.options.READERS)
    example: str | None = None  # a non-default value as typed after the flag

    @property
    def preset_key(self) -> str:
        return self.name.replace("_", "-")

    @property
    def conf_key(self) -> str:
        head, *rest = self.name.split("_")
        return SPARK_CONF_PREFIX + head + "".join(part[:1].upper() + part[1:] for part in rest)

    @property
    def shown_default(self) -> str | None:
        """The default as --help and the docs show it; None when there is none to show."""
        if self.default_text is not None:
            return self.default_text
        if self.default in (None, False, "", ()) or self.positional:
            return None
        return f"{self.default:g}" if isinstance(self.default, float) else str(self.default)


def option_table(*configs: type, command: str) -> dict[str, Option]:
    """Every declared option of the `configs` dataclasses (nested ones included, under their flat names) that
    `command` has: with a flag where the declaration gives `command` one."""
    table: dict[str, Option] = {}
    for config in configs:
        for name, leaf in config_fields(config).items():
            spec = declaration(leaf.field)
            if spec is None or name in table:
                continue
            has_flag = spec.commands is None or command in spec.commands
            if spec.command_only and not has_flag:
                continue  # set by the command that has it, not a preset key or spark.cnn.* key elsewhere
            table[name] = _option(name, leaf, spec, command=command, has_flag=has_flag)
    return table


def _option(name: str, leaf: ConfigField, spec: Declared, *, command: str, has_flag: bool) -> Option:
    kind = _scalar_type(leaf.hint)
    positional = leaf.field.default is dataclasses.MISSING
    default = None if positional else dict(spec.default_for).get(command, leaf.field.default)
    convert = spec.parse or (kind if kind in (int, float) else None)
    return Option(name=name, default=default, convert=convert, choices=spec.choices, switch=kind is bool,
                  flag=None if positional or not has_flag else spec.flag or "--" + name.replace("_", "-"),
                  help=spec.help, metavar=spec.metavar, group=spec.group,
                  negatable=kind is bool and type(None) in typing.get_args(leaf.hint), repeatable=spec.repeatable,
                  default_text=spec.default_text, positional=positional, example=spec.example,
                  reaches=dict(spec.reaches_for).get(command, spec.reaches))


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
            kind = field.metadata.get(VIA) or hints[field.name]
            inner = {name: dataclasses.replace(leaf, path=(field.name, *leaf.path))
                     for name, leaf in config_fields(kind).items()}
        else:
            inner = {option_name(field): ConfigField((field.name,), field, hints[field.name])}
        clash = set(inner) & set(found)
        if clash:  # one flat name must mean one field, or a flag would fill two places
            raise TypeError(f"{config.__name__}: option name(s) {sorted(clash)} name two fields")
        found.update(inner)
    return found


def build(config: type, values: Mapping[str, Any]) -> Any:
    """`config` from flat option values: each field takes the value of its flat name, NESTED fields are built the
    same way (a VIA field from its options dataclass's `value()`). A name that is absent or None leaves the field's
    default.

    >>> from spark_cnn.config import ClassifyConfig
    >>> build(ClassifyConfig, {"input": "in", "output": "out", "model": "resnet18", "crop": 200,
    ...                        "batch_size": 8, "input_format": "images"}).inference.batch_size
    8
    """
    hints = typing.get_type_hints(config)
    kwargs = {}
    for field in dataclasses.fields(config):
        if not field.init:
            continue
        if field.metadata.get(NESTED):
            via = field.metadata.get(VIA)
            kwargs[field.name] = build(via, values).value() if via else build(hints[field.name], values)
        elif values.get(name := option_name(field)) is not None:
            kwargs[field.name] = values[name]
    return config(**kwargs)


def given(namespace: argparse.Namespace) -> dict[str, Any]:
    """The options given in a namespace parsed by a parser of `cli.flags.add_options` (defaults are left out)."""
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


def _scalar_type(hint: Any) -> type | None:
    """int for `int`, `int | None`, ...; None when the field is not a plain scalar."""
    candidates = [t for t in typing.get_args(hint) or (hint,) if t is not type(None)]
    for kind in (bool, int, float, str):
        if kind in candidates:
            return kind
    return None
