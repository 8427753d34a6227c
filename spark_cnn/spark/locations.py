"""Where a job may write: never onto, into or around its input, the filesystem root or the home directory.

`--overwrite` deletes the old output, so an output that is the input, contains it, or is the root or the home
directory would delete what the job reads (or much more); an output inside the input is read back as input by
the next run. Pure functions over URIs: local paths (file: URIs) are compared after resolving symlinks, `..`
and `~`; other filesystems by their normalised URIs (scheme and host lower-cased, `.`, `..` and `//` collapsed).
"""

from __future__ import annotations

import os
import posixpath
from urllib.parse import urlparse

from spark_cnn.errors import InputError


def location(uri: str) -> tuple[str, str]:
    """(filesystem, absolute path) of `uri`: ("file", the real local path) or ("scheme://host", the path)."""
    parsed = urlparse(uri)
    if parsed.scheme in ("", "file"):
        path = parsed.path if parsed.scheme else uri
        return "file", os.path.realpath(os.path.expanduser(path))
    path = "/" + posixpath.normpath("/" + parsed.path).lstrip("/")
    return f"{parsed.scheme.lower()}://{parsed.netloc.lower()}", path


def within(outer: str, inner: str) -> bool:
    """`inner` is `outer` or lies below it (absolute, normalised paths)."""
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def check_output_location(input_uri: str, output_uri: str, *, home: str | None = None) -> None:
    """Refuse an output that is the input, contains it, lies inside it, is the filesystem root, or is (or
    contains) the home directory (`home`: default `~`). One line each, saying what to do instead."""
    (in_fs, inp), (out_fs, out) = location(input_uri), location(output_uri)
    fix = "choose a new folder outside the input for the output"
    if out == "/":
        raise InputError(f"output {output_uri} is the filesystem root: {fix}")
    if in_fs == out_fs:
        if out == inp:
            raise InputError(f"output {output_uri} is the input (--overwrite would delete it): {fix}")
        if within(out, inp):
            raise InputError(f"output {output_uri} contains the input {input_uri} (--overwrite would delete it): "
                             f"{fix}")
        if within(inp, out):
            raise InputError(f"output {output_uri} lies inside the input {input_uri} (its files would be read as "
                             f"images by the next run): {fix}")
    if out_fs == "file":
        home = os.path.realpath(os.path.expanduser(home or "~"))
        if within(out, home):
            what = "is" if out == home else "contains"
            raise InputError(f"output {output_uri} {what} the home directory {home}: {fix}")


def check_checkpoint_location(input_uri: str, checkpoint_uri: str, output_uri: str | None = None) -> None:
    """Refuse a streaming checkpoint that is the input, contains it or lies inside it (its files would be listed
    as new images), or that is the output itself."""
    (in_fs, inp), (cp_fs, cp) = location(input_uri), location(checkpoint_uri)
    fix = "keep the checkpoint in a folder of its own, outside the input (e.g. beside the output)"
    if cp_fs == in_fs and (within(cp, inp) or within(inp, cp)):
        raise InputError(f"checkpoint {checkpoint_uri} overlaps the input {input_uri}: {fix}")
    if output_uri is not None and location(output_uri) == (cp_fs, cp):
        raise InputError(f"checkpoint {checkpoint_uri} is the output folder: {fix}")
