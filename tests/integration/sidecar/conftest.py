"""Fixtures of the sidecar process tests: a private runtime directory, the demo CNN's weights, endpoint and
reference (tests/sidecar_fixtures.py), one shared running sidecar, and a fresh fake application per test."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator

import pytest

from spark_cnn.task.launcher import RUNTIME_DIR_ENV, SidecarInfo, ensure_sidecar
from tests.sidecar_fixtures import endpoint, reference, weights  # noqa: F401  (fixtures, found by name)
from tests.sidecar_harness import FakeApp, fake_app


@pytest.fixture(scope="module")
def runtime() -> Iterator[str]:
    """A private runtime directory that does not exist yet (the launcher must create it 0700)."""
    base = tempfile.mkdtemp(prefix="scn")
    path = os.path.join(base, "rt")
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(RUNTIME_DIR_ENV, path)
            yield path
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="module")
def shared(runtime: str) -> Iterator[tuple[FakeApp, SidecarInfo]]:
    """One running sidecar for the tests that do not stop it."""
    with fake_app("shared") as app:
        yield app, ensure_sidecar(app.options(), app.executor)


@pytest.fixture
def app(runtime: str) -> Iterator[FakeApp]:
    with fake_app("own") as fresh:
        yield fresh
