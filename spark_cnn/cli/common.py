"""Small helpers the command modules share."""

from __future__ import annotations

import json


def write_json(path: str | None, result: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(result, f, indent=2)
