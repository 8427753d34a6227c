"""Small helpers the command modules share."""

from __future__ import annotations

import json


def floats(text: str) -> tuple[float, ...]:
    """`0.5,0.5,0.5` -> (0.5, 0.5, 0.5): argparse type for per-channel values."""
    return tuple(float(v) for v in text.split(","))


def write_json(path: str | None, result: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
