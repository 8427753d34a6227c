"""Packaging checked in a fresh interpreter, as if the extras were not installed."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_missing_extra_says_which_to_install():
    script = textwrap.dedent("""
        import sys
        for name in ("pyspark", "sklearn", "matplotlib"):
            sys.modules[name] = None  # as if not installed: importing it raises ImportError
        from spark_cnn.cli import main
        from spark_cnn.errors import MissingExtra
        from spark_cnn.models.digits import write_digit_images
        from spark_cnn.perf_tools.commands import plot_profile

        for call in (lambda: write_digit_images("/nonexistent"), lambda: plot_profile({}, "x.png")):
            try:
                call()
            except MissingExtra as e:
                print(e)
        print("exit", main(["classify", "in", "out"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.stdout.splitlines() == ["the demo's digits needs scikit-learn: pip install 'spark_cnn[demo]'",
                                        "--plot needs matplotlib: pip install 'spark_cnn[plot]'", "exit 2"]
    assert done.stderr.strip() == ("spark-cnn classify: error: spark_cnn's Spark side (jobs, classify(df), cnn_udf) "
                                   "needs pyspark: pip install 'spark_cnn[spark]'")
