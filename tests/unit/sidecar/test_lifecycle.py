"""When the sidecar exits, decided from plain values: its executor's end is final, idling out is not."""

from __future__ import annotations

from spark_cnn.sidecar.lifecycle import exit_reason


def test_the_executors_end_exits_for_good_even_with_connections_open():
    assert exit_reason(gone=4242, connections=3, idle_for_s=0.0, idle_timeout_s=60.0) == (
        "executor process 4242 is gone", True)


def test_an_idle_sidecar_exits_once_the_timeout_has_passed_without_connections():
    assert exit_reason(None, 0, idle_for_s=61.0, idle_timeout_s=60.0) == ("idle for 60 s", False)
    assert exit_reason(None, 0, idle_for_s=59.0, idle_timeout_s=60.0) == (None, False)


def test_an_open_connection_keeps_an_idle_sidecar():
    assert exit_reason(None, 1, idle_for_s=1e6, idle_timeout_s=60.0) == (None, False)
