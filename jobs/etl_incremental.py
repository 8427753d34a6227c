"""spark-submit entry point for scheduled incremental ETL:
`spark-submit jobs/etl_incremental.py INPUT OUTPUT --checkpoint DIR [options]` (same options as `spark-cnn etl`).
Each run classifies only the images that arrived since the last one, then exits. All logic lives in the package."""

import sys

from spark_cnn.cli import main

if __name__ == "__main__":
    sys.exit(main(["etl", *sys.argv[1:]]))
