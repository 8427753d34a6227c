"""The pinned petastorm environment's cache: built once under concurrent set-ups, rebuilt after a crash.
(`_build` is replaced: these tests check the locking and the stamp, not pip.)"""

from __future__ import annotations

import os
import threading
import time

from tests.e2e import petastorm_env


def _fake_build(calls: list):
    def build(env_dir: str) -> None:
        calls.append(env_dir)
        time.sleep(0.2)  # long enough for the other set-ups to arrive while this one builds
        os.makedirs(os.path.join(env_dir, "bin"), exist_ok=True)
        with open(os.path.join(env_dir, petastorm_env.STAMP), "w") as f:
            f.write("built\n")
    return build


def test_concurrent_setups_build_once_and_share_it(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setenv(petastorm_env.CACHE_ROOT_ENV, str(tmp_path))
    monkeypatch.setattr(petastorm_env, "_build", _fake_build(calls))
    pythons: list = []
    threads = [threading.Thread(target=lambda: pythons.append(petastorm_env.petastorm_python())) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(set(pythons)) == 1 and len(pythons) == 4
    assert pythons[0] == os.path.join(str(tmp_path), petastorm_env.env_key(), "bin", "python")


def test_a_half_built_env_is_removed_and_rebuilt(tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setenv(petastorm_env.CACHE_ROOT_ENV, str(tmp_path))
    monkeypatch.setattr(petastorm_env, "_build", _fake_build(calls))
    leftover = tmp_path / petastorm_env.env_key() / "lib" / "partial"
    leftover.parent.mkdir(parents=True)
    leftover.write_text("a build that died")
    petastorm_env.petastorm_python()
    assert calls and not leftover.exists()


def test_the_key_follows_the_pins(monkeypatch):
    key = petastorm_env.env_key()
    monkeypatch.setattr(petastorm_env, "PINNED_REQUIREMENTS", (*petastorm_env.PINNED_REQUIREMENTS, "six==1.17.0"))
    assert petastorm_env.env_key() != key
