"""MLflow PyTorch models against a real sqlite tracking store under a temporary folder: each URI form resolves
to the logged model file, which torch alone loads to the logged model's outputs; labels name the URI, version
and file hash; bad URIs, a store that lacks the model and a missing extra stop with one line."""

from __future__ import annotations

import os
import sys

import pytest
import torch

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.models.loader import build_module
from spark_cnn.models.mlflow_models import ExportedModel, signature_preprocessing
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.resolve_isolated import _pinned
from spark_cnn.models.spec import ModelSpec, file_sha256
from tests.mlflow_store import ALIAS, MODEL_NAME, SIZE, make_store

SMALL = {"resize": 36, "crop": SIZE}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(str(tmp_path_factory.mktemp("mlflow")))


@pytest.fixture
def tracking(store, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store.tracking_uri)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # downloads land here
    return store


def _outputs(endpoint, images: torch.Tensor) -> torch.Tensor:
    module = build_module(endpoint.source, endpoint.weights, kind=endpoint.kind)
    with torch.inference_mode():
        return module(images)


@pytest.mark.parametrize("uri, version, artifact", [
    (f"models:/{MODEL_NAME}/1", "1", "model.pt2"),
    (f"models:/{MODEL_NAME}@{ALIAS}", "1", "model.pt2"),
    (f"models:/{MODEL_NAME}/latest", "1", "model.pt2"),
    ("runs:/{run}/model", None, "model.pt2"),
    ("runs:/{run}/one", None, "model.pt2"),  # exported from a one-image example: a static batch of 1
    ("runs:/{run}/scripted", None, "model.pth"),  # TorchScript, which MLflow saves under the pickle's name
])
def test_each_uri_form_loads_the_logged_model(tracking, tmp_path, uri, version, artifact):
    uri = uri.format(run=tracking.run_id)
    resolved = resolve_endpoint(ModelSpec(uri, preprocessing=SMALL), logits=True)
    endpoint = resolved.endpoint
    assert endpoint.kind == "mlflow" and os.path.basename(endpoint.weights) == artifact
    assert endpoint.weights.startswith(str(tmp_path / "cache" / "spark_cnn" / "mlflow"))
    assert endpoint.files == {endpoint.weights: artifact}  # shipped as one file
    detail = f"version {version}, " if version else ""
    assert resolved.weights.label == f"{uri} ({detail}sha256:{file_sha256(endpoint.weights)[:16]})"
    assert resolved.num_classes == 5
    images = torch.rand(5, 3, SIZE, SIZE)
    with torch.inference_mode():
        expected = tracking.model(images)
    torch.testing.assert_close(_outputs(endpoint, images), expected, rtol=1e-5, atol=1e-6)


def test_a_static_batch_runs_in_slices_and_the_signature_fixes_the_crop(tracking):
    endpoint = resolve_endpoint(ModelSpec(f"runs:/{tracking.run_id}/one")).endpoint
    module = build_module(endpoint.source, endpoint.weights, kind=endpoint.kind)
    assert isinstance(module, ExportedModel) and module.batch == 1
    assert (endpoint.preprocessing.crop, endpoint.preprocessing.resize) == (SIZE, 37)  # from the signature
    assert signature_preprocessing({"signature": {"inputs": '[{"type": "tensor", "tensor-spec": '
                                                            '{"dtype": "float32", "shape": [-1, 3, -1, -1]}}]'}}) \
        is None


def test_a_local_model_directory_needs_no_tracking_server(store, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # never asked
    resolved = resolve_endpoint(ModelSpec(store.directory, preprocessing=SMALL), logits=True)
    assert resolved.endpoint.weights == os.path.join(store.directory, "data", "model.pt2")
    assert resolved.weights.label.startswith(f"{store.directory} (sha256:")
    images = torch.rand(3, 3, SIZE, SIZE)
    with torch.inference_mode():
        torch.testing.assert_close(_outputs(resolved.endpoint, images), store.model(images), rtol=1e-5, atol=1e-6)


def test_mlflow_uris_are_not_module_factory():
    assert ModelSpec(f"models:/{MODEL_NAME}/1").kind == "mlflow"
    assert ModelSpec("models:/m-0123abcd").kind == "mlflow"  # a logged model's id
    assert ModelSpec("runs:/abc/model").kind == "mlflow"
    assert ModelSpec("pkg.mod:factory").kind == "factory"
    for bad in ("models:/", "models:/m/1/2", "runs:/abc"):
        with pytest.raises(ConfigError, match="not an MLflow model URI; expected models:/NAME/VERSION"):
            ModelSpec(bad)
    with pytest.raises(ConfigError, match="carries its own weights"):
        ModelSpec("models:/m/1", weights="DEFAULT")


def test_only_versions_are_cached_between_checks():
    assert _pinned(ModelSpec("models:/m/3")) and _pinned(ModelSpec("runs:/abc/model"))
    assert not _pinned(ModelSpec("models:/m@champion")) and not _pinned(ModelSpec("models:/m/latest"))


def test_an_unresolvable_uri_names_the_tracking_uri(tracking):
    for uri in ("models:/nope/1", f"models:/{MODEL_NAME}@nope", f"models:/{MODEL_NAME}/7", "runs:/0123abc/model"):
        with pytest.raises(ModelError) as caught:
            resolve_endpoint(ModelSpec(uri))
        message = str(caught.value)
        assert f"--model {uri} does not resolve at tracking URI {tracking.tracking_uri}: " in message
        assert "\n" not in message and message.endswith("set MLFLOW_TRACKING_URI (and MLFLOW_REGISTRY_URI) to "
                                                        "where the model is")


def test_a_pickled_module_is_refused_it_would_run_code(tracking):
    with pytest.raises(ModelError, match="is a pickled PyTorch model, which runs code when loaded; log it with .*"
                                         "serialization_format='pt2'"):
        resolve_endpoint(ModelSpec(f"runs:/{tracking.run_id}/pickled"))


def test_a_pt2_archive_with_a_free_pickle_is_refused(store, tmp_path):
    """torch.export.load unpickles the archive's payloads with weights_only=False: a record that needs it is
    refused before torch.export.load reads the archive."""
    import pickle
    import shutil
    import zipfile

    from spark_cnn.models.mlflow_models import load_mlflow_file

    marker = tmp_path / "pwned"
    path = str(tmp_path / "model.pt2")
    shutil.copy(os.path.join(store.directory, "data", "model.pt2"), path)
    with zipfile.ZipFile(path, "a") as archive:
        archive.writestr("model/data/constants/evil", pickle.dumps(_Payload(str(marker))))
    with pytest.raises(ModelError, match="record model/data/constants/evil of its .pt2 archive needs a free "
                                         "unpickle"):
        load_mlflow_file(path, "models:/x/1")
    assert not marker.exists()


class _Payload:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_model_of_another_flavour_is_refused(tmp_path):
    folder = tmp_path / "sk"
    folder.mkdir()
    (folder / "MLmodel").write_text("flavors:\n  python_function: {}\n  sklearn: {}\n")
    with pytest.raises(ModelError, match=r"is not a PyTorch MLflow model \(its flavours: python_function, sklearn\)"):
        resolve_endpoint(ModelSpec(str(folder)))


def test_without_the_extra_the_error_says_which_pip_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if the extra were not installed
    with pytest.raises(ConfigError, match=r"needs mlflow, an optional extra: pip install 'spark_cnn\[mlflow\]'"):
        resolve_endpoint(ModelSpec(f"models:/{MODEL_NAME}/1"))


@pytest.mark.parametrize("artifact", ["model", "scripted"])
def test_executors_load_the_shipped_file_without_mlflow(tracking, monkeypatch, artifact):
    endpoint = resolve_endpoint(ModelSpec(f"runs:/{tracking.run_id}/{artifact}", preprocessing=SMALL)).endpoint
    for name in [m for m in sys.modules if m == "mlflow" or m.startswith("mlflow.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "mlflow", None)  # any import of mlflow now fails
    images = torch.rand(2, 3, SIZE, SIZE)
    with torch.inference_mode():
        torch.testing.assert_close(_outputs(endpoint, images), tracking.model(images), rtol=1e-5, atol=1e-6)


def test_profile_names_the_mlflow_uri_version_and_costs_the_exported_graph(tracking):
    from spark_cnn.perf_tools.commands import _model_and_cost

    _, shape, cost, label = _model_and_cost(ModelSpec(f"models:/{MODEL_NAME}@{ALIAS}"))
    assert shape == (3, SIZE, SIZE)  # the crop the signature fixes
    assert label.startswith(f"models:/{MODEL_NAME}@{ALIAS} (version 1, sha256:")
    assert cost.flops(1) > 0 and not cost.uncosted
