"""One real CPU calibration (one thread, 1 s budget) for the perf tests that need a measured profile."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def calibrated_cpu(tmp_path_factory):
    """(profile, the cache folder calibrate() wrote it to). Tests copy the folder before changing anything in it."""
    from spark_cnn.perf_tools.calibration import calibrate

    cache = str(tmp_path_factory.mktemp("calibrated_cpu"))
    return calibrate("cpu", threads=1, budget_s=1.0, cache_dir=cache), cache
