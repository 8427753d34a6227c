"""spark-submit entry point: `spark-submit jobs/detect.py INPUT OUTPUT [options]` (same options as
`spark-cnn detect`). All logic lives in the package."""

import sys

from spark_cnn.cli import main

if __name__ == "__main__":
    sys.exit(main(["detect", *sys.argv[1:]]))
