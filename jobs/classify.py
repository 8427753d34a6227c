"""spark-submit entry point: `spark-submit jobs/classify.py INPUT OUTPUT [options]` (same options as
`spark-cnn classify`). All logic lives in the package."""

import sys

from spark_cnn.cli import main

if __name__ == "__main__":
    sys.exit(main(["classify", *sys.argv[1:]]))
