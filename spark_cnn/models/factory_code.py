"""The code a `module:factory` model runs, found without importing it, and a digest of its bytes.

The model's fingerprint, the driver's remembered model checks and the sidecar's import of the factory follow this
digest, so a notebook that edits `mymodels.py` and runs `classify(df, model="mymodels:build")` again gets the
edited model from a warm sidecar, not the one it loaded first. Torch-free: the fingerprint is computed in tasks too.

What counts as the factory's code: every `.py` file of its top-level package (what it can import relatively), or,
for a top-level module, the `.py` files of its folder (the siblings it can import by name). Contents are hashed,
never sizes and modification times, which a copy or a checkout can restore unchanged over new bytes.

Only the user's own code counts: a factory of this package or of an installed one (`torchvision.models:resnet50`)
has no files here. Hashing torch's thousands of files for every fingerprint would cost seconds, and importing
such a package again would replace classes every other module holds (an error class a caller catches, say).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import sys
import sysconfig

__all__ = ["factory_code_digest", "factory_files", "file_digest"]

_CHUNK = 1 << 20


def factory_files(module_name: str) -> tuple[str, list[str]]:
    """(the folder the files are named relative to, the sorted source files of `module_name`'s code);
    ("", []) when it cannot be found here (it may be importable on executors only)."""
    top = module_name.partition(".")[0]
    if top == __name__.partition(".")[0]:
        return "", []
    folders, single = _locate(top)
    if any(_installed(path) for path in [*folders, *([single] if single else [])]):
        return "", []
    files: set[str] = set()
    if folders:  # a package: its whole tree
        for folder in folders:
            for root, dirs, names in os.walk(folder):
                dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
                files.update(os.path.join(root, name) for name in names if name.endswith(".py"))
        base = os.path.dirname(os.path.abspath(folders[0]))
    elif single:  # a top-level module: itself and its siblings
        base = os.path.dirname(os.path.abspath(single))
        files.add(os.path.abspath(single))
        try:
            files.update(os.path.join(base, name) for name in os.listdir(base) if name.endswith(".py"))
        except OSError:
            pass
    else:
        return "", []
    return base, sorted(os.path.abspath(path) for path in files)


def factory_code_digest(source: str) -> str:
    """SHA-256 of the code of `package.module:factory` (factory_files): each file's name, relative to its
    top-level folder, and bytes. Equal while the code is; "" when the module cannot be found here."""
    base, files = factory_files(source.partition(":")[0])
    if not files:
        return ""
    digest = hashlib.sha256()
    for path in files:
        digest.update(os.path.relpath(path, base).encode() + b"\0")
        try:
            digest.update(file_digest(path).encode() + b"\n")
        except OSError:  # removed while listed: a change too
            digest.update(b"-\n")
    return digest.hexdigest()


def file_digest(path: str) -> str:
    """SHA-256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def _locate(top: str) -> tuple[list[str], str | None]:
    """(package folders, or the module file) of top-level module `top`, as an import would find it on sys.path
    now, else as the loaded module says; nothing is imported."""
    try:
        spec = importlib.machinery.PathFinder.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is not None:
        if spec.submodule_search_locations:
            return [os.fspath(p) for p in spec.submodule_search_locations], None
        if spec.origin and os.path.isfile(spec.origin):
            return [], spec.origin
    loaded = sys.modules.get(top)
    paths = list(getattr(loaded, "__path__", None) or [])
    if paths:
        return [os.fspath(p) for p in paths], None
    origin = getattr(loaded, "__file__", None)
    return [], origin if isinstance(origin, str) and os.path.isfile(origin) else None


def _installed_roots() -> set[str]:
    """Where installed packages and the standard library live."""
    paths = sysconfig.get_paths()
    return {os.path.realpath(paths[key]) for key in ("purelib", "platlib", "stdlib", "platstdlib") if key in paths}


def _installed(path: str) -> bool:
    real = os.path.realpath(path)
    return any(real == root or real.startswith(root + os.sep) for root in _installed_roots())
