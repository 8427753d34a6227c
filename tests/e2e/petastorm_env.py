"""A separate, pinned Python environment with the real petastorm 0.13.1, built once and cached (cached_env.py).

petastorm imports `pyarrow.filesystem` (removed in pyarrow 15) and runs only with pyspark 3.x, so it cannot be
installed beside spark_cnn's venv (pyspark 4). The compatibility tests run it in its own venv,
`~/.cache/spark_cnn/petastorm-env/<key>/`, which borrows nothing from the host.
"""

from __future__ import annotations

import os

from tests.e2e.cached_env import DEFAULT_CACHE_PARENT, PinnedEnv, cached_python

# What petastorm 0.13.1 was released against; setuptools < 70 still ships pkg_resources, which it imports.
# opencv is what its CompressedImageCodec decodes with.
PINNED_REQUIREMENTS = (
    "petastorm==0.13.1",
    "pyspark==3.5.*",
    "pyarrow==14.0.2",
    "numpy==1.26.*",
    "pandas==2.2.*",
    "setuptools<70",
    "opencv-python-headless==4.10.0.84",
)
CACHE_ROOT_ENV = "SPARK_CNN_PETASTORM_ENV_DIR"
DEFAULT_CACHE_ROOT = os.path.join(DEFAULT_CACHE_PARENT, "petastorm-env")

PETASTORM_ENV = PinnedEnv(name="petastorm", folder="petastorm-env", cache_root_env=CACHE_ROOT_ENV,
                          requirements=PINNED_REQUIREMENTS, check="import petastorm.reader, cv2, pyspark")


def petastorm_python() -> str:
    """The interpreter of the pinned petastorm environment, building it first if needed."""
    return cached_python(PETASTORM_ENV)
