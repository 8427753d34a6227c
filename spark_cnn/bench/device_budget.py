"""A GPU node's CPU budget from a bench run against a near-free or simulated device: pure arithmetic.

With a model that costs the host nothing (`identity`, or a simulated device `sim:CURVE`), a spark_cnn variant's
CPU per image is decoding plus the framework (JVM, Python workers reading and sending, the sidecar's serving).
Decoding is taken out of the process that does it (the Python workers when tasks decode, the sidecar when it does:
on a GPU node nvJPEG does it on the device) at the limit's measured decode cost on one core, as docs/benchmarks.md's
framework-cost table does. The rest is what a GPU node spends on the framework.

CPU milliseconds per image are also cores per 1,000 images/s: 1 ms of CPU per image at 1,000 images/s is 1,000
ms of CPU each second, one core.

>>> budget = device_budget({"jvm": 0.2, "python_worker": 1.8, "sidecar": 0.1, "total": 2.1}, 1.6, "task")
>>> budget["framework_cores_per_1k_img_s"], budget["beyond_decoding_ms_per_image"]["python_worker"]
(0.5, 0.2)
"""

from __future__ import annotations

# The target: one GPU at 12,000 images/s must need at most 4 cores of framework (4 / 12 = 0.33 ms per image),
# rounded down to leave room for the host's own work.
TARGET_FRAMEWORK_MS_PER_IMAGE = 0.3
# Where each decode place does its decoding: the process kind (bench/cputime.py KINDS) whose CPU holds it.
DECODING_KIND = {"task": "python_worker", "sidecar": "sidecar", "gpu": "sidecar"}


def device_budget(cpu_ms_per_image: dict[str, float], decode_ms: float, decode_place: str,
                  images_per_s: float | None = None,
                  target_ms: float = TARGET_FRAMEWORK_MS_PER_IMAGE) -> dict:
    """CPU per image by process kind beyond decoding, and cores per 1k images/s, of one variant.

    `cpu_ms_per_image`: by kind and `total` (bench/cputime.per_image_ms); `decode_ms`: one image's decode on one
    core; `decode_place`: task, sidecar or gpu (where the variant decoded)."""
    by_kind = {kind: ms for kind, ms in cpu_ms_per_image.items() if kind != "total"}
    total = cpu_ms_per_image.get("total", sum(by_kind.values()))
    decoding_kind = DECODING_KIND[decode_place]
    beyond = dict(by_kind)
    beyond[decoding_kind] = beyond.get(decoding_kind, 0.0) - decode_ms
    framework = total - decode_ms
    return {
        "decode_place": decode_place, "decode_ms_per_image": round(decode_ms, 3),
        "beyond_decoding_ms_per_image": {kind: round(ms, 3) for kind, ms in beyond.items()},
        "cores_per_1k_img_s": round(total, 3),
        "framework_cores_per_1k_img_s": round(framework, 3),
        "framework_target_ms_per_image": target_ms,
        "framework_target_met": framework <= target_ms,
        # what the measured rate took of the host's cores (a check on the accounting: at most the host's cores)
        "cores_busy": None if images_per_s is None else round(total * images_per_s / 1000.0, 2),
    }


def cores_for(rate_per_s: float, ms_per_image: float) -> float:
    """Cores a node needs to sustain `rate_per_s` images/s at `ms_per_image` of CPU each.

    >>> cores_for(12000, 0.3)
    3.6
    """
    return round(rate_per_s * ms_per_image / 1000.0, 2)
