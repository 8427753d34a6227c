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


def steady_state(short_cpu_s: dict[str, float], short_images: int, long_cpu_s: dict[str, float],
                 long_images: int) -> dict:
    """CPU per image at steady state and CPU per job, by process kind, from two jobs of one session.

    A job's CPU is a cost per job (planning it, the JVM compiling its paths, starting and ending tasks) plus a
    cost per image. Two jobs of different sizes in the same session separate them: the extra CPU of the longer
    job over its extra images is the cost per image a long-running job pays (the issue's "steady state"), and
    what remains of the shorter job is the cost per job. A kind whose marginal comes out below zero (the second
    job ran with a warmer JIT) counts as 0 per image.

    >>> steady = steady_state({"jvm": 1.5, "sidecar": 0.5}, 2048, {"jvm": 1.7, "sidecar": 2.0}, 8192)
    >>> steady["ms_per_image"], steady["per_job_s"]
    ({'jvm': 0.033, 'sidecar': 0.244, 'total': 0.277}, {'jvm': 1.433, 'sidecar': 0.0, 'total': 1.433})
    """
    if long_images <= short_images:
        raise ValueError(f"the longer job must have more images ({long_images} <= {short_images})")
    extra = long_images - short_images
    kinds = sorted(set(short_cpu_s) | set(long_cpu_s))
    per_image = {k: max(0.0, (long_cpu_s.get(k, 0.0) - short_cpu_s.get(k, 0.0)) / extra) for k in kinds}
    per_job = {k: max(0.0, short_cpu_s.get(k, 0.0) - short_images * per_image[k]) for k in kinds}
    ms = {k: round(1000.0 * v, 3) for k, v in per_image.items()}
    ms["total"] = round(1000.0 * sum(per_image.values()), 3)
    job = {k: round(v, 3) for k, v in per_job.items()}
    job["total"] = round(sum(per_job.values()), 3)
    return {"ms_per_image": ms, "per_job_s": job, "images": [short_images, long_images]}


def steady_rate(short_images: int, short_s: float, long_images: int, long_s: float) -> dict:
    """The rate a long job sustains, from two jobs of one session: the longer job's extra images over its extra
    seconds, so that what every job pays once (planning it, the JVM compiling its paths, the first batch's wait,
    the last task's tail) drops out. `job_s` is what the shorter job took beyond its images at that rate: the
    wall time a job costs whatever its size. None where the longer job was not longer (the host's noise).

    >>> steady_rate(1024, 4.0, 4096, 13.0)
    {'images_per_s': 341.33, 'job_s': 1.0}
    >>> steady_rate(1024, 4.0, 4096, 3.9)
    {'images_per_s': None, 'job_s': None}
    """
    if long_images <= short_images or long_s <= short_s:
        return {"images_per_s": None, "job_s": None}
    rate = (long_images - short_images) / (long_s - short_s)
    return {"images_per_s": round(rate, 2), "job_s": round(short_s - short_images / rate, 3)}


# The CPU a spark_cnn run spends on its useful work, as its sidecars count it (bench/variants.py _work_cpu_s).
WORK_CPU_KEYS = ("task_decode_cpu_s", "decode_cpu_s", "compute_cpu_s")


def useful_share(detail: dict, cores: int) -> float | None:
    """The share of the cores' time a run spent on useful work: its rate times its own decoding and model CPU per
    image (measured inside the run, where each ran: WORK_CPU_KEYS) over the cores. 1.0 is the limit's premise,
    every core decoding or computing and nothing else; the rest went to the framework (JVM, serving, copies)
    and to idle cores. Both sides come from the same seconds, so a host that runs everything slower for a
    while moves the rate and the work per image together and the share far less than the ratio to a limit
    measured minutes apart. None where the run has no rate or did not count its decoding (tasks that did not
    say: an older sidecar).

    >>> useful_share({"images": 4096, "images_per_s": 300.0, "task_decode_cpu_s": 7.0, "decode_cpu_s": 0.0,
    ...               "compute_cpu_s": 12.0}, 2)
    0.6958
    """
    images, rate = detail.get("images") or 0, detail.get("images_per_s")
    work = [detail.get(key) or 0.0 for key in WORK_CPU_KEYS]
    if not images or not rate or not (work[0] or work[1]):
        return None
    return round(rate * sum(work) / images / cores, 4)


def cores_time_split(detail: dict, cores: int) -> dict[str, float] | None:
    """Where a run's cores' time went, ms per image: its useful work (WORK_CPU_KEYS), each process kind's CPU
    beyond that work (the Python workers beyond the tasks' decoding, the sidecar beyond its decoding and
    forwards), and the cores' idle time (cores / rate less all CPU). The parts sum to cores / rate; None where
    useful_share is. What to cut next, read from one run.

    >>> cores_time_split({"images": 4096, "images_per_s": 320.0, "task_decode_cpu_s": 8.0, "decode_cpu_s": 0.0,
    ...                   "compute_cpu_s": 12.8, "cpu_ms_per_image": {"jvm": 0.5, "python_worker": 2.2,
    ...                   "sidecar": 3.3, "driver": 0.05, "total": 6.05}}, 2)
    {'useful': 5.078, 'jvm': 0.5, 'python_worker': 0.247, 'sidecar': 0.175, 'driver': 0.05, 'idle': 0.2}
    """
    cpu = detail.get("cpu_ms_per_image") or {}
    if useful_share(detail, cores) is None or not cpu.get("total"):
        return None
    images = detail["images"]
    task_ms, sidecar_ms = (1000.0 * (detail.get(key) or 0.0) / images for key in ("task_decode_cpu_s",
                                                                                    "decode_cpu_s"))
    compute_ms = 1000.0 * (detail.get("compute_cpu_s") or 0.0) / images
    beyond = {kind: ms for kind, ms in cpu.items() if kind != "total" and ms}
    beyond["python_worker"] = beyond.get("python_worker", 0.0) - task_ms
    beyond["sidecar"] = beyond.get("sidecar", 0.0) - sidecar_ms - compute_ms
    split = {"useful": task_ms + sidecar_ms + compute_ms, **beyond,
             "idle": 1000.0 * cores / detail["images_per_s"] - cpu["total"]}
    return {part: round(ms, 3) for part, ms in split.items()}


def decode_ms_per_image(limit: dict) -> float | None:
    """One image's decoding on a core, from the limit: side by side where measured (every core decoding, as in
    a job), else alone."""
    side = limit.get("side_by_side") or {}
    rate = side.get("decode_per_s_per_core") or limit.get("decode_per_s_one_core")
    return 1000.0 / rate if rate else None


def cores_for(rate_per_s: float, ms_per_image: float) -> float:
    """Cores a node needs to sustain `rate_per_s` images/s at `ms_per_image` of CPU each.

    >>> cores_for(12000, 0.3)
    3.6
    """
    return round(rate_per_s * ms_per_image / 1000.0, 2)
