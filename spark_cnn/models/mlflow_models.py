"""MLflow PyTorch models (`--model models:/NAME/VERSION`, `models:/NAME@ALIAS`, `runs:/RUN_ID/PATH`, or a local
MLflow model directory; the `mlflow` extra).

The driver resolves the URI with MLflow (tracking and registry URIs from MLFLOW_TRACKING_URI and
MLFLOW_REGISTRY_URI, as MLflow reads them), downloads the artifacts once into a cache keyed by the resolved
version, and ships the one file that holds the model. Executors load that file with torch alone, so they need no
mlflow: a `model.pt2` (MLflow 3's default format, `torch.export`) with `torch.export.load`, after checking that
nothing torch.export.load reads from the archive needs a free unpickle (pt2_check); a TorchScript module MLflow
saved as `model.pth` with `torch.jit.load` (code, trusted as any TorchScript file). A pickled `nn.Module`
(`serialization_format="pickle"`, MLflow 2's default) is refused: unpickling it runs whatever the file says, and
weights files here never run code.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import zipfile

import torch
import yaml
from torch import nn

from spark_cnn.errors import ModelError
from spark_cnn.models.extras import import_extra
from spark_cnn.models.pt2_check import check_pickle_free
from spark_cnn.models.spec import MLFLOW_SCHEMES, MLMODEL_FILE, file_sha256
from spark_cnn.models.weights import ResolvedWeights
from spark_cnn.paths import user_cache_dir

PT2_FILE, PICKLE_FILE = "model.pt2", "model.pth"  # what mlflow.pytorch.save_model writes under model_data
# Resize of an input size the signature fixes: ImageNet's evaluation ratio (256 for a 224 crop).
CROP_RATIO = 0.875
LABEL_HASH_CHARS = 16


def resolve_mlflow_model(source: str) -> ResolvedWeights:
    """The model file of an MLflow model (downloaded once on the driver for a URI), a label naming the URI, the
    version it resolved to and the file's hash, and the crop its signature fixes (if it does)."""
    version = None
    if source.startswith(MLFLOW_SCHEMES):
        directory, version = download_model(source)
    else:
        directory = os.path.abspath(source)
    mlmodel = read_mlmodel(directory, source)
    data = model_data_file(directory, mlmodel, source)
    resolved = f"version {version}, " if version else ""
    return ResolvedWeights(file=data, label=f"{source} ({resolved}sha256:{file_sha256(data)[:LABEL_HASH_CHARS]})",
                           preprocessing=signature_preprocessing(mlmodel))


def download_model(source: str) -> tuple[str, str | None]:
    """(local model directory, registered version or None) of an MLflow URI; the artifacts are kept in a cache
    keyed by the tracking and registry URIs and the pinned URI, so a version is downloaded once."""
    mlflow = import_extra("mlflow", f"--model {source}")
    tracking, registry = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    try:
        pinned, version = source, None
        if source.startswith("models:/"):
            name, version = registry_version(mlflow.MlflowClient(), source)
            pinned = f"models:/{name}/{version}" if version else source
        key = hashlib.sha256("\0".join((tracking, registry, pinned)).encode()).hexdigest()[:LABEL_HASH_CHARS]
        return _cached_download(mlflow, pinned, os.path.join(mlflow_cache_dir(), key)), version
    except Exception as e:
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0]
        where = tracking if registry == tracking else f"{tracking}, registry URI {registry}"
        raise ModelError(f"--model {source} does not resolve at tracking URI {where}: {reason}; set "
                         f"MLFLOW_TRACKING_URI (and MLFLOW_REGISTRY_URI) to where the model is") from e


def registry_version(client, source: str) -> tuple[str | None, str | None]:
    """(name, version) that `models:/NAME/VERSION`, `/STAGE`, `/latest` or `@ALIAS` names now; (None, None) for
    `models:/MODEL_ID` (a logged model, not a registered one)."""
    rest = source[len("models:/"):]
    if "@" in rest:
        name, alias = rest.split("@", 1)
        return name, str(client.get_model_version_by_alias(name, alias).version)
    name, _, suffix = rest.partition("/")
    if not suffix:
        return None, None
    if suffix.isdigit():
        return name, str(client.get_model_version(name, suffix).version)
    if suffix.lower() == "latest":
        versions = client.search_model_versions(f"name='{name}'")
    else:
        versions = client.get_latest_versions(name, stages=[suffix])
    if not versions:
        raise ModelError(f"registered model {name!r} has no version{'' if suffix == 'latest' else ' in ' + suffix}")
    return name, str(max(int(v.version) for v in versions))


def mlflow_cache_dir() -> str:
    """Downloaded MLflow models: $XDG_CACHE_HOME/spark_cnn/mlflow/<key>/."""
    return user_cache_dir("mlflow")


def _cached_download(mlflow, uri: str, target: str) -> str:
    found = _model_dir_in(target)
    if found:
        return found
    os.makedirs(os.path.dirname(target), exist_ok=True)
    partial = tempfile.mkdtemp(dir=os.path.dirname(target), prefix=".part-")
    try:
        local = mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=partial)
        relative = os.path.relpath(local, partial)
        try:
            os.replace(partial, target)
        except OSError:  # another job downloaded it meanwhile: same version, same files
            shutil.rmtree(partial, ignore_errors=True)
        return os.path.normpath(os.path.join(target, relative))
    finally:
        if os.path.isdir(partial):
            shutil.rmtree(partial, ignore_errors=True)


def _model_dir_in(folder: str) -> str | None:
    """The MLflow model directory in a download folder (itself or one level down), None if absent."""
    if not os.path.isdir(folder):
        return None
    for candidate in [folder, *(os.path.join(folder, name) for name in sorted(os.listdir(folder)))]:
        if os.path.isfile(os.path.join(candidate, MLMODEL_FILE)):
            return candidate
    return None


def read_mlmodel(directory: str, source: str) -> dict:
    path = os.path.join(directory, MLMODEL_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return yaml.safe_load(f) or {}
    except (OSError, yaml.YAMLError) as e:
        raise ModelError(f"--model {source}: cannot read its MLmodel file {path} ({e})") from e


def model_data_file(directory: str, mlmodel: dict, source: str) -> str:
    """The file holding the PyTorch model: `<model_data>/model.pt2` or `<model_data>/model.pth`."""
    flavors = mlmodel.get("flavors") or {}
    flavor = flavors.get("pytorch")
    if flavor is None:
        raise ModelError(f"--model {source} is not a PyTorch MLflow model (its flavours: "
                         f"{', '.join(sorted(flavors)) or 'none'}); log it with mlflow.pytorch.log_model")
    data = os.path.join(directory, flavor.get("model_data") or "data")
    for name in (PT2_FILE, PICKLE_FILE):
        if os.path.isfile(os.path.join(data, name)):
            return os.path.join(data, name)
    if os.path.isfile(data):  # MLflow 1.x kept the pickled model itself under model_data
        return data
    raise ModelError(f"--model {source}: its pytorch flavour has neither {PT2_FILE} nor {PICKLE_FILE} in {data}")


def signature_preprocessing(mlmodel: dict) -> dict | None:
    """The crop (and resize) of a signature whose one input is a (batch, 3, S, S) tensor of fixed size S."""
    inputs = (mlmodel.get("signature") or {}).get("inputs")
    try:
        specs = json.loads(inputs) if inputs else []
        shape = specs[0]["tensor-spec"]["shape"] if len(specs) == 1 and specs[0].get("type") == "tensor" else []
    except (ValueError, KeyError, TypeError):
        return None
    if len(shape) != 4 or shape[1] != 3 or shape[2] != shape[3] or shape[2] < 1:
        return None
    crop = int(shape[2])
    return {"crop": crop, "resize": max(crop, round(crop / CROP_RATIO))}


def load_mlflow_file(path: str, source: str) -> nn.Module:
    """The model in an MLflow model file, loaded by torch alone (no mlflow): a pickle-free `.pt2` through
    torch.export, a TorchScript `.pth` through torch.jit; a pickled module is refused."""
    if path.endswith(".pt2"):
        check_pickle_free(path, source)
        try:
            program = torch.export.load(path)
        except Exception as e:
            raise ModelError(f"--model {source}: {os.path.basename(path)} is not a loadable torch.export program "
                             f"({type(e).__name__}: {e})") from e
        return ExportedModel(program.module(), _static_batch(program))
    if _is_torchscript(path):
        try:
            return torch.jit.load(path, map_location="cpu")
        except Exception as e:
            raise ModelError(f"--model {source}: not a loadable TorchScript module ({type(e).__name__}: {e})") from e
    raise ModelError(f"--model {source} is a pickled PyTorch model, which runs code when loaded; log it with "
                     "mlflow.pytorch.log_model(model, name=..., input_example=..., serialization_format='pt2') "
                     "(MLflow 3's default), or pass its state_dict as --weights with --model module:factory")


def _is_torchscript(path: str) -> bool:
    """torch.jit.save's archive: a zip with the module's code under `<archive>/code/`."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any("/code/" in name for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        return False


class ExportedModel(nn.Module):
    """A torch.export program as a module: its graph was exported in eval mode and cannot switch modes; with a
    static batch dimension (exported from a one-image example) batches run in slices of that size."""

    def __init__(self, graph: nn.Module, batch: int | None):
        super().__init__()
        self.graph = graph
        self.batch = batch

    def train(self, mode: bool = True) -> ExportedModel:
        self.training = mode  # recorded only: an exported graph refuses train()/eval()
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch is None or x.shape[0] == self.batch:
            return self.graph(x)
        outputs = []
        for start in range(0, x.shape[0], self.batch):
            part = x[start:start + self.batch]
            rows = part.shape[0]
            if rows < self.batch:  # padded with copies of its last image; their outputs are dropped
                part = torch.cat([part, part[-1:].expand(self.batch - rows, *part.shape[1:])])
            outputs.append(self.graph(part)[:rows])
        return torch.cat(outputs)


def _static_batch(program) -> int | None:
    """The batch size of the program's first input when it is fixed (None: dynamic)."""
    names = list(program.graph_signature.user_inputs)
    for node in program.graph.nodes:
        if node.op == "placeholder" and names and node.name == names[0]:
            value = node.meta.get("val")
            first = value.shape[0] if value is not None and value.dim() > 0 else None
            return first if isinstance(first, int) else None
    return None
