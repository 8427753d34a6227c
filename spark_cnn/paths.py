"""Where spark_cnn keeps what it caches per user: `$XDG_CACHE_HOME/spark_cnn/...`, else `~/.cache/spark_cnn/...`."""

from __future__ import annotations

import os


def user_cache_dir(*parts: str) -> str:
    """A folder under this user's spark_cnn cache (it may not exist yet)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(base, "spark_cnn", *parts)
