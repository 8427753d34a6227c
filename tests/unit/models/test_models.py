"""Model specs, building and loading modules, output heads, and the driver-side endpoint check."""

from __future__ import annotations

import copy
import dataclasses
import shutil
import sys
import types

import pytest
import torch
import torchvision
from torch import nn

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.batchnorm_folding import fold_batchnorms
from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING, DigitsCNN
from spark_cnn.models.heads import Predictor
from spark_cnn.models.loader import build_module, declared_preprocessing
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import Endpoint, ModelSpec, file_sha256, model_kind

# Small inputs keep CPU forward passes fast; the torchvision models used here pool adaptively.
PROBE = (2, 3, 64, 64)
FAKE_MODULE = "spark_cnn_test_factories"


class NotATensor:
    """Pickled into a 'weights' file: weights_only=True must refuse it."""

    def __init__(self):
        self.payload = [1, 2, 3]


class TinyNet(nn.Module):
    """Conv -> global pool -> Linear(8, 6) -> ReLU -> Linear(6, classes); accepts any image size."""

    def __init__(self, classes: int = 4):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.hidden = nn.Linear(8, 6)
        self.head = nn.Linear(6, classes)

    def forward(self, x):
        return self.head(torch.relu(self.hidden(self.features(x))))


@pytest.fixture
def factories(monkeypatch):
    """An importable module of factories, `spark_cnn_test_factories:<name>`, without writing a file."""
    module = types.ModuleType(FAKE_MODULE)
    module.not_a_module = lambda: {"weights": 1}
    module.tiny3 = lambda: _seeded(TinyNet, 3)
    module.tiny12 = lambda: _seeded(TinyNet, 12)
    monkeypatch.setitem(sys.modules, FAKE_MODULE, module)
    return module


def _seeded(cls, *args, **kwargs) -> nn.Module:
    torch.manual_seed(0)
    return cls(*args, **kwargs).eval()


def _save(state, path) -> str:
    torch.save(state, path)
    return str(path)


def _images(shape=PROBE) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(1))


# --- model_kind and ModelSpec ---------------------------------------------------------------------------------

@pytest.mark.parametrize("source, kind", [
    ("resnet50", "torchvision"),
    ("mobilenet_v3_small", "torchvision"),
    ("my_pkg.models:build", "factory"),
    ("spark_cnn.models.digits:digits_cnn", "factory"),
    ("model.pt", "torchscript"),
    ("/models/traced.torchscript", "torchscript"),
    ("dir/m.jit", "torchscript"),
])
def test_model_kind_by_name(source, kind):
    assert model_kind(source) == kind


def test_model_kind_of_an_existing_file_without_a_known_suffix(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"x")
    assert model_kind(str(path)) == "torchscript"
    assert ModelSpec(str(path)).kind == "torchscript"


def test_model_spec_kind():
    assert ModelSpec("mobilenet_v3_small").kind == "torchvision"
    assert ModelSpec(DIGITS_FACTORY).kind == "factory"


@pytest.mark.parametrize("source", ["", "   "])
def test_model_spec_refuses_an_empty_source(source):
    with pytest.raises(ConfigError, match="--model is empty"):
        ModelSpec(source)


def test_model_spec_refuses_a_missing_weights_file(tmp_path):
    missing = str(tmp_path / "nope.pt")
    with pytest.raises(ConfigError, match=f"--weights {missing}: no such file"):
        ModelSpec("resnet18", weights=missing)


def test_model_spec_refuses_a_missing_torchscript_file(tmp_path):
    missing = str(tmp_path / "scripted.pt")
    with pytest.raises(ConfigError, match="no such TorchScript file"):
        ModelSpec(missing)


# --- build_module ---------------------------------------------------------------------------------------------

def test_unknown_torchvision_name_is_a_model_error_naming_it():
    with pytest.raises(ModelError, match="--model resnet_nope: unknown model"):
        build_module("resnet_nope")


@pytest.mark.parametrize("source, fragment", [
    ("spark_cnn.models.digits:no_such_factory", "cannot import 'no_such_factory' from 'spark_cnn.models.digits'"),
    ("spark_cnn_no_such_module:factory", "cannot import 'factory' from 'spark_cnn_no_such_module'"),
])
def test_missing_factory_is_a_model_error(source, fragment):
    with pytest.raises(ModelError, match=fragment):
        build_module(source)


def test_factory_with_an_empty_module_name_is_a_model_error():
    with pytest.raises(ModelError):
        build_module(":digits_cnn")


def test_factory_returning_a_non_module_is_a_model_error(factories):
    with pytest.raises(ModelError, match="the factory returned dict, expected torch.nn.Module"):
        build_module(f"{FAKE_MODULE}:not_a_module")


def test_factory_module_is_built_in_eval_mode():
    module = build_module(DIGITS_FACTORY)
    assert isinstance(module, DigitsCNN)
    assert not module.training


def _as_loaded(module: torch.nn.Module) -> torch.nn.Module:
    """A copy of `module` as build_module returns a model: in eval mode, its BatchNorms folded."""
    expected = copy.deepcopy(module).eval()
    assert fold_batchnorms(expected) > 0
    return expected


def test_weights_from_the_same_architecture_replace_the_random_init(tmp_path):
    torch.manual_seed(123)
    original = torchvision.models.mobilenet_v3_small().eval()
    path = _save(original.state_dict(), tmp_path / "mnv3.pth")

    torch.manual_seed(0)  # build_module's own random init differs from `original`: the file must replace it
    loaded = build_module("mobilenet_v3_small", path)

    assert not loaded.training
    # The loader folds BatchNorms into their convolutions (models/batchnorm_folding.py): the file's weights, folded.
    expected = _as_loaded(original)
    assert loaded.state_dict().keys() == expected.state_dict().keys()
    for name, tensor in expected.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    with torch.inference_mode():
        assert torch.equal(loaded(_images()), expected(_images()))
        torch.testing.assert_close(loaded(_images()), original(_images()), rtol=1e-4, atol=1e-5)


def test_weights_from_another_architecture_do_not_fit(tmp_path):
    path = _save(_seeded(torchvision.models.resnet18, num_classes=10).state_dict(), tmp_path / "resnet18.pth")
    with pytest.raises(ModelError, match=f"--weights {path} do not fit --model mobilenet_v3_small"):
        build_module("mobilenet_v3_small", path)


def test_weights_of_a_factory_model_with_other_shapes_do_not_fit(tmp_path, factories):
    path = _save(_seeded(TinyNet, 3).state_dict(), tmp_path / "tiny3.pth")
    with pytest.raises(ModelError, match="do not fit"):
        build_module(f"{FAKE_MODULE}:tiny12", path)  # no rebuild with another class count for factories


def test_torchvision_model_fine_tuned_to_other_classes_is_rebuilt(tmp_path):
    tuned = _seeded(torchvision.models.resnet18, num_classes=7)
    path = _save(tuned.state_dict(), tmp_path / "resnet18-7.pth")

    loaded = build_module("resnet18", path)

    assert loaded.fc.out_features == 7
    for name, tensor in _as_loaded(tuned).state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    with torch.inference_mode():
        out = loaded(_images((1, 3, 32, 32)))
    assert out.shape == (1, 7)


def test_googlenet_state_dict_with_aux_heads_loads(tmp_path):
    trained = _seeded(torchvision.models.googlenet, num_classes=10, aux_logits=True, init_weights=False)
    path = _save(trained.state_dict(), tmp_path / "googlenet.pth")
    loaded = build_module("googlenet", path)
    with torch.inference_mode():
        assert loaded(_images((1, 3, 64, 64))).shape == (1, 10)


def test_pickled_objects_in_a_weights_file_are_refused(tmp_path):
    path = _save({"a": NotATensor()}, tmp_path / "evil.pth")
    with pytest.raises(ModelError, match=f"--weights {path}: not a loadable state_dict") as info:
        build_module("mobilenet_v3_small", path)
    assert isinstance(info.value.__cause__, Exception)


def test_a_checkpoint_that_is_not_a_state_dict_is_refused(tmp_path):
    path = _save({"epoch": 3, "state_dict": {"w": torch.zeros(1)}}, tmp_path / "checkpoint.pth")
    with pytest.raises(ModelError, match=r"expected a state_dict \(a dict of tensors"):
        build_module(DIGITS_FACTORY, path)


def test_a_tensor_is_not_a_state_dict(tmp_path):
    path = _save(torch.zeros(3), tmp_path / "tensor.pth")
    with pytest.raises(ModelError, match="found Tensor"):
        build_module(DIGITS_FACTORY, path)


def test_torchscript_file_loads_and_reproduces_outputs(tmp_path):
    scripted = torch.jit.script(_seeded(TinyNet, 5))
    path = str(tmp_path / "tiny.pt")
    scripted.save(path)

    loaded = build_module(path)

    assert isinstance(loaded, torch.jit.ScriptModule)
    assert not loaded.training
    with torch.inference_mode():
        assert torch.equal(loaded(_images()), scripted(_images()))


def test_a_state_dict_named_like_torchscript_is_a_model_error(tmp_path):
    path = _save(_seeded(TinyNet).state_dict(), tmp_path / "weights.pt")
    with pytest.raises(ModelError, match="not a loadable TorchScript file"):
        build_module(path)


def test_declared_preprocessing():
    assert declared_preprocessing(DigitsCNN()) == DIGITS_PREPROCESSING
    assert declared_preprocessing(TinyNet()) is None


# --- Predictor ------------------------------------------------------------------------------------------------

def test_predictor_outputs_are_consistent_with_the_logits():
    module = _seeded(TinyNet, 9)
    images = _images((5, 3, 16, 16))
    with torch.inference_mode():
        logits = module(images)
        out = Predictor(module, top_k=4, logits=True).predict(images)

    probs = torch.softmax(logits, dim=1)
    assert set(out) == {"label", "score", "topk_label", "topk_score", "logits"}
    assert torch.equal(out["label"], logits.argmax(dim=1))
    assert out["label"].dtype == torch.int64
    assert torch.allclose(out["score"], probs.max(dim=1).values)
    assert out["topk_label"].shape == out["topk_score"].shape == (5, 4)
    assert torch.equal(out["topk_label"][:, 0], out["label"])
    assert torch.all(out["topk_score"][:, :-1] >= out["topk_score"][:, 1:])  # sorted, best first
    assert torch.allclose(out["topk_score"], probs.gather(1, out["topk_label"]))
    assert torch.equal(out["logits"], logits)


def test_predictor_embedding_is_the_input_of_the_last_linear():
    module = _seeded(TinyNet, 9)
    images = _images((3, 3, 16, 16))
    with torch.inference_mode():
        expected = torch.relu(module.hidden(module.features(images)))
        out = Predictor(module, top_k=1, embeddings=True).predict(images)
    assert "logits" not in out
    assert out["embedding"].shape == (3, 6)
    assert torch.equal(out["embedding"], expected)


def test_predictor_embedding_of_a_torchvision_model():
    module = _seeded(torchvision.models.mobilenet_v3_small, num_classes=10)
    captured = []
    # classifier = Linear, Hardswish, Dropout, Linear: the last Linear's input is the Dropout's output
    module.classifier[2].register_forward_hook(lambda _m, _i, output: captured.append(output))
    with torch.inference_mode():
        out = Predictor(module, top_k=2, embeddings=True).predict(_images())
    assert out["embedding"].shape == (PROBE[0], 1024)
    assert torch.equal(out["embedding"], captured[-1])


def test_predictor_accepts_tuple_and_named_outputs():
    class TupleOut(nn.Module):
        def forward(self, x):
            return x.flatten(1)[:, :3], "aux"

    class NamedOut(nn.Module):
        def forward(self, x):
            return types.SimpleNamespace(logits=x.flatten(1)[:, :3])

    images = _images((2, 3, 4, 4))
    for module in (TupleOut(), NamedOut()):
        out = Predictor(module, top_k=3, logits=True).predict(images)
        assert torch.equal(out["logits"], images.flatten(1)[:, :3])


def test_predictor_refuses_a_model_without_logits():
    class DictOut(nn.Module):
        def forward(self, x):
            return {"out": x}

    with pytest.raises(ModelError, match="returned dict; expected a tensor of logits"):
        Predictor(DictOut(), top_k=1).predict(_images((1, 3, 4, 4)))


def test_embeddings_need_a_linear_layer_in_an_nn_module():
    with pytest.raises(ModelError, match="has none"):
        Predictor(nn.Sequential(nn.Conv2d(3, 4, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten()), top_k=1, embeddings=True)
    with pytest.raises(ModelError, match="hooks cannot be added to TorchScript"):
        Predictor(torch.jit.script(TinyNet()), top_k=1, embeddings=True)


# --- resolve_endpoint and Endpoint ----------------------------------------------------------------------------

def test_resolve_uses_declared_preprocessing_and_default_top_k():
    resolved = resolve_endpoint(ModelSpec(DIGITS_FACTORY), embeddings=True)
    endpoint = resolved.endpoint
    assert endpoint.preprocessing == DIGITS_PREPROCESSING
    assert endpoint.preprocessing.resize == 32
    assert resolved.num_classes == 10
    assert endpoint.top_k == 5
    assert resolved.embedding_dim == 64
    assert endpoint.embeddings and not endpoint.logits
    assert len(endpoint.fingerprint) == 16
    assert endpoint.files == {}


def test_resolve_default_top_k_is_capped_by_the_class_count(factories):
    resolved = resolve_endpoint(ModelSpec(f"{FAKE_MODULE}:tiny3"))
    assert resolved.num_classes == 3
    assert resolved.endpoint.top_k == 3
    assert resolved.endpoint.preprocessing == Preprocessing()  # nothing declared: torchvision default
    assert resolved.embedding_dim is None


def test_resolve_explicit_preprocessing_wins_over_declared():
    prep = Preprocessing(resize=40, crop=32, mean=(0.1, 0.2, 0.3), std=(1, 1, 1))
    resolved = resolve_endpoint(ModelSpec(DIGITS_FACTORY, preprocessing=prep), top_k=2, logits=True)
    assert resolved.endpoint.preprocessing == prep
    assert resolved.endpoint.top_k == 2
    assert resolved.endpoint.logits


@pytest.mark.parametrize("top_k", [11, 0])
def test_resolve_refuses_top_k_outside_the_classes(top_k):
    with pytest.raises(ConfigError, match=f"--top-k {top_k}: must be between 1 and the model's 10 classes"):
        resolve_endpoint(ModelSpec(DIGITS_FACTORY), top_k=top_k)


def test_resolve_reports_a_crop_the_model_cannot_take():
    wrong = Preprocessing(resize=64, crop=64)  # DigitsCNN's classifier expects 32x32 input
    with pytest.raises(ModelError, match="failed on a 1x3x64x64 input.*check --crop/--resize"):
        resolve_endpoint(ModelSpec(DIGITS_FACTORY, preprocessing=wrong))


def test_resolve_records_the_files_to_ship(tmp_path):
    weights = _save(_seeded(DigitsCNN).state_dict(), tmp_path / "digits.pth")
    endpoint = resolve_endpoint(ModelSpec(DIGITS_FACTORY, weights=weights)).endpoint
    assert endpoint.weights == weights
    assert endpoint.files == {weights: "digits.pth"}


def test_endpoint_json_round_trip(tmp_path):
    weights = _save(_seeded(DigitsCNN).state_dict(), tmp_path / "digits.pth")
    endpoint = resolve_endpoint(ModelSpec(DIGITS_FACTORY, weights=weights), top_k=3, logits=True,
                                embeddings=True).endpoint
    restored = Endpoint.from_json(endpoint.to_json())
    assert restored == endpoint
    assert isinstance(restored.preprocessing, Preprocessing)
    assert restored.to_json() == endpoint.to_json()


def _endpoint(weights: str | None, **changes) -> Endpoint:
    base = Endpoint(source=DIGITS_FACTORY, weights=weights, preprocessing=DIGITS_PREPROCESSING, top_k=5)
    return dataclasses.replace(base, **changes).with_fingerprint()


def test_fingerprint_is_deterministic_and_follows_weight_contents(tmp_path):
    path = str(tmp_path / "w.pth")
    _save(_seeded(DigitsCNN).state_dict(), path)
    first = _endpoint(path).fingerprint
    assert _endpoint(path).fingerprint == first

    _save(_seeded(DigitsCNN).state_dict(), path)  # the same tensors saved again
    assert _endpoint(path).fingerprint == first

    state = _seeded(DigitsCNN).state_dict()
    state["classifier.3.bias"] = state["classifier.3.bias"] + 1
    _save(state, path)  # other contents, same path
    assert _endpoint(path).fingerprint != first


def test_fingerprint_follows_preprocessing_and_heads(tmp_path):
    base = _endpoint(None).fingerprint
    assert _endpoint(None, top_k=4).fingerprint != base
    assert _endpoint(None, logits=True).fingerprint != base
    assert _endpoint(None, embeddings=True).fingerprint != base
    assert _endpoint(None, preprocessing=Preprocessing(resize=33, crop=32)).fingerprint != base
    assert _endpoint(None, source="resnet18").fingerprint != base


def test_fingerprint_depends_on_weights_contents_not_their_path(tmp_path):
    a = _save(_seeded(DigitsCNN).state_dict(), tmp_path / "a.pth")
    b = str(tmp_path / "b.pth")
    shutil.copyfile(a, b)  # byte-identical (torch.save itself writes the file's stem into the archive)
    assert file_sha256(a) == file_sha256(b)
    assert _endpoint(a).fingerprint == _endpoint(b).fingerprint


def test_localised_swaps_shipped_paths_and_keeps_the_fingerprint(tmp_path):
    weights = _save(_seeded(DigitsCNN).state_dict(), tmp_path / "digits.pth")
    endpoint = resolve_endpoint(ModelSpec(DIGITS_FACTORY, weights=weights)).endpoint

    local = endpoint.localised(lambda name: f"/executor/files/{name}")

    assert local.weights == "/executor/files/digits.pth"
    assert local.source == DIGITS_FACTORY
    assert local.fingerprint == endpoint.fingerprint
