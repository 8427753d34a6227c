"""The offline performance model: what a CNN costs per layer, how long a batch takes on a calibrated device,
and which batch size to run.

- `layers.analyse(module, input_shape)`: per-layer FLOPs, bytes moved and peak live activations of any
  nn.Module (`layer_tracing` groups the operators, `op_costs` costs each one);
- `calibration.calibrate(device)`: a cached `DeviceProfile` from micro-benchmarks of generic operators;
- `timemodel.predict_batch_ms(cost, profile, batch)`: the sidecar's compute stage per batch, layer by layer
  (`heap` replays the allocator for page faults);
- `tuner.choose_batch_size(curve)`: the pick; `startpoint.predicted_start`: the one entry a running sidecar
  uses (a cached profile only, nothing measured);
- `validate.validate(model)`: the prediction against measured latency (`spark-cnn validate`); `commands`:
  `spark-cnn profile` and `spark-cnn plan`.

Kept free of imports so that importing the package does not import torch."""
