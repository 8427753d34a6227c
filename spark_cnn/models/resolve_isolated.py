"""The driver's model check (`resolve_endpoint`) in a short-lived child process, so the driver never holds torch.

Importing torch and torchvision costs a process ~650 MB of resident memory on CPU hosts (measured: 112 MB with
pyspark, pandas and pyarrow loaded; 786 MB after torch, torchvision and a mobilenet_v3_small check). The driver
needs the model only to check it before Spark starts; the sidecar holds the one copy that runs. So the check
runs in a child that exits when it is done. A process that has torch loaded already (a notebook, the tests)
checks in-process: it has paid the memory, and a child would only add its start-up time.

The child's answer is remembered in this process and on disk (check_cache.py), so the next job start over the
same model, files, code and libraries skips the child: a CLI run or a scheduled ETL run pays for it once.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import subprocess
import sys
import threading

from spark_cnn.errors import ModelError, SparkCnnError
from spark_cnn.models import check_cache
from spark_cnn.models.factory_code import factory_code_digest, file_digest
from spark_cnn.models.spec import ModelSpec

# Importing torch on a loaded host takes seconds; loading a large model's weights can take a minute.
RESOLVE_TIMEOUT_S = 300.0
# Checked models by (spec, options, model and weight files' contents, a factory's code, torch's cache location):
# a notebook or a benchmark that runs several jobs over one model pays for the child process once (check_cache.py:
# other processes too).
_checked: dict = {}
CACHE_ENVIRONMENT = ("TORCH_HOME", "XDG_CACHE_HOME", "HF_HOME", "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE",
                     "MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")
_checked_lock = threading.Lock()


def _cache_key(spec: ModelSpec, options: dict) -> tuple:
    # By content: a file rewritten with its old size and modification time restored (cp -p, rsync, a checkout)
    # is another model; a factory by the bytes of its module's code (factory_code.py).
    contents = [_contents(path) for path in (spec.source, spec.weights)]
    code = factory_code_digest(spec.source) if spec.kind == "factory" else None
    # Named weights resolve to a file in torch's (or timm's, MLflow's) cache, which these variables place.
    cache = tuple(os.environ.get(name) for name in CACHE_ENVIRONMENT)
    return repr(spec), tuple(sorted(options.items())), tuple(contents), code, cache


def _contents(path: str | None) -> str | None:
    """SHA-256 of a file, or of a folder's files by name (a local MLflow model); None when `path` is neither."""
    try:
        if path and os.path.isfile(path):
            return file_digest(path)
        if path and os.path.isdir(path):
            digest = hashlib.sha256()
            for root, dirs, names in os.walk(path):
                dirs.sort()
                for name in sorted(names):
                    file = os.path.join(root, name)
                    digest.update(f"{os.path.relpath(file, path)}\0{file_digest(file)}\n".encode())
            return digest.hexdigest()
    except OSError:
        pass
    return None


def resolve_endpoint_isolated(spec: ModelSpec, **options):
    """`resolve_endpoint(spec, **options)`, run in a child process unless torch is already imported here."""
    if "torch" in sys.modules:
        from spark_cnn.models.resolve import resolve_endpoint

        return resolve_endpoint(spec, **options)
    return _remembered_check(spec, options, _resolve_in_child)


def _remembered_check(spec: ModelSpec, options: dict, check):
    """`check(spec, options)` (-> the ResolvedModel and the code files it loaded), its answer remembered in this
    process and on disk; a failed check is not remembered, nor one of a registry URI that may name another
    version next time."""
    if not _pinned(spec):
        return check(spec, options)[0]
    key = _cache_key(spec, options)
    with _checked_lock:
        if key in _checked:
            return _checked[key]
    disk_key = check_cache.entry_key(spec, key)
    resolved = check_cache.lookup(disk_key, _loads)
    if resolved is None:
        resolved, code_files = check(spec, options)
        check_cache.store(disk_key, resolved, check_cache.dependencies(spec, resolved, code_files))
    with _checked_lock:
        _checked[key] = resolved
    return resolved


def _pinned(spec: ModelSpec) -> bool:
    """False for a registry URI that may name another version next time (an alias, a stage, latest)."""
    if not spec.source.startswith("models:/"):
        return True
    name, _, suffix = spec.source[len("models:/"):].partition("/")
    return "@" not in name and (not suffix or suffix.isdigit())


class _OwnClassesUnpickler(pickle.Unpickler):
    """Reads what the child (our own code) wrote, and only that: this package's classes and plain values.
    A global that is not one of our classes is refused, so the channel cannot be used to call functions."""

    def find_class(self, module: str, name: str):
        if module == "builtins" and name in ("tuple", "list", "dict", "set", "frozenset"):
            return super().find_class(module, name)
        if module.startswith("spark_cnn."):
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from the model-check process")


def _loads(data: bytes):
    return _OwnClassesUnpickler(io.BytesIO(data)).load()


def _resolve_in_child(spec: ModelSpec, options: dict) -> tuple:
    """(the ResolvedModel, the code files the child loaded beyond installed packages: check_cache.py)."""
    try:
        proc = subprocess.run([sys.executable, "-m", "spark_cnn.models.resolve_isolated"],
                              input=pickle.dumps((spec, options)), capture_output=True, timeout=RESOLVE_TIMEOUT_S,
                              check=False)
    except subprocess.TimeoutExpired as e:
        raise ModelError(f"checking --model {spec.source} took more than {RESOLVE_TIMEOUT_S:.0f} s") from e
    if proc.returncode != 0 or not proc.stdout:
        tail = proc.stderr.decode(errors="replace").strip().splitlines()[-3:]
        raise ModelError(f"checking --model {spec.source} failed in a child process (exit {proc.returncode}): "
                         f"{' | '.join(tail)}")
    ok, value, code_files = _loads(proc.stdout)
    if not ok:
        raise value
    return value, code_files


def _main() -> int:
    spec, options = _loads(sys.stdin.buffer.read())
    from spark_cnn.models.resolve import resolve_endpoint

    try:
        answer = (True, resolve_endpoint(spec, **options), check_cache.loaded_code_files())
    except SparkCnnError as e:
        answer = (False, e, ())
    except Exception as e:  # anything else the model's own code raises: reported as a model error
        answer = (False, ModelError(f"--model {spec.source}: {type(e).__name__}: {e}"), ())
    sys.stdout.buffer.write(pickle.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
