"""spark-submit entry point: `spark-submit jobs/to_petastorm.py INPUT OUTPUT [options]` (same options as
`spark-cnn to-petastorm`). All logic lives in the package."""

import sys

from spark_cnn.cli import main

if __name__ == "__main__":
    sys.exit(main(["to-petastorm", *sys.argv[1:]]))
