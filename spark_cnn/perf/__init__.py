"""Performance model and tuner (see the analytical-model issue). Until it lands, the sidecar picks the batch
size per device type (spark_cnn.sidecar.server.AUTO_BATCH_ROWS).

`spark_cnn.perf.layers.analyse(module, input_shape)` is its first part: per-layer FLOPs, bytes moved and peak
live activations of any nn.Module (fx, forward hooks or, for TorchScript, operator-level tracing), each a
function of batch size; `spark_cnn.perf.op_costs` holds the per-operator rules. Kept free of imports so that
importing the package does not import torch."""
