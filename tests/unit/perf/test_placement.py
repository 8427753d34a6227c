"""`--decode auto`: where images are decoded, from the device, the decode cost and the model's predicted rate."""

from __future__ import annotations

from spark_cnn.perf.placement import DECODE_HEADROOM, choose_decode_place


def test_a_cpu_device_always_decodes_in_the_tasks():
    for rate in (None, 10.0, 1e6):
        choice = choose_decode_place("cpu", gpu_decode_works=False, cores=2, decode_ms=1.5, device_images_per_s=rate)
        assert choice.place == "task"


def test_a_gpu_without_nvjpeg_decodes_in_the_tasks():
    choice = choose_decode_place("cuda", gpu_decode_works=False, cores=4, decode_ms=5.0, device_images_per_s=5000)
    assert choice.place == "task" and "nvJPEG" in choice.why


def test_a_gpu_without_a_profile_decodes_on_the_gpu():
    assert choose_decode_place("cuda", gpu_decode_works=True, cores=4, decode_ms=None,
                               device_images_per_s=None).place == "gpu"


def test_a_gpu_decodes_where_the_cores_cannot_keep_up_with_headroom():
    cores, decode_ms = 8, 4.0  # the cores decode 2000 img/s
    fast_device = 2000 / DECODE_HEADROOM + 1  # just above what the cores feed with headroom
    slow_device = 2000 / DECODE_HEADROOM - 1
    assert choose_decode_place("cuda", gpu_decode_works=True, cores=cores, decode_ms=decode_ms,
                               device_images_per_s=fast_device).place == "gpu"
    choice = choose_decode_place("cuda", gpu_decode_works=True, cores=cores, decode_ms=decode_ms,
                                 device_images_per_s=slow_device)
    assert choice.place == "task" and "2000 img/s" in choice.why
