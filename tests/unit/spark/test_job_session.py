"""job_session (spark/job_io.py) ends a session it started before this host's sidecars of its application: a
task of a failed job that still runs could otherwise start a sidecar after they were stopped, which nothing would
stop. What the sidecars' stop needs (the application, whether the executors end with the session) is read
before the session stops, as a local Connect server's stop ends both."""

from __future__ import annotations

import contextlib

import pytest

from spark_cnn.spark import job_io


class Session:
    """Records the order of what job_session does; `alive` as a stopped local Connect server would say, and whether
    its executors end with it (`owns_executors`: not on a shared Connect server)."""

    def __init__(self, events: list[str]):
        self.events, self.alive, self.owns_executors = events, True, True

    def stop(self) -> None:
        self.events.append("session stopped")
        self.alive = False


@pytest.fixture
def session_and_events(monkeypatch):
    events: list[str] = []
    session = Session(events)

    def application_id(spark):
        assert spark.alive, "the application was asked after the session stopped"
        return "app-7"

    def owns_executors(spark):
        assert spark.alive, "the executors' owner was asked after the session stopped"
        return spark.owns_executors

    monkeypatch.setattr(job_io, "spark_session", lambda **_: session)
    monkeypatch.setattr(job_io, "application_id", application_id)
    monkeypatch.setattr(job_io, "owns_executors", owns_executors)
    monkeypatch.setattr(job_io, "stop_sidecars", lambda app_id: events.append(f"sidecars of {app_id} stopped"))
    return session, events


@pytest.mark.parametrize("fails", [False, True])
def test_the_session_stops_before_its_sidecars(session_and_events, fails):
    session, events = session_and_events
    with pytest.raises(RuntimeError) if fails else contextlib.nullcontext():
        with job_io.job_session(None, master="local[1]", quiet=True) as spark:
            assert spark is session
            events.append("job ran")
            if fails:
                raise RuntimeError("a task failed")
    assert events == ["job ran", "session stopped", "sidecars of app-7 stopped"]


def test_a_shared_server_s_sidecars_are_left_to_serve_its_other_clients(session_and_events):
    session, events = session_and_events
    session.owns_executors = False
    with job_io.job_session(None, master=None, quiet=True, remote="sc://elsewhere:15002"):
        events.append("job ran")
    assert events == ["job ran", "session stopped"]


def test_a_session_the_caller_gave_is_neither_stopped_nor_its_sidecars(session_and_events):
    session, events = session_and_events
    with job_io.job_session(session, master=None, quiet=True):
        events.append("job ran")
    assert events == ["job ran"] and session.alive

