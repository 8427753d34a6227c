"""Where images are decoded when the job says `--decode auto`: a pure decision over measured and predicted rates.

The sidecar decides at the first HELLO of a model (through perf.startpoint, its one entry into perf), and
`spark-cnn plan` decides the same for the executors it plans, from what each knows: its device, the per-image
decode cost on one CPU core (the device profile's `decode_ms`, measured by calibration), the model's predicted
device rate at its batch size (the time model), the cores of the host, and whether nvJPEG works here.

- On a CPU device, Spark tasks decode: they are separate processes, so decoding spreads over every core with no
  GIL in the way, while the sidecar's threads compute and serve. Sidecar threads would decode on the same
  cores, behind the sidecar's GIL.
- On a CUDA device, tasks decode when the cores can outrun the device with headroom; otherwise the GPU decodes
  (nvJPEG), because then CPU decoding would be the pipeline's bottleneck. Without a profile the GPU decodes:
  a data-centre GPU outruns the few cores an executor has per GPU for any common CNN.
"""

from __future__ import annotations

from dataclasses import dataclass

# Tasks decode on a GPU host only if the cores decode this much faster than the device computes: serving,
# Arrow and the socket take CPU too, and a stage running near its limit starves the next one in bursts.
DECODE_HEADROOM = 1.25


@dataclass(frozen=True)
class DecodeChoice:
    place: str  # task | sidecar | gpu
    why: str


def choose_decode_place(device_type: str, *, gpu_decode_works: bool, cores: int, decode_ms: float | None,
                        device_images_per_s: float | None) -> DecodeChoice:
    """Where to decode for `--decode auto`.

    >>> choose_decode_place("cuda", gpu_decode_works=True, cores=8, decode_ms=4.0, device_images_per_s=3000).place
    'gpu'
    >>> choose_decode_place("cuda", gpu_decode_works=True, cores=8, decode_ms=4.0, device_images_per_s=900).place
    'task'
    """
    if device_type != "cuda":
        return DecodeChoice("task", "CPU device: Spark tasks decode in parallel processes")
    if not gpu_decode_works:
        return DecodeChoice("task", "nvJPEG is not usable here: Spark tasks decode")
    if not decode_ms or not device_images_per_s:
        return DecodeChoice("gpu", "no device profile: the GPU decodes (CPU cores rarely keep a GPU fed)")
    cpu_rate = cores * 1000.0 / decode_ms
    if cpu_rate >= DECODE_HEADROOM * device_images_per_s:
        return DecodeChoice("task", f"{cores} cores decode {cpu_rate:.0f} img/s, >= {DECODE_HEADROOM}x the device's "
                                    f"predicted {device_images_per_s:.0f} img/s")
    return DecodeChoice("gpu", f"{cores} cores decode {cpu_rate:.0f} img/s, < {DECODE_HEADROOM}x the device's "
                               f"predicted {device_images_per_s:.0f} img/s")
