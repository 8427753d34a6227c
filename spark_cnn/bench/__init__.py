"""Benchmarks run as commands (`spark-cnn bench-sidecar`), never as timed tests."""
