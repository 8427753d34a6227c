"""Performance model and tuner (see the analytical-model issue). Until it lands, the sidecar picks the batch
size per device type (spark_cnn.sidecar.server.AUTO_BATCH_ROWS)."""
