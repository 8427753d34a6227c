"""The performance model's runtime part: what the sidecar and the driver run at every start. What a CNN costs
per layer, how long a batch takes on a calibrated device, and which batch size to run.

- `profile`: a device profile as data (`DeviceProfile`, its JSON and files, stale marks), torch-free, so the
  driver reads `--device-profile` without torch; `device_key`: which device a cached profile is for;
- `layers.analyse(module, input_shape)`: per-layer FLOPs, bytes moved and peak live activations of any
  nn.Module (`layer_tracing` groups the operators, `op_costs` costs each one);
- `timemodel.predict_batch_ms(cost, profile, batch)`: the sidecar's compute stage per batch, layer by layer
  (`heap` replays the allocator for page faults);
- `tuner.choose_batch_size(curve)`: the pick; `placement`: where `--decode auto` decodes;
  `startpoint.predicted_start`: the one entry a running sidecar uses (a cached profile only, nothing measured).

Measuring is offline and lives apart, in spark_cnn.perf_tools (calibration, validation, the zoo, the profile
and plan commands); nothing here imports it (tests/unit/test_architecture.py).

Kept free of imports so that importing the package does not import torch."""
