"""One local Spark session for all integration tests; its sidecars are stopped when the session ends."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def spark():
    from spark_cnn.spark.session import spark_session
    from spark_cnn.task.launcher import find_sidecars, stop_sidecars

    session = spark_session(master="local[2]", app_name="spark_cnn-integration", quiet=True)
    app_id = session.sparkContext.applicationId
    try:
        yield session
    finally:
        stop_sidecars(app_id)
        session.stop()
        assert find_sidecars(app_id) == []
