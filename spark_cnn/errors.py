"""One base error and a few subclasses; every message names the problem and the fix.

Errors cross process boundaries (Spark task -> driver, sidecar -> task), so they keep their message as their
only argument and stay picklable.
"""

from __future__ import annotations


class SparkCnnError(Exception):
    """Base of every error spark_cnn raises on purpose."""


class ConfigError(SparkCnnError):
    """A job or sidecar option is wrong; raised before any work starts."""


class InputError(SparkCnnError):
    """The input or output location is missing, unreadable, or already there."""


class ModelError(SparkCnnError):
    """The model cannot be found, built, or loaded with the given weights."""


class ImageError(SparkCnnError):
    """One image could not be decoded or preprocessed."""


class SidecarError(SparkCnnError):
    """The sidecar could not be started, reached, or answered with an error."""


class SidecarLost(SidecarError):
    """The connection to the sidecar broke (the process died or closed it): its requests in flight got no reply."""


class SidecarHung(SidecarError):
    """The sidecar stopped answering within the request timeout."""


class SidecarFault(SidecarError):
    """The model, the device or the sidecar failed a request (not the request's own input): the task fails, so
    Spark retries it, and the job fails when the retries run out. Raised by task/client.py, which sets `kind`,
    `pid` and `socket_path` (lost when pickled; the message names them)."""


class MissingExtra(SparkCnnError, ImportError):
    """An optional package a feature needs is not installed; the message names the extra that brings it.
    Also an ImportError, so code that falls back when a package is missing still does."""


def missing_extra(package: str, extra: str, what: str) -> MissingExtra:
    """`<what> needs <package>: pip install 'spark_cnn[<extra>]'`, to raise from the ImportError."""
    return MissingExtra(f"{what} needs {package}: pip install 'spark_cnn[{extra}]'")
