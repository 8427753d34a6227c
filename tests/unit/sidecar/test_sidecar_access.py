"""Who can use a sidecar: only this user (0700 directory, 0600 socket and info file), only with the sidecar's
random token, never over the network; refusals are logged without any token; weights never run code."""

from __future__ import annotations

import ast
import json
import os
import stat

import pytest
import torch

from spark_cnn.errors import ModelError, SidecarError
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.loader import build_module
from spark_cnn.sidecar.server import SidecarServer, SidecarSettings
from spark_cnn.task.launcher import (
    RUNTIME_DIR_ENV,
    LaunchOptions,
    SidecarInfo,
    ensure_sidecar,
    find_sidecars,
    runtime_dir,
    sidecar_name,
)
from spark_cnn.task.procs import ExecutorProcess, process_id


def test_runtime_directory_of_another_user_is_refused(tmp_path, monkeypatch):
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory to another user")
    other = tmp_path / "other"
    other.mkdir(mode=0o700)
    os.chown(other, 12345, 12345)
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(other))
    with pytest.raises(SidecarError, match="belongs to uid 12345"):
        runtime_dir()


@pytest.mark.parametrize("mode", [0o755, 0o770, 0o777, 0o1777])
def test_an_existing_runtime_directory_open_to_others_is_refused_not_fixed(tmp_path, monkeypatch, mode):
    folder = tmp_path / "open"
    folder.mkdir()
    os.chmod(folder, mode)
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(folder))
    with pytest.raises(SidecarError, match=rf"is open to other users \(mode {mode:04o}\).*chmod 700 {folder}"):
        runtime_dir()
    assert stat.S_IMODE(os.stat(folder).st_mode) == mode, "an open directory must not be silently trusted"


def test_a_runtime_directory_that_is_a_symlink_is_refused(tmp_path, monkeypatch):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    link = tmp_path / "link"
    link.symlink_to(private)
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(link))
    with pytest.raises(SidecarError, match=f"{link} is a symbolic link; remove it or set {RUNTIME_DIR_ENV}"):
        runtime_dir()
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(dangling))
    with pytest.raises(SidecarError, match="is a symbolic link"):
        runtime_dir()
    assert not (tmp_path / "nowhere").exists(), "nothing may be created through a symlink"


def test_a_runtime_path_that_is_a_file_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "file"
    path.write_text("")
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(path))
    with pytest.raises(SidecarError, match=f"{path} is not a directory"):
        runtime_dir()


def test_a_missing_runtime_directory_is_created_private(tmp_path, monkeypatch):
    path = tmp_path / "a" / "rt"
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(path))
    old_umask = os.umask(0)  # the most open umask: the directory must still be 0700
    try:
        assert runtime_dir() == str(path)
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE(os.lstat(path).st_mode) == 0o700


@pytest.fixture
def private_runtime(tmp_path, monkeypatch) -> str:
    folder = tmp_path / "rt"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv(RUNTIME_DIR_ENV, str(folder))
    return str(folder)


def _info_fields(base: str, **overrides) -> dict:
    return {"pid": os.getpid(), "socket": base + ".sock", "token": "t" * 32, "device": "cpu", "host": "h",
            "app_id": "app", "executor": "driver", **overrides}


def test_a_genuine_info_file_is_read(private_runtime):
    base = os.path.join(private_runtime, "sc-0123456789abcdef")
    with open(base + ".json", "w") as f:
        json.dump(_info_fields(base), f)
    assert SidecarInfo.read(base + ".json") == SidecarInfo(**_info_fields(base))


def test_an_info_file_that_is_a_symlink_is_refused(private_runtime, tmp_path):
    base = os.path.join(private_runtime, "sc-0123456789abcdef")
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text(json.dumps(_info_fields(base)))
    os.symlink(elsewhere, base + ".json")
    with pytest.raises(SidecarError, match=rf"{base}\.json is a symbolic link; no sidecar .* rm {base}\.json"):
        SidecarInfo.read(base + ".json")


def test_an_info_file_that_is_not_a_regular_file_is_refused(private_runtime):
    base = os.path.join(private_runtime, "sc-0123456789abcdef")
    os.mkdir(base + ".json")
    with pytest.raises(SidecarError, match="is not a regular file"):
        SidecarInfo.read(base + ".json")


def test_an_info_file_of_another_user_is_refused(private_runtime):
    if os.getuid() != 0:
        pytest.skip("needs root to give a file to another user")
    base = os.path.join(private_runtime, "sc-0123456789abcdef")
    with open(base + ".json", "w") as f:
        json.dump(_info_fields(base), f)
    os.chown(base + ".json", 12345, 12345)
    with pytest.raises(SidecarError, match="belongs to uid 12345, not to this user"):
        SidecarInfo.read(base + ".json")


@pytest.mark.parametrize("where", ["elsewhere", "another name", "relative"])
def test_an_info_file_naming_another_socket_is_refused(private_runtime, tmp_path, where):
    base = os.path.join(private_runtime, "sc-0123456789abcdef")
    socket_path = {"elsewhere": str(tmp_path / "sc-0123456789abcdef.sock"),
                   "another name": os.path.join(private_runtime, "sc-fedcba9876543210.sock"),
                   "relative": "sc-0123456789abcdef.sock"}[where]
    with open(base + ".json", "w") as f:
        json.dump(_info_fields(base, socket=socket_path), f)
    with pytest.raises(SidecarError, match=f"names socket '{socket_path}', not {base}.sock"):
        SidecarInfo.read(base + ".json")


def test_ensure_sidecar_refuses_a_planted_info_file_and_starts_nothing(private_runtime):
    executor = ExecutorProcess(process_id(os.getpid()), "driver")
    options = LaunchOptions(app_id="planted", device="cpu")
    base = os.path.join(private_runtime, sidecar_name(options.app_id, executor, options.device))
    with open(base + ".json", "w") as f:  # an attacker's sidecar: its pid runs, its socket is elsewhere
        json.dump(_info_fields(base, socket="/tmp/attacker.sock"), f)
    with pytest.raises(SidecarError, match="names socket '/tmp/attacker.sock'"):
        ensure_sidecar(options, executor)
    assert sorted(os.listdir(private_runtime)) == [os.path.basename(base) + ".json"], "nothing may start"


def test_listing_sidecars_skips_a_planted_info_file(private_runtime, tmp_path):
    elsewhere = tmp_path / "planted.json"
    elsewhere.write_text("{}")
    os.symlink(elsewhere, os.path.join(private_runtime, "sc-0123456789abcdef.json"))
    assert find_sidecars() == []


def _idle_server(folder) -> SidecarServer:
    """An in-process CPU sidecar on `folder`/sc.sock that exits after 0.1 s without a client."""
    return SidecarServer(SidecarSettings(socket_path=str(folder / "sc.sock"), info_path=str(folder / "sc.json"),
                                         device="cpu", idle_timeout_s=0.1))


@pytest.mark.parametrize("problem", ["open", "symlink"])
def test_the_sidecar_creates_nothing_in_a_directory_that_is_not_private(tmp_path, problem):
    real = tmp_path / "real"
    real.mkdir(mode=0o777 if problem == "open" else 0o700)
    os.chmod(real, 0o777 if problem == "open" else 0o700)
    folder = real if problem == "open" else tmp_path / "link"
    if problem == "symlink":
        folder.symlink_to(real)
    with pytest.raises(SidecarError, match="is open to other users" if problem == "open" else "is a symbolic link"):
        _idle_server(folder).serve_forever()
    assert os.listdir(real) == []


def test_the_sidecar_never_writes_its_info_through_a_planted_symlink(tmp_path):
    folder = tmp_path / "rt"
    folder.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep")
    os.symlink(victim, f"{folder / 'sc.json'}.{os.getpid()}.tmp")  # the name of the info file's temporary copy
    _idle_server(folder).serve_forever()
    assert victim.read_text() == "keep", "the sidecar wrote its info (and token) through a symlink"


class _Payload:
    """Unpickling this runs a command: what a malicious weights file would do."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_weights_that_would_run_code_are_refused(tmp_path):
    marker = tmp_path / "pwned"
    weights_file = tmp_path / "evil.pt"
    torch.save({"conv.weight": torch.zeros(1), "payload": _Payload(str(marker))}, weights_file)

    with pytest.raises(ModelError, match="not a loadable state_dict"):
        build_module(DIGITS_FACTORY, str(weights_file))
    assert not marker.exists(), "unpickling the weights ran code"


def test_no_package_code_unpickles_without_an_allow_list_or_loads_torch_files_unsafely():
    """Pickle runs code: dataset metadata and weights must never be unpickled freely. Any module that unpickles
    must restrict the classes (a find_class allow-list); torch.load must pass weights_only=True."""
    package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    offenders = []
    for root, _, names in os.walk(os.path.join(package, "spark_cnn")):
        for name in (n for n in names if n.endswith(".py")):
            path = os.path.join(root, name)
            with open(path) as f:
                text = f.read()
            unpickles = any(call in text for call in ("pickle.load", "pickle.Unpickler", "pickle._Unpickler",
                                                       "cloudpickle.load", "dill.load"))
            if unpickles and "def find_class" not in text:
                offenders.append(f"{path}: unpickles without a find_class allow-list")
            for call in _torch_load_calls(text):
                if not any(k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                           for k in call.keywords):
                    offenders.append(f"{path}:{call.lineno}: torch.load without weights_only=True")
    assert not offenders, offenders


def _torch_load_calls(source: str) -> list[ast.Call]:
    """Every `torch.load(...)` call in a module, however its arguments are written."""
    return [node for node in ast.walk(_parsed(source)) if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"]


def _parsed(source: str) -> ast.Module:
    """ast.parse, once more after CPython 3.11's spurious "AST constructor recursion depth mismatch" SystemError
    (cpython gh-106905: an error inside the AST's construction is reported as that mismatch; it struck one
    `make test` run in four here, beside other test workers' threads). A real fault of the source is a
    SyntaxError and still fails."""
    try:
        return ast.parse(source)
    except SystemError:
        return ast.parse(source)
