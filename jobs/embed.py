"""spark-submit entry point: `spark-submit jobs/embed.py INPUT OUTPUT [options]` (same options as
`spark-cnn embed`). All logic lives in the package."""

import sys

from spark_cnn.cli import main

if __name__ == "__main__":
    sys.exit(main(["embed", *sys.argv[1:]]))
