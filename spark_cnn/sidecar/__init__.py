"""The per-executor sidecar process (torch): server, model service, batcher (pure), runner (device), decoding of
files sent whole, where images decode, and the online batch-size tuner.

Tasks never import this package: they reach the sidecar through spark_cnn.task (client, launcher, protocol).
"""
