"""The model check's disk cache (models/check_cache.py) and its use by resolve_isolated: the key moves with what
the answer depends on, an entry is used only while the files it read are unchanged, and what must not be kept
(a failed check, an unpinned registry URI, an unreadable or foreign entry) is not. The child process is stood in
for by a function here; tests/integration/test_resolve_isolated.py runs the real one."""

from __future__ import annotations

import os
import pickle
import types

import pytest

from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models import check_cache, resolve_isolated
from spark_cnn.models.resolve import ResolvedModel
from spark_cnn.models.spec import Endpoint, ModelSpec
from spark_cnn.models.weights import ResolvedWeights


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache folder of this test's own, the cache on, and no answer remembered in this process."""
    monkeypatch.setenv(check_cache.CACHE_DIR_ENV, str(tmp_path / "caches"))
    monkeypatch.delenv(check_cache.CACHE_ENV, raising=False)
    monkeypatch.setattr(resolve_isolated, "_checked", {})
    return tmp_path / "caches" / check_cache.SUBDIR


def _resolved(weights_file: str | None = None, source: str = "resnet18") -> ResolvedModel:
    endpoint = Endpoint(source=source, weights=weights_file, preprocessing=Preprocessing(), top_k=5,
                        fingerprint="f" * 16)
    return ResolvedModel(endpoint=endpoint, num_classes=1000, embedding_dim=None,
                         weights=ResolvedWeights(file=weights_file, label="ResNet18_Weights.IMAGENET1K_V1",
                                                 categories=("tench", "goldfish")))


class Child:
    """Stands in for the child process: counts its starts, answers or raises as told."""

    def __init__(self, answer=None, error: Exception | None = None, code_files: tuple = ()):
        self.answer, self.error, self.code_files, self.starts = answer, error, code_files, 0

    def __call__(self, spec, options):
        self.starts += 1
        if self.error is not None:
            raise self.error
        return self.answer, self.code_files


def _check(spec: ModelSpec, child: Child, **options):
    """A check as a new process makes it: nothing remembered in memory, the disk cache as it is."""
    resolve_isolated._checked.clear()
    return resolve_isolated._remembered_check(spec, options, child)


def _key(spec: ModelSpec, **options) -> tuple:
    return check_cache.entry_key(spec, resolve_isolated._cache_key(spec, options))


def test_a_second_process_reads_the_answer_and_its_checkpoint_is_revalidated(cache, tmp_path):
    checkpoint = tmp_path / "hub" / "checkpoints" / "resnet18-f37072fd.pth"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"weights v1")
    spec = ModelSpec("resnet18", weights="DEFAULT")
    child = Child(_resolved(str(checkpoint)))
    first = _check(spec, child, top_k=5)
    again = _check(spec, child, top_k=5)
    assert child.starts == 1 and again == first and again is not first  # read back from disk
    assert len(os.listdir(cache)) == 1 and oct(os.stat(cache).st_mode & 0o777) == "0o700"
    entry = pickle.loads((cache / os.listdir(cache)[0]).read_bytes())
    assert (str(checkpoint), len(b"weights v1"), checkpoint.stat().st_mtime_ns) in entry["depends"]

    checkpoint.write_bytes(b"weights v2, re-downloaded")  # changed: checked again
    _check(spec, child, top_k=5)
    assert child.starts == 2
    _check(spec, child, top_k=5)
    assert child.starts == 2
    checkpoint.unlink()  # vanished: checked again (the child would download it)
    _check(spec, child, top_k=5)
    assert child.starts == 3
    _check(spec, child, top_k=4)  # other options: another entry
    assert child.starts == 4


def test_model_and_code_files_changed_or_vanished_miss(cache, tmp_path):
    weights = tmp_path / "w.pth"
    weights.write_bytes(b"state dict")
    factory = tmp_path / "my_models.py"
    factory.write_text("def build(): ...\n")
    spec = ModelSpec("my_models:build", weights=str(weights))
    child = Child(_resolved(str(weights), source="my_models:build"), code_files=(str(factory),))
    _check(spec, child)
    _check(spec, child)
    assert child.starts == 1
    factory.write_text("def build(): return 'another model'\n")  # the factory's code: the child recorded it
    _check(spec, child)
    assert child.starts == 2
    os.utime(weights, ns=(1, 1))  # the weights file (in the key itself)
    _check(spec, child)
    assert child.starts == 3
    factory.unlink()
    _check(spec, child)
    assert child.starts == 4


def test_versions_code_and_installed_packages_are_in_the_key(cache, tmp_path, monkeypatch):
    spec = ModelSpec("resnet18")
    base = _key(spec, top_k=5)
    assert base == _key(spec, top_k=5)
    assert dict(base[4])["torch"] and dict(base[4])["spark_cnn"]  # read from metadata, torch not imported for it
    assert base != _key(spec, top_k=4) and base != _key(ModelSpec("resnet34"), top_k=5)

    real = check_cache.importlib.metadata.version
    monkeypatch.setattr(check_cache.importlib.metadata, "version",
                        lambda name: "9.9.9" if name == "torchvision" else real(name))
    assert _key(spec, top_k=5) != base
    monkeypatch.undo()

    package = tmp_path / "spark_cnn"
    (package / "models").mkdir(parents=True)
    module = package / "models" / "resolve.py"
    module.write_text("x = 1\n")
    monkeypatch.setattr(check_cache, "_PACKAGE_DIR", str(package))
    before = check_cache._package_code()
    module.write_text("x = 2\n")  # same version, edited code
    assert check_cache._package_code() != before

    site_dir = tmp_path / "site-packages"
    site_dir.mkdir()
    monkeypatch.setattr(check_cache, "_library_roots", lambda: [str(site_dir)])
    before = check_cache._site_dirs()
    (site_dir / "timm-9.9.dist-info").mkdir()  # a package installed or upgraded
    assert check_cache._site_dirs() != before

    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    assert _key(spec, top_k=5)[1] != base[1] and _key(spec, top_k=5)[7] == str(tmp_path)


def test_a_version_change_misses_in_a_later_process(cache, monkeypatch):
    spec = ModelSpec("resnet18")
    child = Child(_resolved())
    _check(spec, child)
    real = check_cache.importlib.metadata.version
    monkeypatch.setattr(check_cache.importlib.metadata, "version",
                        lambda name: "3.0.0" if name == "torch" else real(name))
    _check(spec, child)
    assert child.starts == 2


def test_a_factory_is_keyed_by_the_working_directory(cache, tmp_path, monkeypatch):
    spec = ModelSpec("my_models:build")
    monkeypatch.chdir(tmp_path)
    here = _key(spec)
    (tmp_path / "other").mkdir()
    monkeypatch.chdir(tmp_path / "other")  # `my_models` may be another module there
    assert _key(spec) != here
    assert _key(ModelSpec("resnet18"))[-1] is None  # a torchvision name: any directory


@pytest.mark.parametrize("content", [b"", b"not a pickle", pickle.dumps(("a tuple", 1))[:-3], pickle.dumps([1, 2])])
def test_a_corrupt_entry_is_ignored_and_rewritten(cache, content):
    spec = ModelSpec("resnet18")
    child = Child(_resolved())
    _check(spec, child)
    (entry,) = list(cache.iterdir())
    entry.write_bytes(content)
    _check(spec, child)
    assert child.starts == 2
    _check(spec, child)
    assert child.starts == 2 and pickle.loads(entry.read_bytes())["resolved"] == _resolved()


def test_an_entry_naming_another_global_is_refused_unrun(cache, tmp_path):
    spec = ModelSpec("resnet18")
    key = _key(spec)
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return os.mkdir, (str(marker),)

    child = Child(_resolved())
    _check(spec, child)
    (entry,) = list(cache.iterdir())
    entry.write_bytes(pickle.dumps({"version": check_cache.ENTRY_VERSION, "key": key, "resolved": Payload(),
                                    "depends": ()}))
    _check(spec, child)
    assert child.starts == 2 and not marker.exists()


def test_an_entry_of_another_key_is_a_miss(cache):
    spec = ModelSpec("resnet18")
    child = Child(_resolved())
    _check(spec, child)
    (entry,) = list(cache.iterdir())
    stored = pickle.loads(entry.read_bytes())
    entry.write_bytes(pickle.dumps({**stored, "key": ("another",)}))  # a hash collision, in effect
    _check(spec, child)
    assert child.starts == 2


@pytest.mark.parametrize("error", [ModelError("--model broken: no"), ConfigError("--top-k 11: must be ...")])
def test_a_failed_check_is_not_cached(cache, error):
    spec = ModelSpec("resnet18")
    child = Child(error=error)
    for starts in (1, 2):
        with pytest.raises(type(error)):
            _check(spec, child)
        assert child.starts == starts
    assert not cache.exists() or not list(cache.iterdir())


def test_an_unpinned_registry_uri_is_never_cached(cache):
    for source in ("models:/classifier@champion", "models:/classifier/Production", "models:/classifier/latest"):
        child = Child(_resolved(source=source))
        _check(ModelSpec(source), child)
        _check(ModelSpec(source), child)
        assert child.starts == 2
    assert not cache.exists()
    child = Child(_resolved(source="models:/classifier/3"))  # a version number names one model forever
    _check(ModelSpec("models:/classifier/3"), child)
    _check(ModelSpec("models:/classifier/3"), child)
    assert child.starts == 1


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_the_cache_turns_off(cache, monkeypatch, value):
    monkeypatch.setenv(check_cache.CACHE_ENV, value)
    spec = ModelSpec("resnet18")
    child = Child(_resolved())
    _check(spec, child)
    _check(spec, child)
    assert child.starts == 2 and not cache.exists()


def test_the_folder_follows_the_cache_overrides(monkeypatch, tmp_path):
    monkeypatch.setenv(check_cache.CACHE_DIR_ENV, str(tmp_path / "profiles"))
    assert check_cache.cache_dir() == str(tmp_path / "profiles" / "model-checks")
    monkeypatch.delenv(check_cache.CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert check_cache.cache_dir() == str(tmp_path / "xdg" / "spark_cnn" / "model-checks")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert check_cache.cache_dir() == os.path.expanduser("~/.cache/spark_cnn/model-checks")


def test_entries_are_bounded_newest_kept(cache, monkeypatch):
    monkeypatch.setattr(check_cache, "MAX_ENTRIES", 3)
    child = Child(_resolved())
    for top_k in range(1, 6):
        _check(ModelSpec("resnet18"), child, top_k=top_k)
        newest = max(cache.iterdir(), key=lambda p: p.stat().st_mtime_ns)
        os.utime(newest, ns=(top_k * 10**9, top_k * 10**9))  # written in this order, whatever the clock's grain
    assert len(list(cache.iterdir())) == 3
    starts = child.starts
    _check(ModelSpec("resnet18"), child, top_k=5)  # among the newest: kept
    assert child.starts == starts
    _check(ModelSpec("resnet18"), child, top_k=1)  # the oldest: pruned
    assert child.starts == starts + 1


def test_a_folder_that_cannot_be_written_only_costs_the_check(monkeypatch, tmp_path):
    blocker = tmp_path / "a file"
    blocker.write_text("")
    monkeypatch.setenv(check_cache.CACHE_DIR_ENV, str(blocker))  # makedirs under a file fails
    monkeypatch.delenv(check_cache.CACHE_ENV, raising=False)
    monkeypatch.setattr(resolve_isolated, "_checked", {})
    child = Child(_resolved())
    assert _check(ModelSpec("resnet18"), child) == _resolved()


def test_loaded_code_files_are_the_users_not_the_libraries(tmp_path):
    user = tmp_path / "my_models.py"
    user.write_text("")
    modules = {
        "my_models": types.SimpleNamespace(__file__=str(user)),
        "os": os,  # the standard library: Python's version covers it
        "pytest": pytest,  # installed: the versions and the site folders' times cover it
        "spark_cnn.models.spec": types.SimpleNamespace(__file__=check_cache.__file__),  # spark_cnn's digest
        "torch._classes": types.SimpleNamespace(__file__="_classes.py"),  # torch names a file that is none
        "builtin": types.SimpleNamespace(),
    }
    assert check_cache.loaded_code_files(modules) == (os.path.realpath(user),)
