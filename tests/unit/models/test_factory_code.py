"""A `module:factory` model is named by its code's bytes and a weights file by its bytes: an edited factory (same
name, even the same size and modification time) is another fingerprint, another remembered check and, in a
process that imported it before (a warm sidecar), another model; unchanged files keep every key equal."""

from __future__ import annotations

import os
import sys
import uuid

import pytest
import torch

from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.loader import build_module
from spark_cnn.models.resolve_isolated import _cache_key
from spark_cnn.models.spec import Endpoint, ModelSpec

FACTORY = """import torch


def build():
    return torch.nn.Linear(2, {outputs})
"""


@pytest.fixture
def factory(tmp_path, monkeypatch):
    """(the module file of a fresh `module:build` factory on sys.path, its spec string)."""
    name = f"factory_{uuid.uuid4().hex[:12]}"  # unique: sys.modules outlives the test
    path = tmp_path / f"{name}.py"
    path.write_text(FACTORY.format(outputs=2))
    monkeypatch.syspath_prepend(str(tmp_path))
    return path, f"{name}:build"


def _rewrite_keeping_stat(path, text: str) -> None:
    """New bytes under the old size and modification time: what size and mtime alone cannot tell apart."""
    before = os.stat(path)
    path.write_text(text)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    after = os.stat(path)
    assert (after.st_size, after.st_mtime_ns) == (before.st_size, before.st_mtime_ns)


def _fingerprint(source: str, weights: str | None = None) -> str:
    return Endpoint(source, weights, Preprocessing(), top_k=1).with_fingerprint().fingerprint


def test_an_edited_factory_is_another_fingerprint_and_an_unchanged_one_the_same(factory, tmp_path):
    path, source = factory
    first = _fingerprint(source)
    assert _fingerprint(source) == first  # stable while nothing changes
    path.write_text(FACTORY.format(outputs=2) + "\n\ndef build_more():\n    return build()\n")
    edited = _fingerprint(source)
    assert edited != first
    _rewrite_keeping_stat(path, FACTORY.format(outputs=2) + "\n\ndef build_more():\n    return bulid()\n")
    assert _fingerprint(source) not in (first, edited)
    path.write_text(FACTORY.format(outputs=2))
    assert _fingerprint(source) == first  # the same bytes again: the same model
    (tmp_path / "helpers_beside.py").write_text("SCALE = 2\n")  # a sibling it can import by name
    assert _fingerprint(source) != first


def test_an_edited_factory_is_checked_again_not_remembered(factory):
    path, source = factory
    spec = ModelSpec(source)
    key = _cache_key(spec, {})
    assert _cache_key(spec, {}) == key
    _rewrite_keeping_stat(path, FACTORY.format(outputs=3))
    assert _cache_key(spec, {}) != key


def test_weights_rewritten_under_the_same_size_and_mtime_are_other_weights(tmp_path):
    weights = tmp_path / "w.pth"
    torch.save({"w": torch.zeros(4)}, weights)
    spec = ModelSpec("resnet18", weights=str(weights))
    key, fingerprint = _cache_key(spec, {}), _fingerprint("resnet18", str(weights))
    assert (_cache_key(spec, {}), _fingerprint("resnet18", str(weights))) == (key, fingerprint)
    before = os.stat(weights)
    torch.save({"w": torch.ones(4)}, weights)
    os.utime(weights, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert os.stat(weights).st_size == before.st_size
    assert _cache_key(spec, {}) != key
    assert _fingerprint("resnet18", str(weights)) != fingerprint


def test_a_process_that_built_a_factory_builds_its_edited_code(factory, monkeypatch):
    path, source = factory
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # bytecode cached beside it, as by default
    assert build_module(source).out_features == 2
    assert build_module(source).out_features == 2  # unchanged: the module imported once is used again
    assert list((path.parent / "__pycache__").glob(f"{path.stem}.*.pyc"))
    # Same size and mtime: the edited source must be compiled, not the cached bytecode of the old one.
    _rewrite_keeping_stat(path, FACTORY.format(outputs=3))
    assert build_module(source).out_features == 3


def test_factories_of_this_package_and_of_installed_ones_are_never_imported_again(monkeypatch):
    """Only the user's code is followed: this package's and torchvision's have no files to hash, so a change in
    their digest can never make a process drop and import them again (new classes under old names)."""
    from spark_cnn import errors
    from spark_cnn.models import factory_code, loader

    assert factory_code.factory_files("spark_cnn.models.digits") == ("", [])
    assert factory_code.factory_files("torchvision.models") == ("", [])
    monkeypatch.setitem(loader._imported_code, "spark_cnn.models.digits", "a digest from before an edit")
    assert loader._import_current("spark_cnn.models.digits") is sys.modules["spark_cnn.models.digits"]
    assert sys.modules["spark_cnn.errors"] is errors
