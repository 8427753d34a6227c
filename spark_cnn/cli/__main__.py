import sys

from spark_cnn.cli import main

sys.exit(main())
