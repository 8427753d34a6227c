"""A scripted sidecar: a listener on a real Unix socket whose one connection gets READY to its HELLO and then
whatever the test's script sends, so client behaviour is tested against exact frames with no sidecar process."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

from spark_cnn.task import protocol
from spark_cnn.task.protocol import Kind

WAIT_S = 10.0  # any step of the peer fails the test rather than hang it beyond this


def scripted_peer(path: str, script: Callable[[socket.socket, protocol.Frame], None], *,
                  ready: dict | None = None) -> threading.Thread:
    """Listen at `path`; answer the one client's HELLO with READY (`ready`, default pid 4242 decoding in the
    task), run `script(sock, hello)`, then read until the client closes. Returns the serving thread."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(1)
    listener.settimeout(WAIT_S)

    def serve() -> None:
        sock, _ = listener.accept()
        sock.settimeout(WAIT_S)
        with sock, listener:
            hello = protocol.recv_frame(sock, max_bytes=protocol.MAX_HANDSHAKE_BYTES)
            protocol.send_json(sock, Kind.READY, hello.request_id, ready or {"pid": 4242, "decode": "task"})
            script(sock, hello)
            try:
                protocol.recv_frame(sock)  # until the client closes
            except (protocol.ConnectionClosed, OSError):
                pass

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread
