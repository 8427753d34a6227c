"""What runs inside Spark's Python workers, free of torch and pyspark: the streaming core that mapInArrow and
the pandas UDF share (stream), the sidecar client and its failover, the launcher that starts one sidecar per
executor, the wire protocol, run options and the sidecar's process environment.

Spark-specific lookups (shipped files, the task's GPUs) come in through `stream.TaskEnvironment`, supplied by
spark_cnn.spark.executor.
"""
