"""The performance model's offline tools: commands a person runs, never imported by a job, the sidecar or a task.

- `calibration.calibrate(device)`: a cached `DeviceProfile` (spark_cnn.perf.profile) from micro-benchmarks of
  generic operators, run in a child with the sidecar's malloc settings (`child_env`);
- `validate.validate(model)`: the prediction against measured latency; `zoo`: the same over every torchvision
  classifier under a FLOP budget, or the held-out timm networks; `validate_command`: `spark-cnn validate`
  (also `python -m spark_cnn.perf_tools.validate_command`);
- `commands`: `spark-cnn profile` and `spark-cnn plan`.

They build on the runtime part (spark_cnn.perf); it imports nothing from here.

Kept free of imports so that importing the package does not import torch."""
