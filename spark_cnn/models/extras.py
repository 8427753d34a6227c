"""Optional extras (timm, mlflow): imported where used, with one line saying which `pip install` brings them."""

from __future__ import annotations

import importlib
from types import ModuleType

from spark_cnn.errors import ConfigError

# Import name -> the extra of this package that installs it.
EXTRAS = {"timm": "timm", "mlflow": "mlflow"}


def import_extra(module: str, what: str) -> ModuleType:
    """`module`, imported; a ConfigError naming the `pip install` to run when it is missing. `what`: who needs it
    (`--model timm:resnet50`)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"{what} needs {module}, an optional extra: pip install 'spark_cnn[{EXTRAS[module]}]' "
                          f"({e})") from e
