"""A pinned Python environment with pyspark 3.5 and the oldest pyarrow, pandas and numpy spark_cnn supports,
built once and cached (cached_env.py) in `~/.cache/spark_cnn/spark35-env/<key>/`.

Only the packages whose versions the Spark 3.5 runs are about are installed there; torch, torchvision, Pillow,
pytest and the rest are borrowed from the venv running the tests (a `.pth` after the env's own site-packages,
so the pins win). Installing torch a second time would cost several GB and minutes (a download of gigabytes on
a machine without a wheel cache) and test nothing more: the sidecar's torch does not depend on Spark's version.
The host venv's path is part of the cache key, so another checkout gets its own environment.
"""

from __future__ import annotations

import sysconfig

from tests.e2e.cached_env import PinnedEnv, cached_python

# Spark 3.5 with the lower bounds of pyproject.toml's ranges: pyspark 3.5 predates numpy 2 (its pandas
# conversions use names numpy 2 removed), so numpy 1.26 and the pandas of that time.
PINNED_REQUIREMENTS = (
    "pyspark==3.5.*",
    "pyarrow==18.1.*",
    "pandas==2.2.*",
    "numpy==1.26.*",
)
CACHE_ROOT_ENV = "SPARK_CNN_SPARK35_ENV_DIR"
# The pins must be what the environment runs, not what the host lends it.
CHECK = ("import numpy, pandas, pyarrow, pyspark, torch, torchvision, PIL, pytest\n"
         "assert pyspark.__version__.startswith('3.5.'), pyspark.__version__\n"
         "assert numpy.__version__.startswith('1.26.'), numpy.__version__\n"
         "assert pandas.__version__.startswith('2.2.'), pandas.__version__\n"
         "assert pyarrow.__version__.startswith('18.1.'), pyarrow.__version__\n"
         "torch.from_numpy(numpy.zeros(2))\n")


def _host_paths() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(dict.fromkeys([paths["purelib"], paths["platlib"]]))


SPARK35_ENV = PinnedEnv(name="Spark 3.5", folder="spark35-env", cache_root_env=CACHE_ROOT_ENV,
                        requirements=PINNED_REQUIREMENTS, check=CHECK, host_paths=_host_paths())


def spark35_python() -> str:
    """The interpreter of the Spark 3.5 environment, building it first if needed."""
    return cached_python(SPARK35_ENV)
