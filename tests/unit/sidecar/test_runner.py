"""The sidecar's device side and its plain data: ModelRunner on the CPU with the demo CNN, the precision probe,
the registry, run options and per-job counters."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict

import numpy as np
import pytest
import torch

from spark_cnn.errors import ConfigError
from spark_cnn.models.digits import DIGITS_FACTORY, DIGITS_PREPROCESSING, DigitsCNN
from spark_cnn.models.resolve import resolve_endpoint
from spark_cnn.models.spec import Endpoint, ModelSpec
from spark_cnn.models.tensors import normalise
from spark_cnn.sidecar.job_stats import JobStats
from spark_cnn.sidecar.registry import ModelRegistry
from spark_cnn.sidecar.reply import reply_batch
from spark_cnn.sidecar.runner import (
    MIN_TOP1_AGREEMENT,
    PRECISION_PROBE_IMAGES,
    ModelRunner,
    PrecisionProbe,
    is_out_of_memory,
    resolve_device,
)
from spark_cnn.task.protocol import options_from_json
from spark_cnn.task.run_options import PRECISIONS, RunOptions
from spark_cnn.task.schema import reply_schema

CPU = torch.device("cpu")
LOGITS_ATOL = 1e-5
ROWS = 64


# --- fixtures ---------------------------------------------------------------------------------------------------

# `weights` and `endpoint` (the demo CNN's) come from conftest.py; `reference` here overrides conftest's: the logits
# of `pixels`, not a function.

@pytest.fixture(scope="module")
def pixels() -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (ROWS, *DIGITS_PREPROCESSING.pixel_shape), dtype=np.uint8)


@pytest.fixture(scope="module")
def reference(weights: str, pixels: np.ndarray) -> np.ndarray:
    """Logits of a plain torch forward, as the runner should compute them in fp32."""
    model = DigitsCNN()
    model.load_state_dict(torch.load(weights, weights_only=True))
    model.eval()
    with torch.inference_mode():
        return model(normalise(torch.from_numpy(pixels), DIGITS_PREPROCESSING)).numpy()


@pytest.fixture(scope="module")
def fp32_out(endpoint: Endpoint, pixels: np.ndarray) -> dict[str, np.ndarray]:
    return ModelRunner(endpoint, CPU).run(pixels)


def _check_output_types(out: dict[str, np.ndarray], rows: int, top_k: int) -> None:
    assert set(out) == {"label", "score", "topk_label", "topk_score", "logits"}
    assert (out["label"].shape, out["label"].dtype) == ((rows,), np.int32)
    assert (out["score"].shape, out["score"].dtype) == ((rows,), np.float32)
    assert (out["topk_label"].shape, out["topk_label"].dtype) == ((rows, top_k), np.int32)
    assert (out["topk_score"].shape, out["topk_score"].dtype) == ((rows, top_k), np.float32)
    assert (out["logits"].shape, out["logits"].dtype) == ((rows, 10), np.float32)


# --- PrecisionProbe ---------------------------------------------------------------------------------------------

def test_probe_decides_nothing_before_enough_images():
    probe = PrecisionProbe(images=100)

    probe.record(60, 60)
    probe.record(39, 39)

    assert probe.choice is None
    assert probe.describe() == "fp32 (probing 99/100 images)"


def test_probe_keeps_the_reduced_precision_at_the_agreement_threshold():
    probe = PrecisionProbe(reduced="bf16", images=100, min_agreement=0.99)

    probe.record(50, 50)
    probe.record(49, 50)  # 99 of 100: exactly the threshold

    assert probe.choice == "bf16"
    assert probe.describe() == "bf16 (auto: top-1 agreement 0.990 on 100 images)"


def test_probe_falls_back_to_fp32_below_the_threshold():
    probe = PrecisionProbe(reduced="fp16", images=100, min_agreement=0.99)

    probe.record(98, 100)

    assert probe.choice == "fp32"
    assert probe.describe() == "fp32 (auto: top-1 agreement 0.980 on 100 images)"


def test_probe_decides_once_and_keeps_its_choice():
    probe = PrecisionProbe(images=10, min_agreement=0.9)
    probe.record(12, 12)  # one batch may overshoot the probe size: the decision uses all of it
    assert (probe.choice, probe.seen) == ("bf16", 12)

    probe.record(0, 100)

    assert probe.choice == "bf16"


@pytest.mark.parametrize("agreed, choice", [(PRECISION_PROBE_IMAGES - 2, "bf16"), (PRECISION_PROBE_IMAGES - 3, "fp32")])
def test_default_probe_tolerates_two_disagreements_in_its_images(agreed, choice):
    # The documented sizing: 256 images at >= 99% agreement allow at most two disagreements.
    assert (PRECISION_PROBE_IMAGES, MIN_TOP1_AGREEMENT) == (256, 0.99)
    probe = PrecisionProbe()

    probe.record(agreed, PRECISION_PROBE_IMAGES)

    assert probe.choice == choice


# --- ModelRunner on the CPU -------------------------------------------------------------------------------------

def test_fp32_run_equals_a_direct_torch_forward(endpoint, pixels, reference, fp32_out):
    runner = ModelRunner(endpoint, CPU)

    assert (runner.precision, runner.probe, runner.cuda, runner.channels_last) == ("fp32", None, False, False)
    _check_output_types(fp32_out, ROWS, endpoint.top_k)
    np.testing.assert_allclose(fp32_out["logits"], reference, atol=LOGITS_ATOL, rtol=0)
    np.testing.assert_array_equal(fp32_out["label"], reference.argmax(axis=1))
    probs = torch.softmax(torch.from_numpy(reference), dim=1).numpy()
    np.testing.assert_allclose(fp32_out["score"], probs.max(axis=1), atol=1e-6, rtol=0)
    np.testing.assert_array_equal(fp32_out["topk_label"][:, 0], fp32_out["label"])
    assert np.all(np.diff(fp32_out["topk_score"], axis=1) <= 0), "top-k scores must be in descending order"


def test_a_cpu_forward_flushes_subnormals_in_the_thread_that_runs_it(endpoint, pixels):
    # A subnormal operand costs an x86 core a microcode assist: swin's masked attention ran 1.27x slower
    # with them (models/tensors.flush_denormals). The flag is per thread; each thread here starts without it.
    import threading

    def subnormal_survives() -> bool:
        return (torch.tensor([1e-39], dtype=torch.float32) * 1.0).item() != 0.0

    seen = {}

    def plain() -> None:
        torch.set_flush_denormal(False)
        seen["plain"] = subnormal_survives()

    def in_runner_thread() -> None:
        torch.set_flush_denormal(False)
        ModelRunner(endpoint, CPU).run(pixels[:2])
        seen["after_forward"] = subnormal_survives()

    for work in (plain, in_runner_thread):
        thread = threading.Thread(target=work)
        thread.start()
        thread.join()
    assert seen == {"plain": True, "after_forward": False}


def test_the_runners_outputs_make_its_reply_rows(endpoint, fp32_out):
    runner = ModelRunner(endpoint, CPU)

    reply = reply_batch(fp32_out, None, runner.reply_schema)

    assert reply.schema.equals(reply_schema(logits=True)) and reply.num_rows == ROWS
    assert reply.column("label").to_pylist() == fp32_out["label"].tolist()
    pairs = reply.column("topk").to_pylist()
    assert [[p["label"] for p in row] for row in pairs] == fp32_out["topk_label"].tolist()
    assert [[p["score"] for p in row] for row in pairs] == fp32_out["topk_score"].tolist()
    np.testing.assert_array_equal(np.array(reply.column("logits").to_pylist(), np.float32), fp32_out["logits"])


def test_the_three_stages_on_the_cpu_are_plain_calls(endpoint, pixels, fp32_out):
    runner = ModelRunner(endpoint, CPU)

    staged = runner.upload(pixels)
    pending = runner.forward(staged)

    assert staged.ready is None and pending.done is None
    assert staged.pixels.data_ptr() == torch.from_numpy(pixels).data_ptr()  # no copy on the CPU
    assert runner.upload(staged.pixels).pixels is staged.pixels  # already on the device: used as is
    out = runner.download(pending)
    for key, values in fp32_out.items():
        np.testing.assert_array_equal(out[key], values)


def test_bf16_on_the_cpu_runs_under_autocast_with_float32_outputs(endpoint, pixels, fp32_out):
    runner = ModelRunner(endpoint, CPU, RunOptions(precision="bf16"))

    out = runner.run(pixels)

    assert runner.precision == "bf16"
    _check_output_types(out, ROWS, endpoint.top_k)
    assert not np.array_equal(out["logits"], fp32_out["logits"]), "bf16 gave fp32's exact logits: no autocast?"
    agreement = float(np.mean(out["label"] == fp32_out["label"]))
    assert agreement >= 0.9, f"bf16 top-1 agrees with fp32 on only {agreement:.2f} of {ROWS} images"


def test_channels_last_gives_the_same_logits(endpoint, pixels, fp32_out):
    runner = ModelRunner(endpoint, CPU, RunOptions(channels_last=True))

    out = runner.run(pixels)

    assert runner.channels_last
    np.testing.assert_allclose(out["logits"], fp32_out["logits"], atol=1e-4, rtol=0)
    np.testing.assert_array_equal(out["label"], fp32_out["label"])


@pytest.mark.parametrize("min_agreement, decided", [(0.0, "bf16"), (1.01, "fp32")])
def test_runner_feeds_the_probe_and_follows_its_decision(endpoint, pixels, fp32_out, min_agreement, decided):
    # `auto` probes only on CUDA; on the CPU the same code path runs with a probe put in place by hand.
    runner = ModelRunner(endpoint, CPU)
    runner.probe = PrecisionProbe(images=8, min_agreement=min_agreement)

    first = runner.run(pixels[:8])  # probing: fp32 outputs, bf16 compared on the side

    # fp32 to the last few ulps (oneDNN picks kernels by batch size); bf16 would be ~1e-2 away
    np.testing.assert_allclose(first["logits"], fp32_out["logits"][:8], atol=1e-6, rtol=0)
    assert runner.probe.choice == decided
    assert runner.precision.startswith(f"{decided} (auto: top-1 agreement")
    then = runner.run(pixels)
    if decided == "fp32":
        np.testing.assert_array_equal(then["logits"], fp32_out["logits"])
    else:
        assert not np.array_equal(then["logits"], fp32_out["logits"])
        np.testing.assert_array_equal(then["logits"], ModelRunner(endpoint, CPU, RunOptions(precision="bf16"))
                                      .run(pixels)["logits"])
    assert runner.probe.seen == 8  # no probing after the decision


def test_runner_with_embeddings_returns_the_input_of_the_last_linear(weights, pixels):
    endpoint = resolve_endpoint(ModelSpec(DIGITS_FACTORY, weights=weights), embeddings=True).endpoint

    out = ModelRunner(endpoint, CPU).run(pixels[:5])

    assert "logits" not in out
    assert (out["embedding"].shape, out["embedding"].dtype) == ((5, 64), np.float32)


def test_registry_loads_a_model_once_per_model_changing_options(endpoint):
    registry = ModelRegistry(CPU)

    first, loaded = registry.get(endpoint, RunOptions(batch_size=8))
    again, loaded_again = registry.get(endpoint, RunOptions(batch_size=32))  # batch size does not change the model
    other, loaded_other = registry.get(endpoint, RunOptions(precision="bf16"))

    assert (loaded, loaded_again, loaded_other) == (True, False, True)
    assert again is first
    assert other is not first and other.precision == "bf16"


# --- device and error helpers -----------------------------------------------------------------------------------

@pytest.mark.parametrize("error, oom", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"), True),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1000000 bytes"), True),
    (RuntimeError("[enforce fail at alloc_cpu.cpp] out of memory"), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    (ValueError("out of memory"), False),
])
def test_is_out_of_memory(error, oom):
    assert is_out_of_memory(error) is oom


def test_resolve_device_without_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    assert resolve_device("auto") == CPU
    assert resolve_device("cpu") == CPU
    with pytest.raises(ConfigError, match=r"--device cuda: CUDA is not available.*--device cpu"):
        resolve_device("cuda")


def test_resolve_device_refuses_a_missing_cuda_index(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)

    assert resolve_device("auto") == torch.device("cuda:0")
    assert resolve_device("cuda") == torch.device("cuda:0")
    with pytest.raises(ConfigError, match=r"--device cuda:3: this host has 1 CUDA device"):
        resolve_device("cuda:3")


# --- RunOptions -------------------------------------------------------------------------------------------------

def test_run_options_defaults():
    options = RunOptions()
    assert (options.batch_size, options.precision, options.channels_last, options.compile) == (None, "auto", None,
                                                                                              False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.precision = "fp16"


@pytest.mark.parametrize("changes, flag", [
    ({"precision": "fp8"}, "--precision fp8"),
    ({"precision": "FP32"}, "--precision FP32"),
    ({"batch_size": 0}, "--batch-size 0"),
    ({"batch_size": -4}, "--batch-size -4"),
])
def test_run_options_refuse_bad_values_naming_the_flag(changes, flag):
    with pytest.raises(ConfigError, match=flag) as caught:
        RunOptions(**changes)
    if "precision" in changes:
        assert all(p in str(caught.value) for p in PRECISIONS), str(caught.value)


@pytest.mark.parametrize("batch_size", ["abc", 2.5])
def test_run_options_refuse_a_batch_size_that_is_not_an_integer(batch_size):
    with pytest.raises(ConfigError, match="--batch-size"):
        RunOptions(batch_size=batch_size)


@pytest.mark.parametrize("options", [
    RunOptions(),
    RunOptions(batch_size=16, precision="bf16", channels_last=True, compile=True),
    RunOptions(batch_size=1, precision="fp16", channels_last=False),
])
def test_run_options_round_trip_through_json(options):
    data = json.loads(json.dumps(asdict(options)))  # as they cross the socket in the HELLO

    assert options_from_json(RunOptions, data, "run") == options


def test_run_options_from_nothing_are_the_defaults():
    assert options_from_json(RunOptions, None, "run") == options_from_json(RunOptions, {}, "run") == RunOptions()


def test_model_key_ignores_the_batch_size_only():
    base = RunOptions(batch_size=8, precision="bf16", channels_last=True)

    assert base.model_key() == RunOptions(batch_size=64, precision="bf16", channels_last=True).model_key()
    assert base.model_key() == RunOptions(precision="bf16", channels_last=True).model_key()
    for changed in (dataclasses.replace(base, precision="fp32"), dataclasses.replace(base, channels_last=False),
                    dataclasses.replace(base, compile=True)):
        assert changed.model_key() != base.model_key()


# --- JobStats ---------------------------------------------------------------------------------------------------

def test_stats_of_an_unknown_job_are_zero_and_do_not_create_it():
    stats = JobStats()

    snapshot = stats.snapshot("nobody")

    expected = {"batch_size": None, "precision": None, "requests": 0, "images": 0, "batches": 0, "errors": 0,
                "oom_backoffs": 0, "device_s": 0.0, "histogram": {}, "mean_batch_size": 0.0, "mean_queue_wait_ms": 0.0}
    assert {key: snapshot[key] for key in expected} == expected
    stats.batch({"j": 1}, rows=1, device_s=0.0)
    assert stats.snapshot("nobody")["batches"] == 0


def test_stats_snapshot_has_the_same_keys_with_and_without_queue_waits():
    stats = JobStats()
    stats.request("quiet", rows=2)
    stats.queue_wait("busy", 0.01)

    assert set(stats.snapshot("quiet")) == set(stats.snapshot("busy"))
    assert "queue_wait_s" not in stats.snapshot("quiet")


def test_stats_histogram_counts_batches_by_size_in_numeric_order():
    stats = JobStats()
    stats.start("j", batch_rows=16, precision="fp32")
    for rows in (16, 3, 16, 8, 16):
        stats.batch({"j": rows}, rows=rows, device_s=0.0125)

    snapshot = stats.snapshot("j")

    assert snapshot["histogram"] == {"3": 1, "8": 1, "16": 3}
    assert list(snapshot["histogram"]) == ["3", "8", "16"]  # by size, not as strings ("16" < "3")
    assert snapshot["batches"] == 5
    assert snapshot["mean_batch_size"] == round((16 * 3 + 3 + 8) / 5, 2)
    assert snapshot["device_s"] == round(5 * 0.0125, 3)
    assert (snapshot["batch_size"], snapshot["precision"]) == (16, "fp32")


def test_stats_count_requests_errors_and_queue_waits():
    stats = JobStats()
    stats.request("j", rows=3)
    stats.request("j", rows=5)
    stats.error("j")
    stats.queue_wait("j", 0.010)
    stats.queue_wait("j", 0.030)

    snapshot = stats.snapshot("j")

    assert (snapshot["requests"], snapshot["images"], snapshot["errors"]) == (2, 8, 1)
    assert snapshot["mean_queue_wait_ms"] == 20.0


def test_stats_oom_backoff_lowers_the_batch_size_of_each_job_in_the_batch():
    stats = JobStats()
    for job in ("a", "b", "c"):
        stats.start(job, batch_rows=64, precision="bf16")

    stats.oom_backoff({"a", "b"}, 32)
    stats.oom_backoff({"a"}, 16)

    assert [stats.snapshot(j)["batch_size"] for j in "abc"] == [16, 32, 64]
    assert [stats.snapshot(j)["oom_backoffs"] for j in "abc"] == [2, 1, 0]


def test_stats_batch_shared_by_jobs_counts_for_each_at_its_full_size():
    stats = JobStats()

    stats.batch({"a": 3, "b": 5}, rows=8, device_s=0.02)

    for job in ("a", "b"):
        snapshot = stats.snapshot(job)
        assert (snapshot["batches"], snapshot["histogram"], snapshot["mean_batch_size"]) == (1, {"8": 1}, 8.0)


def test_stats_snapshot_is_a_copy():
    stats = JobStats()
    stats.batch({"j": 4}, rows=4, device_s=0.0)

    snapshot = stats.snapshot("j")
    snapshot["histogram"]["4"] = 99
    snapshot["batches"] = 99

    assert stats.snapshot("j")["histogram"] == {"4": 1}
    assert stats.snapshot("j")["batches"] == 1


def test_cpu_sidecars_compute_up_to_two_batches_side_by_side(monkeypatch):
    from spark_cnn.sidecar import runner as runner_module

    monkeypatch.setattr(runner_module.os, "cpu_count", lambda: 2)
    assert runner_module.cpu_compute_workers(torch.device("cpu"), None) == 2   # 2 x 1 thread
    assert runner_module.cpu_compute_workers(torch.device("cpu"), 2) == 1      # one 2-thread forward
    monkeypatch.setattr(runner_module.os, "cpu_count", lambda: 16)
    assert runner_module.cpu_compute_workers(torch.device("cpu"), None) == 2   # 2 x 8 threads
    assert runner_module.cpu_compute_workers(torch.device("cuda:0"), None) == 1
