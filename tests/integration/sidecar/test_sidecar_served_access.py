"""Who can reach a running sidecar: Unix sockets only, files private to the user, the token checked and never
logged. The rules that need no running sidecar are tests/unit/sidecar/test_sidecar_access.py."""

from __future__ import annotations

import os
import socket
import stat

import pytest

from spark_cnn.errors import SidecarError
from spark_cnn.task import protocol
from spark_cnn.task.client import SidecarClient
from spark_cnn.task.protocol import Kind

# conftest.py gives the sidecar fixtures (runtime, weights, endpoint, shared).

INET_TABLES = ("tcp", "tcp6", "udp", "udp6", "raw", "raw6")


def socket_inodes(pid: int) -> set[str]:
    """Inodes of the sockets among the process's open files (/proc/PID/fd -> 'socket:[INODE]')."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    return inodes


def table_inodes(pid: int, table: str) -> set[str]:
    """Socket inodes listed in /proc/PID/net/TABLE (the inode is column 10 of tcp/udp/raw, column 7 of unix)."""
    column = 6 if table == "unix" else 9
    try:
        with open(f"/proc/{pid}/net/{table}") as f:
            return {line.split()[column] for line in f.readlines()[1:] if len(line.split()) > column}
    except FileNotFoundError:  # e.g. no IPv6 in this kernel
        return set()


def sidecar_log(info) -> str:
    with open(os.path.splitext(info.socket)[0] + ".log") as f:
        return f.read()


def test_the_sidecar_has_only_unix_sockets(shared, endpoint):
    _, info = shared
    with SidecarClient(info.socket, info.token, endpoint, job="sockets"):  # a served connection is open too
        sockets = socket_inodes(info.pid)
        unix = table_inodes(info.pid, "unix")
        inet = set().union(*(table_inodes(info.pid, table) for table in INET_TABLES))

    assert sockets, "the sidecar should have its listening socket open"
    assert not sockets & inet, f"the sidecar has network sockets: {sorted(sockets & inet)}"
    assert sockets <= unix, f"sockets that are not Unix sockets: {sorted(sockets - unix)}"


def test_files_are_private_to_the_user(shared):
    app, info = shared
    assert stat.S_IMODE(os.stat(os.path.dirname(info.socket)).st_mode) == 0o700
    assert os.stat(os.path.dirname(info.socket)).st_uid == os.getuid()
    assert stat.S_IMODE(os.stat(info.socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(app.base() + ".json").st_mode) == 0o600


@pytest.mark.parametrize("presented", [None, "", "f" * 32, "0123456789abcdef-intruder-token", "tökén"],
                         ids=["missing", "empty", "wrong", "wrong-length", "non-ascii"])
def test_a_client_without_the_token_is_refused_and_logged_without_tokens(shared, endpoint, presented):
    _, info = shared
    hello = {"endpoint": endpoint.to_json(), "job": "intruder"}
    if presented is not None:
        hello["token"] = presented
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(info.socket)
        protocol.send_json(sock, Kind.HELLO, 1, hello)
        reply = protocol.recv_frame(sock)
        with pytest.raises(protocol.ConnectionClosed):
            protocol.recv_frame(sock)

    assert (reply.kind, reply.json()["message"]) == (Kind.ERROR, "refused: wrong sidecar token")
    log_text = sidecar_log(info)
    assert f"refused a client with a wrong token (pid {os.getpid()}" in log_text
    assert info.token not in log_text
    if presented:
        assert presented not in log_text


def test_the_client_library_reports_a_refusal(shared, endpoint):
    _, info = shared
    with pytest.raises(SidecarError, match="refused"):
        SidecarClient(info.socket, "x" * len(info.token), endpoint, job="intruder")
