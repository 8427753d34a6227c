"""The pinned test environments' cache (tests/e2e/cached_env.py): built once under concurrent set-ups, rebuilt
after a crash, keyed by pins and borrowed host paths. (`_build` is replaced: these tests check the locking, the
stamp and the key, not pip.)"""

from __future__ import annotations

import dataclasses
import os
import threading
import time

from tests.e2e import cached_env
from tests.e2e.petastorm_env import PETASTORM_ENV
from tests.e2e.spark35_env import SPARK35_ENV


def _fake_build(calls: list):
    def build(env, env_dir: str) -> None:
        calls.append(env_dir)
        time.sleep(0.2)  # long enough for the other set-ups to arrive while this one builds
        os.makedirs(os.path.join(env_dir, "bin"), exist_ok=True)
        with open(os.path.join(env_dir, cached_env.STAMP), "w") as f:
            f.write("built\n")
    return build


def test_concurrent_setups_build_once_and_share_it(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setenv(PETASTORM_ENV.cache_root_env, str(tmp_path))
    monkeypatch.setattr(cached_env, "_build", _fake_build(calls))
    pythons: list = []
    threads = [threading.Thread(target=lambda: pythons.append(cached_env.cached_python(PETASTORM_ENV)))
               for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(set(pythons)) == 1 and len(pythons) == 4
    assert pythons[0] == os.path.join(str(tmp_path), PETASTORM_ENV.key(), "bin", "python")


def test_a_half_built_env_is_removed_and_rebuilt(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setenv(PETASTORM_ENV.cache_root_env, str(tmp_path))
    monkeypatch.setattr(cached_env, "_build", _fake_build(calls))
    leftover = tmp_path / PETASTORM_ENV.key() / "lib" / "partial"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("a build that died")
    cached_env.cached_python(PETASTORM_ENV)
    assert calls and not leftover.exists()


def test_the_key_follows_the_pins_and_the_borrowed_host_paths():
    key = PETASTORM_ENV.key()
    assert dataclasses.replace(PETASTORM_ENV, requirements=(*PETASTORM_ENV.requirements, "six==1.17.0")).key() != key
    assert dataclasses.replace(PETASTORM_ENV, host_paths=("/elsewhere/site-packages",)).key() != key
    assert dataclasses.replace(SPARK35_ENV, host_paths=("/elsewhere/site-packages",)).key() != SPARK35_ENV.key()


def test_each_env_has_its_own_cache_folder(tmp_path, monkeypatch):
    monkeypatch.delenv(PETASTORM_ENV.cache_root_env, raising=False)
    monkeypatch.delenv(SPARK35_ENV.cache_root_env, raising=False)
    assert PETASTORM_ENV.cache_root() != SPARK35_ENV.cache_root()
    monkeypatch.setenv(SPARK35_ENV.cache_root_env, str(tmp_path))
    assert SPARK35_ENV.directory() == os.path.join(str(tmp_path), SPARK35_ENV.key())


def test_the_cached_demo_is_keyed_by_the_sources_it_is_made_from(tmp_path, monkeypatch):
    from tests import demo_cache

    package = tmp_path / "spark_cnn"
    for rel in ("models/digits.py", "models/tensors.py", "imaging/decode.py", "imaging/readme.txt"):
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        (package / rel).write_text(f"# {rel}\n")
    monkeypatch.setattr(demo_cache, "PACKAGE", str(package))
    first = demo_cache.demo_key()
    (package / "imaging" / "readme.txt").write_text("not a source\n")
    assert demo_cache.demo_key() == first
    (package / "imaging" / "decode.py").write_text("# the decoder changed\n")
    assert demo_cache.demo_key() != first
