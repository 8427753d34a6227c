"""Shared by every test layer: the demo assets and saved model weights, made once per session, and the rule
that marks integration and e2e tests slow."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
# Every test of these layers starts Spark or the real commands.
SLOW_LAYERS = ("integration", "e2e")


def pytest_collection_modifyitems(config, items):
    """Integration and e2e tests are `slow` without saying so; unit tests start none (tests/unit/conftest.py)."""
    for item in items:
        layer = os.path.relpath(str(item.path), TESTS_DIR).split(os.sep)[0]
        if layer in SLOW_LAYERS:
            item.add_marker(pytest.mark.slow)


@contextlib.contextmanager
def _private_dir_in_env(variable: str, prefix: str):
    """A fresh temporary directory named by `variable` in this process's environment (children inherit it),
    the previous value restored and the directory removed afterwards."""
    folder = tempfile.mkdtemp(prefix=prefix)
    previous = os.environ.get(variable)
    os.environ[variable] = folder
    try:
        yield folder
    finally:
        if previous is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = previous
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def private_device_cache():
    """An empty device-profile cache for the whole run (sidecars inherit it): a profile this machine once
    calibrated must not change which batch size tests start from. Model checks are cached beneath it
    (models/check_cache.py), shared by this run's jobs only; a test that needs the check's child to run gives
    itself an empty folder (tests/integration/test_resolve_isolated.py)."""
    from spark_cnn.perf.startpoint import CACHE_DIR_ENV

    with _private_dir_in_env(CACHE_DIR_ENV, "spark_cnn_devices_") as folder:
        yield folder


@pytest.fixture(scope="session", autouse=True)
def private_runtime_dir():
    """Sidecar sockets and files of this run in their own 0700 directory (sidecars and Spark workers inherit it),
    so concurrent runs on one machine never see each other's sidecars."""
    from spark_cnn.task.launcher import RUNTIME_DIR_ENV

    with _private_dir_in_env(RUNTIME_DIR_ENV, "spark_cnn_run_") as folder:
        yield folder


# A pytest run started by another (tests/e2e/test_spark35.py) reuses that run's demo assets, named here.
SHARED_DEMO_DIR_ENV = "SPARK_CNN_TEST_DEMO_DIR"


@pytest.fixture(scope="session")
def demo_assets():
    """The demo's digits folder, labels and trained weights (as `make run` makes them), cached per machine and
    code version (tests/demo_cache.py). Tests read them and never write there."""
    from spark_cnn.models.digits import prepare_demo
    from tests.demo_cache import cached_demo

    if os.environ.get(SHARED_DEMO_DIR_ENV):
        return prepare_demo(os.environ[SHARED_DEMO_DIR_ENV])  # the starting run's
    return cached_demo()


@pytest.fixture(scope="session")
def mobilenet_weights(tmp_path_factory) -> str:
    """A random mobilenet_v3_small, saved as a state_dict (weights cannot be downloaded here).

    At torchvision's initialisation its logits are ~1e-10 and all alike; random batch-norm statistics and a
    larger classifier make outputs differ between images and classes, so comparisons mean something.
    """
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.mobilenet_v3_small()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.running_mean.normal_(0, 0.1)
                module.running_var.uniform_(0.5, 1.5)
                module.weight.uniform_(0.5, 1.5)
                module.bias.normal_(0, 0.1)
        model.classifier[-1].weight.normal_(0, 0.1)
    path = str(tmp_path_factory.mktemp("weights") / "mobilenet_v3_small.pt")
    torch.save(model.state_dict(), path)
    return path
