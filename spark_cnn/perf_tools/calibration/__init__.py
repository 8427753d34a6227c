"""Device calibration: a short set of micro-benchmarks -> a `DeviceProfile`, cached on disk per device.

`calibrate("cpu")` times generic operators on the device, with the thread count the sidecar uses, and never
the network being predicted (nor any torchvision model). The benchmarks, by what they time:

- `conv_bench`: convolutions over a grid of shapes at a small and a medium batch (those with small outputs,
  and the depthwise and grouped ones, also at a large one), and the fixed cost of one call;
- `gemm_bench`: linear layers (GEMMs) from 256 to 9216 inputs at 1 to 64 rows;
- `curve_bench`: elementwise, normalisation, pooling, concatenation and copy operators at sizes from 4 KB to
  105 MB, one time-against-bytes curve per operator, and the overhead of a call;
- `call_warmth_bench`: how much faster a chain of small layers runs than the same calls timed cold, against
  the bytes written between calls;
- `fault_bench`: the cost of fresh memory pages (a first touch faults them in, a free returns them);
- `stage_bench`: the sidecar's input normalisation and output heads, image decoding per core, and on CUDA the
  host-to-device copy.

`repeatability` times a sample of those again and keeps a run that disagrees with itself, or whose
transcendental curves `curve_check` finds implausible against relu's, with its measured spread and a warning
(refuses it when strict); `host_load` records how busy the host was.

`harness` times each: the minimum of repeated calls after a warm-up, under `torch.inference_mode`, inputs made
fresh and the cache filled with other data before each call, within a budget per section. Each call's minor
page faults are counted too, and the profile stores times *without* them (count x cost per fault), so the
time model can add the faults a network's own allocations cause instead of the benchmark's. `device_profile`
holds `calibrate()` and its cache; the profile itself (`DeviceProfile`, its file, its stale marks) is runtime data
in spark_cnn.perf.profile, which the sidecar and the driver read without importing any of this.

>>> profile = calibrate("cpu", budget_s=2.0, cache_dir="/tmp/spark_cnn-doctest")   # doctest: +SKIP
>>> profile.threads, len(profile.conv) > 0                                         # doctest: +SKIP
(1, True)
"""

from spark_cnn.models.timing import CLOCKS
from spark_cnn.perf_tools.calibration.device_profile import DEFAULT_BUDGET_S, GPU_MAX_BUDGET_S, calibrate
from spark_cnn.perf_tools.calibration.harness import Timing, measure
from spark_cnn.perf_tools.calibration.host_load import describe_load
from spark_cnn.perf_tools.calibration.repeatability import NoisyCalibration

__all__ = ["CLOCKS", "DEFAULT_BUDGET_S", "GPU_MAX_BUDGET_S", "NoisyCalibration", "Timing", "calibrate",
           "describe_load", "measure"]
