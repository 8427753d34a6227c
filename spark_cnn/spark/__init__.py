"""Spark glue: the session, the mapInArrow task function, sources/sinks and the jobs built from them."""

from spark_cnn.errors import missing_extra

try:  # a cluster's runtime brings its own pyspark; elsewhere it is the `spark` extra
    import pyspark  # noqa: F401
except ImportError as e:
    raise missing_extra("pyspark", "spark", "spark_cnn's Spark side (jobs, classify(df), cnn_udf)") from e
