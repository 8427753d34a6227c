"""Spark glue: the session, the mapInArrow task function, sources/sinks and the jobs built from them."""
