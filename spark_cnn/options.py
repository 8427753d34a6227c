"""Each job option declared once: a field of a frozen config dataclass, declared with `option(...)`.

The declaration holds the option's default (the field's), help, choices, how a text becomes its value, the flag's
spelling where it is not the name's, and which commands give it a flag. Everything else is derived from it:

- the command-line flags and their --help (cli/flags.py),
- the preset keys and `spark.cnn.*` keys, and the conversion and checks of their values (cli/resolution.py),
- the check that a value is one of the choices, however the config was built (`check_choices`, from each config's
  `__post_init__`),
- the options reference, docs/options.md (`python -m spark_cnn.cli.options_doc --write`).

A field without a declaration is not an option (e.g. DecodeOptions.reduced_dct, a benchmark's switch). Pure: no
argparse, no Spark; the classes that run in Spark's workers (RunOptions, DecodeOptions) declare theirs too.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Example:
...     colour: str = option("red", help="paint colour", choices=("red", "blue"))
>>> declaration(Example.__dataclass_fields__["colour"]).choices
('red', 'blue')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, field
from typing import Any

from spark_cnn.errors import ConfigError

# Field metadata keys. OPTION: the field's Declared. NESTED: the field holds another options dataclass whose own
# fields are options under their flat names (--batch-size fills ClassifyConfig.inference.batch_size); its value
# is that dataclass, or with VIA, `VIA_CLASS(...).value()` (the ModelSpec from ModelOptions).
OPTION = "spark_cnn.option"
NESTED = "spark_cnn.nested"
VIA = "spark_cnn.via"
# The --help groups, in the order --help lists them.
GROUPS = ("input", "model", "run", "output", "incremental")
# Where a job option's value is read (docs/options.md's "read by"; tests/unit/cli/test_option_reach.py holds each
# declaration to it): the driver's reader of INPUT, the Spark tasks (the InferencePlan), the sidecar (the HELLO:
# the model, how it runs, how images decode), or the driver alone.
READERS = ("reader", "tasks", "sidecar", "driver")


@dataclass(frozen=True)
class Declared:
    """What an option is, apart from its default (the field's)."""

    help: str
    choices: tuple | None = None
    parse: Callable[[str], Any] | None = None  # text -> value; None: from the field's type (int, float, text)
    name: str | None = None  # the flat name when not the field's (InputOptions.format is input_format)
    flag: str | None = None  # the flag when not --<name with dashes> (--output for output_kind)
    metavar: str | None = None
    group: str = "run"
    # The commands with a flag for it (cli: classify, embed, detect, segment, etl, to-petastorm); None: every
    # command whose config holds it; (): none, a preset key and spark.cnn.* key only.
    commands: tuple[str, ...] | None = None
    command_only: bool = False  # without a flag in a command, not an option of it at all (no preset/conf key)
    default_text: str | None = None  # the default as --help and the docs show it, when not the value itself
    default_for: tuple[tuple[str, Any], ...] = ()  # (command, default) where a command has its own default
    repeatable: bool = False  # the flag may be given more than once; `parse` adds the values up
    reaches: str | None = None  # one of READERS for a job option; None for a tool's (bench-sidecar's)
    reaches_for: tuple[tuple[str, str], ...] = ()  # (command, reader) where a command reads it elsewhere
    example: str | None = None  # a value other than the default, as typed after the flag (none for a switch)

    def __post_init__(self) -> None:
        if self.group not in GROUPS:
            raise TypeError(f"option group {self.group!r}: expected one of {GROUPS}")
        for reader in (self.reaches, *dict(self.reaches_for).values()):
            if reader is not None and reader not in READERS:
                raise TypeError(f"option reaches {reader!r}: expected one of {READERS}")


def option(default: Any = MISSING, *, help: str, choices: Sequence | None = None, **declared) -> Any:
    """A dataclass field that is an option; `default` is its one default, the rest its Declared."""
    spec = Declared(help=help, choices=tuple(choices) if choices is not None else None, **declared)
    return field(default=default, metadata={OPTION: spec})


def same_as(config: type, name: str, **changes) -> Any:
    """A field declared as `config`'s field `name`: the same default, help, choices and parsing, for an option that
    two configs hold (InferenceOptions.max_file_bytes is DecodeOptions.max_file_bytes); `changes`: Declared
    fields that differ (e.g. `commands`)."""
    source = config.__dataclass_fields__[name]
    spec = dataclasses.replace(source.metadata[OPTION], **changes)
    return field(default=source.default, metadata={OPTION: spec})


def nested(default: Any = MISSING, *, via: type | None = None) -> Any:
    """A field holding nested options (see NESTED); `via`: an options dataclass whose `value()` is the field's."""
    return field(default=default, metadata={NESTED: True, **({VIA: via} if via else {})})


def declaration(f: dataclasses.Field) -> Declared | None:
    """The field's Declared, or None when the field is not an option."""
    return f.metadata.get(OPTION)


def option_name(f: dataclasses.Field) -> str:
    spec = declaration(f)
    return (spec and spec.name) or f.name


def flag_of(f: dataclasses.Field) -> str:
    """--batch-size: the flag an option has (or would have), as messages name it."""
    spec = declaration(f)
    return (spec and spec.flag) or "--" + option_name(f).replace("_", "-")


def check_choice(flag: str, value: Any, choices: Sequence) -> None:
    """ConfigError (one line) naming the flag unless `value` is one of `choices`."""
    if value not in choices:
        raise ConfigError(f"{flag} {value}: expected one of {', '.join(map(str, choices))}")


def check_choices(config: Any) -> None:
    """Every declared option of dataclass instance `config` that has choices holds one of them (None where None
    is the default: not given)."""
    for f in dataclasses.fields(config):
        spec = declaration(f)
        if spec is None or spec.choices is None:
            continue
        value = getattr(config, f.name)
        if value is None and f.default is None:
            continue
        check_choice(flag_of(f), value, spec.choices)
