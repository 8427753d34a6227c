"""What a task does with each kind of ERROR reply, against a scripted peer on a real Unix socket (no sidecar
process): the request's own fault is that request's rows; a model, device or sidecar fault, or an ERROR that
names no kind, fails the task whatever on_error says."""

from __future__ import annotations

import os
import tempfile

import numpy as np
import pytest

from spark_cnn.imaging.preprocess import Preprocessing
from spark_cnn.models.spec import Endpoint
from spark_cnn.task import protocol
from spark_cnn.task.client import RequestFailed, SidecarClient, SidecarFault
from spark_cnn.task.protocol import ErrorKind, Kind
from tests.scripted_peer import WAIT_S, scripted_peer


def answer_first_request(error: dict):
    """A peer script: `error` as the ERROR reply to the client's first INFER."""
    def script(sock, hello) -> None:
        infer = protocol.recv_frame(sock)
        protocol.send_json(sock, Kind.ERROR, infer.request_id, error)
    return script


def reply_to_one_request(error: dict):
    """The client's receive() for one INFER answered with `error`: its return value, or what it raised."""
    with tempfile.TemporaryDirectory(prefix="scn") as directory:
        path = os.path.join(directory, "peer.sock")
        peer = scripted_peer(path, answer_first_request(error))
        endpoint = Endpoint("peer:model", None, Preprocessing(resize=4, crop=4), top_k=1, fingerprint="f" * 16)
        try:
            with SidecarClient(path, "token", endpoint, "job", timeout_s=WAIT_S) as client:
                client.submit(np.zeros((1, 4, 4, 3), np.uint8))
                try:
                    return client.receive()
                except Exception as e:
                    return e
        finally:
            peer.join(WAIT_S)


def test_a_request_error_is_that_requests_reply():
    request_id, reply = reply_to_one_request(protocol.error_reply("bad request: no images", ErrorKind.REQUEST))

    assert isinstance(reply, RequestFailed) and "bad request: no images" in str(reply)


@pytest.mark.parametrize("kind", [ErrorKind.MODEL, ErrorKind.DEVICE, ErrorKind.STICKY, ErrorKind.SIDECAR])
def test_a_model_device_or_sidecar_error_fails_the_task_naming_the_cause(kind):
    raised = reply_to_one_request(protocol.error_reply("failure on a batch of 1: RuntimeError: boom", kind))

    assert isinstance(raised, SidecarFault), raised
    assert raised.kind == kind and raised.pid == 4242
    assert str(raised).startswith(f"{kind.value} failure in the sidecar pid 4242 at ")
    assert "RuntimeError: boom" in str(raised) and "\n" not in str(raised)


@pytest.mark.parametrize("payload", [{"message": "no kind"}, {"message": "?", "kind": "cosmic rays"}])
def test_an_error_that_names_no_known_kind_fails_the_task(payload):
    raised = reply_to_one_request(payload)

    assert isinstance(raised, SidecarFault) and raised.kind == ErrorKind.SIDECAR
