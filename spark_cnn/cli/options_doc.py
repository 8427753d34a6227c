"""docs/options.md, generated from the option declarations (spark_cnn/config.py): every job option with its
flag, preset key, `spark.cnn.*` key, default, choices, the commands that have its flag, and its help.

    python -m spark_cnn.cli.options_doc --write     # regenerate docs/options.md (a unit test checks it is current)
"""

from __future__ import annotations

import argparse
import os
import sys

from spark_cnn.cli import classify, etl, to_petastorm
from spark_cnn.cli.resolution import Option

DOC_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs",
                        "options.md")
# Each job command and its option table; embed, detect and segment are classify's options for their task.
COMMAND_TABLES = {"classify": lambda: classify.option_table("classify"),
                  "embed": lambda: classify.option_table("embed"),
                  "detect": lambda: classify.option_table("detect"),
                  "segment": lambda: classify.option_table("segment"),
                  "etl": etl.option_table, "to-petastorm": to_petastorm.option_table}
HEADER = """# Job options

Generated from the declarations in `spark_cnn/config.py` by `python -m spark_cnn.cli.options_doc --write`; do not
edit by hand. Each option resolves as **flag > preset > Spark conf > default** (README, "Presets and where options
come from"). A preset spells the key as below (underscores are accepted too); Spark conf takes text.
"Flag in" lists the commands with the flag; an option without one is set by a preset or `spark.cnn.*` only.
"Read by" says where the value is used: the driver's reader of INPUT, the Spark tasks, the sidecar (it travels in
the tasks' HELLO), or the driver alone; a unit test holds each declaration to it.

| option | preset key | Spark conf | default | choices | example | flag in | read by | what it does |
| --- | --- | --- | --- | --- | --- | --- | --- | --- |
"""


def rows() -> list[str]:
    """One table row per option, in the order classify, then the other commands, declare them."""
    found: dict[str, dict[str, Option]] = {}
    for command, table in COMMAND_TABLES.items():
        for name, option in table().items():
            found.setdefault(name, {})[command] = option
    return [_row(by_command) for by_command in found.values()]


def _row(by_command: dict[str, Option]) -> str:
    first = next(iter(by_command.values()))
    flags = [command for command, option in by_command.items() if option.flag or option.positional]
    defaults = {command: option.shown_default for command, option in by_command.items()}
    default = defaults[next(iter(defaults))]
    others = [f"{command}: {value}" for command, value in defaults.items() if value != default]
    shown = "; ".join([f"`{default}`" if default is not None else "", *others]).strip("; ")
    name = first.metavar if first.positional else (first.flag or next(
        (option.flag for option in by_command.values() if option.flag), None) or "")
    readers = {command: option.reaches for command, option in by_command.items()}
    read_by = "; ".join([first.reaches or "", *(f"{command}: {reader}" for command, reader in readers.items()
                                                if reader != first.reaches)]).strip("; ")
    cells = [f"`{name}`" if name else "", f"`{first.preset_key}`", f"`{first.conf_key}`", shown,
             ", ".join(f"`{c}`" for c in first.choices or ()), f"`{first.example}`" if first.example else "",
             ", ".join(flags) or "(preset/conf only)", read_by, first.help]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def render() -> str:
    return HEADER + "\n".join(rows()) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m spark_cnn.cli.options_doc", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help=f"write {DOC_PATH} instead of printing it")
    args = parser.parse_args(argv)
    text = render()
    if args.write:
        with open(DOC_PATH, "w", encoding="utf-8") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
