"""The sidecar and bench-sidecar run on a GPU host that has torch, torchvision and pyarrow but no Spark, no
Java and no scikit-learn: nothing on those paths may import pyspark, and the benchmark images must not need
scikit-learn."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

# Imports in a fresh interpreter.
pytestmark = pytest.mark.slow


def test_sidecar_and_bench_import_without_pyspark_or_sklearn():
    script = textwrap.dedent("""
        import sys

        import spark_cnn.cli
        import spark_cnn.sidecar.__main__
        import spark_cnn.sidecar.server
        import spark_cnn.bench.sidecar_bench
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("pyspark", "py4j", "sklearn"))
        assert not loaded, loaded

        sys.modules["sklearn"] = None  # as if not installed: `import sklearn` raises ImportError
        from spark_cnn.imaging.samples import bench_jpegs
        files = bench_jpegs(3)
        assert len(files) == 3 and all(f.startswith(b"\\xff\\xd8\\xff") for f in files)
        print("ok")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "ok"
