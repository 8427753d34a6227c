"""A command's flags, generated from its option table (cli/resolution.py), itself read from the declarations in
the config dataclasses: the name, type, default, choices and help of each flag are declared once, there.

The parser returns only the options given on the command line; defaults come from `resolution.resolve`, after the
preset and the spark.cnn.* settings. --help shows each default from the same declaration.

>>> from spark_cnn.cli import resolution
>>> from spark_cnn.config import ClassifyConfig
>>> parser = argparse.ArgumentParser()
>>> add_options(parser, resolution.option_table(ClassifyConfig, command="classify"))
>>> vars(parser.parse_args(["in/", "out/", "--batch-size", "32"]))
{'input': 'in/', 'output': 'out/', 'batch_size': 32}
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping

from spark_cnn.cli.resolution import Option
from spark_cnn.errors import ConfigError
from spark_cnn.options import GROUPS


def add_options(parser: argparse.ArgumentParser, table: Mapping[str, Option], *, from_preset: bool = False) -> None:
    """INPUT and OUTPUT (optional `from_preset`: the preset may give them), then every option of `table` that has a
    flag, in --help groups."""
    for option in table.values():
        if option.positional:
            parser.add_argument(option.name, metavar=option.metavar, help=help_text(option), default=argparse.SUPPRESS,
                                **({"nargs": "?"} if from_preset else {}))
    flagged = [option for option in table.values() if option.flag]
    for group_name in GROUPS:
        members = [option for option in flagged if option.group == group_name]
        group = parser.add_argument_group(group_name) if members else None
        for option in members:
            group.add_argument(option.flag, **_argument(option))


def help_text(option: Option) -> str:
    """The declared help, with the default it shows (argparse formats %: escaped)."""
    default = option.shown_default
    text = option.help + (f" (default: {default})" if default is not None else "")
    return text.replace("%", "%%")


def _argument(option: Option) -> dict:
    kwargs = {"dest": option.name, "default": argparse.SUPPRESS, "help": help_text(option)}
    if option.switch:
        return {**kwargs, "action": argparse.BooleanOptionalAction if option.negatable else "store_true"}
    kwargs.update(metavar=option.metavar, choices=option.choices)
    if option.convert is not None:
        kwargs["type"] = option.convert if option.convert in (int, float) else _parser_type(option)
    if option.repeatable:
        kwargs["action"] = _Repeated
    return kwargs


def _parser_type(option: Option):
    """The option's own parsing as an argparse type: its ConfigError becomes argparse's one-line error."""
    def parse(text: str):
        try:
            return option.convert(text)
        except ConfigError as e:
            raise argparse.ArgumentTypeError(_without_flag(str(e), option.flag)) from None

    parse.__name__ = option.convert.__name__  # argparse names it in "invalid <type> value" for a ValueError
    parse.option = option
    return parse


def _without_flag(message: str, flag: str | None) -> str:
    """argparse starts its message with the flag already."""
    for prefix in (f"{flag}: ", f"{flag} "):
        if flag and message.startswith(prefix):
            return message[len(prefix):]
    return message


class _Repeated(argparse.Action):
    """A flag given more than once adds up: the option's parsing takes the earlier values with the new one."""

    def __call__(self, parser, namespace, values, option_string=None):
        before = getattr(namespace, self.dest, None)
        try:
            setattr(namespace, self.dest, self.type.option.convert((*(before or ()), *values)))
        except ConfigError as e:
            raise argparse.ArgumentError(self, _without_flag(str(e), option_string)) from None
