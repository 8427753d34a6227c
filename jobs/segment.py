"""spark-submit entry point: `spark-submit jobs/segment.py INPUT OUTPUT [options]` (same options as
`spark-cnn segment`). All logic lives in the package."""

import sys

from spark_cnn.cli import main

if __name__ == "__main__":
    sys.exit(main(["segment", *sys.argv[1:]]))
