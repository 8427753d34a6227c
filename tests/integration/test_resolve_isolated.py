"""The driver's model check in a child process: same answer, same errors, cached (in the process and on disk: a
second fresh interpreter starts no child), and torch never loads in the caller."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from spark_cnn.models.digits import DIGITS_FACTORY
from tests.sidecar_doubles import RAW_GRID_FACTORY

# Resolves the model in a child process.
pytestmark = pytest.mark.slow

# Counts the processes this interpreter starts (an audit hook: nothing of the code under test is replaced).
COUNT_CHILDREN = """
import sys
children = []
sys.addaudithook(lambda event, args: event == "subprocess.Popen" and children.append(args))
"""

SCRIPT = COUNT_CHILDREN + """
from spark_cnn.errors import ConfigError, ModelError
from spark_cnn.models.resolve_isolated import resolve_endpoint_isolated
from spark_cnn.models.spec import ModelSpec
resolved = resolve_endpoint_isolated(ModelSpec(%(factory)r), top_k=3, logits=True)
print(resolved.num_classes, resolved.endpoint.top_k, resolved.endpoint.logits, resolved.endpoint.fingerprint)
print("cached:", resolve_endpoint_isolated(ModelSpec(%(factory)r), top_k=3, logits=True) is resolved)
try:
    resolve_endpoint_isolated(ModelSpec(%(factory)r), top_k=11)
except ConfigError as e:
    print("ConfigError", e)
raw = resolve_endpoint_isolated(ModelSpec(%(raw)r), output_kind="raw")
print("raw:", raw.raw_shape, raw.num_classes, raw.endpoint.output_kind)
try:
    resolve_endpoint_isolated(ModelSpec(%(raw)r))
except (ConfigError, ModelError) as e:
    print(type(e).__name__, e)
print("torch loaded:", "torch" in sys.modules, "children:", len(children))
"""

# A later job start over the same models, in a fresh interpreter: both answers come from the disk cache.
AGAIN = COUNT_CHILDREN + """
from spark_cnn.models.resolve_isolated import resolve_endpoint_isolated
from spark_cnn.models.spec import ModelSpec
resolved = resolve_endpoint_isolated(ModelSpec(%(factory)r), top_k=3, logits=True)
raw = resolve_endpoint_isolated(ModelSpec(%(raw)r), output_kind="raw")
print(resolved.endpoint.fingerprint, raw.raw_shape, "torch loaded:", "torch" in sys.modules, "children:", len(children))
"""


def _env(tmp_path, **extra) -> dict:
    """The test's environment with a model-check cache of its own: the first check must run in the child."""
    from spark_cnn.models.check_cache import CACHE_DIR_ENV, CACHE_ENV

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), CACHE_DIR_ENV: str(tmp_path / "caches"), **extra}
    env.pop(CACHE_ENV, None)
    return env


def test_child_process_check_matches_in_process_and_keeps_torch_out(tmp_path):
    from spark_cnn.models.check_cache import SUBDIR
    from spark_cnn.models.resolve import resolve_endpoint
    from spark_cnn.models.spec import ModelSpec

    env = _env(tmp_path)
    names = {"factory": DIGITS_FACTORY, "raw": RAW_GRID_FACTORY}
    out = subprocess.run([sys.executable, "-c", SCRIPT % names], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    first, cached, error, raw, refused, torch_line = out.stdout.strip().splitlines()
    expected = resolve_endpoint(ModelSpec(DIGITS_FACTORY), top_k=3, logits=True)
    assert first.split() == ["10", "3", "True", expected.endpoint.fingerprint]
    assert cached == "cached: True"  # the same check again reuses the first answer
    assert error.startswith("ConfigError --top-k 11")
    # A model that is not a classifier passes the child's check with --output raw; without, it is told to use it.
    assert raw == "raw: (2, 3, 3) None raw"
    assert refused.startswith(f"ConfigError --model {RAW_GRID_FACTORY} is a segmenter") and (
        "for any other tensor use --output raw" in refused)
    # Four checks ran in children; the two that passed are kept on disk, the two refused are not.
    assert torch_line == "torch loaded: False children: 4"
    assert len(os.listdir(tmp_path / "caches" / SUBDIR)) == 2

    again = subprocess.run([sys.executable, "-c", AGAIN % names], capture_output=True, text=True, timeout=60, env=env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.split() == [expected.endpoint.fingerprint, "(2,", "3,", "3)", "torch", "loaded:", "False",
                                    "children:", "0"]


NAMED = COUNT_CHILDREN + """
from spark_cnn.models.resolve_isolated import resolve_endpoint_isolated
from spark_cnn.models.spec import ModelSpec
resolved = resolve_endpoint_isolated(ModelSpec("mobilenet_v3_small", weights="DEFAULT"))
print(resolved.weights.label, resolved.endpoint.weights, len(resolved.weights.categories),
      resolved.endpoint.preprocessing.resize)
print("torch loaded:", "torch" in sys.modules, "children:", len(children))
"""


def test_named_weights_resolve_in_the_child_from_torch_home(tmp_path):
    """The child reads TORCH_HOME from the environment it inherits, and hands back the cached file to ship; the
    next interpreter reads that answer from disk while the file is unchanged, and checks again once it is not."""
    from tests.torch_home import seed_weights

    home = str(tmp_path / "torch_home")
    path = seed_weights(home, "mobilenet_v3_small")
    env = _env(tmp_path, TORCH_HOME=home)
    for children in ("1", "0"):
        out = subprocess.run([sys.executable, "-c", NAMED], capture_output=True, text=True, timeout=120, env=env)
        assert out.returncode == 0, out.stderr[-2000:]
        resolved, torch_line = out.stdout.strip().splitlines()
        assert resolved.split() == ["MobileNet_V3_Small_Weights.IMAGENET1K_V1", path, "1000", "256"]
        assert torch_line == f"torch loaded: False children: {children}"
