"""spark-submit entry point for YAML job presets: `spark-submit jobs/run.py conf/JOB.yaml [--flag overrides]`
(same as `spark-cnn run`). `--conf spark.cnn.<option>=...` settings apply under the preset's values."""

import sys

from spark_cnn.cli import main

if __name__ == "__main__":
    sys.exit(main(["run", *sys.argv[1:]]))
