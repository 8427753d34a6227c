"""One local Spark session for all integration tests (its sidecars are stopped when the session ends), and the
image folders they read."""

from __future__ import annotations

import pytest

from tests.sample_images import broken_files, real_image_files, write_files


@pytest.fixture(scope="session")
def spark():
    from spark_cnn.spark.session import spark_session
    from spark_cnn.task.launcher import find_sidecars, stop_sidecars

    session = spark_session(master="local[2]", app_name="spark_cnn-integration", quiet=True)
    app_id = session.sparkContext.applicationId
    try:
        yield session
    finally:
        # Spark first: a task still running after a failed job (a retry, a partition not yet cancelled) can start
        # a sidecar after ours were stopped; with the session stopped nothing starts one
        session.stop()
        stop_sidecars(app_id)
        assert find_sidecars(app_id) == []


@pytest.fixture(scope="module")
def mixed_folder(tmp_path_factory) -> str:
    """Real photos and digits in several sizes and modes, nested folders, and three broken files."""
    return write_files(str(tmp_path_factory.mktemp("mixed")), {**real_image_files(), **broken_files()})
