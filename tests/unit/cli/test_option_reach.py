"""Every flag of every `spark-cnn` subcommand is accounted for.

For the jobs (classify, embed, etl, to-petastorm) a non-default value of each flag, parsed and resolved as the
command does it, must reach one of: the reader (the job config's InputOptions, which `spark/sources.py` or the
ETL stream reads), the tasks (the InferencePlan, or the to-petastorm encoder), or the sidecar (the HELLO: the
endpoint, RunOptions and DecodeOptions), or be refused with a ConfigError, or be listed as driver-only with
what it affects (and then change nothing the tasks or the sidecar see). The offline tools list their flags as
driver-only. A flag added to any parser without an entry here fails `test_every_flag_is_accounted_for`.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from spark_cnn.cli import build_parser, classify, etl, resolution
from spark_cnn.cli.to_petastorm import petastorm_config
from spark_cnn.errors import ConfigError
from spark_cnn.models.digits import DIGITS_FACTORY, digits_cnn
from spark_cnn.models.tiny_dense import TINY_CLASSES, TINY_DETECTOR, TINY_SEGMENTER, tiny_detector, tiny_segmenter
from spark_cnn.spark.petastorm_job import petastorm_encoder
from spark_cnn.spark.planning import check_model, plan_inference
from spark_cnn.task.protocol import Hello
from tests.perf_doubles import synthetic_profile

READER, TASK, SIDECAR, REFUSED = "reader", "task", "sidecar", "refused"


def driver(what: str) -> tuple[str, str]:
    """A flag only the driver uses; `what` says what it changes."""
    return ("driver", what)


# A non-default value for each job flag (argv after INPUT OUTPUT); {weights} and {labels} are files made below.
SAMPLES = {
    "input_format": ["--input-format", "images"], "glob": ["--glob", "*.png"],
    "image_column": ["--image-column", "img"], "path_column": ["--path-column", "key"],
    "label_column": ["--label-column", "cls"], "storage_options": ["--storage-option", "region=eu-west-1"],
    "model": ["--model", "mobilenet_v3_small"], "weights": ["--weights", "{weights}"],
    "labels": ["--labels", "{labels}"], "top_k": ["--top-k", "2"], "layer": ["--layer", "features"],
    "resize": ["--resize", "40"], "crop": ["--crop", "30"],
    "interpolation": ["--interpolation", "bicubic"], "mean": ["--mean", "0.4,0.4,0.4"],
    "std": ["--std", "0.3,0.3,0.3"], "batch_size": ["--batch-size", "8"], "device": ["--device", "cpu"],
    "precision": ["--precision", "fp16"], "channels_last": ["--no-channels-last"], "compile": ["--compile"],
    "decode": ["--decode", "sidecar"], "threads": ["--threads", "2"], "request_timeout_s": ["--request-timeout", "60"],
    "on_error": ["--on-error", "fail"], "max_pixels": ["--max-pixels", "1000"],
    "max_file_bytes": ["--max-file-bytes", "2048"], "logits": ["--logits"], "embeddings": ["--embeddings"],
    "output_kind": ["--output", "raw"],
    "master": ["--master", "local[1]"], "remote": ["--remote", "sc://127.0.0.1:15002"],
    "summary": ["--summary", "s.json"], "partition_by": ["--partition-by", "label"],
    "overwrite": ["--overwrite"], "quiet": ["--quiet"], "checkpoint": ["--checkpoint", "elsewhere"],
    "max_files_per_trigger": ["--max-files-per-trigger", "7"],
    "max_bytes_per_trigger": ["--max-bytes-per-trigger", "64m"], "settle_seconds": ["--settle-seconds", "5"],
    "codec": ["--codec", "jpeg"], "device_profile": ["--device-profile", "{profile}"],
    "min_score": ["--min-score", "0.5"], "max_detections": ["--max-detections", "3"],
    "jpeg_quality": ["--jpeg-quality", "80"], "row_group_mb": ["--row-group-mb", "8"],
}

PATHS = driver("INPUT and OUTPUT: where the driver reads and writes (check_paths, the source, the writer)")
INFERENCE = {
    "input": PATHS, "output": PATHS,
    "input_format": READER, "glob": READER, "image_column": READER, "path_column": READER, "label_column": READER,
    "storage_options": READER,  # the driver's listing; the tasks get it from the listed source (planning)
    "model": SIDECAR, "weights": SIDECAR, "top_k": SIDECAR, "layer": SIDECAR, "logits": SIDECAR, "output_kind": SIDECAR,
    "embeddings": SIDECAR, "resize": SIDECAR, "crop": SIDECAR, "interpolation": SIDECAR, "mean": SIDECAR,
    "std": SIDECAR,
    "batch_size": SIDECAR, "precision": SIDECAR, "channels_last": SIDECAR, "compile": SIDECAR,
    "max_pixels": SIDECAR, "max_file_bytes": SIDECAR,
    "device_profile": SIDECAR,  # read and checked by the driver; its JSON travels in RunOptions (the HELLO)
    "labels": TASK, "device": TASK, "threads": TASK, "decode": TASK, "request_timeout_s": TASK, "on_error": TASK,
    "master": driver("the Spark master of the job's session (job_io.job_session)"),
    "remote": driver("the Spark Connect server of the job's session (job_io.job_session)"),
    "summary": driver("a copy of the JSON summary, written by the driver"),
    "partition_by": driver("the driver's Parquet writer (partitionBy)"),
    "overwrite": driver("whether the driver may replace OUTPUT (check_paths, publish)"),
    "quiet": driver("the driver's report and Spark's log level"),
}
# detect and segment: classify's flags but the classification heads; detect's limits are the sidecar's, and
# images at their own size are made by the tasks only (--decode sidecar is refused).
DENSE = {name: where for name, where in INFERENCE.items() if name not in ("top_k", "layer", "logits", "embeddings",
                                                                          "partition_by")}
DENSE["decode"] = REFUSED
# Where each flag of each job goes (a job lists only the flags its parser has; the test checks that too).
JOBS = {
    "classify": INFERENCE,
    "embed": INFERENCE,
    "detect": {**DENSE, "min_score": SIDECAR, "max_detections": SIDECAR},
    "segment": DENSE,
    "etl": {**INFERENCE, "input_format": REFUSED, "image_column": REFUSED, "path_column": REFUSED,
            "label_column": REFUSED, "partition_by": REFUSED, "overwrite": REFUSED,
            "checkpoint": driver("the ETL's checkpoint location (which files are done)"),
            "max_files_per_trigger": driver("the ETL's micro-batch size (files per batch)"),
            "max_bytes_per_trigger": driver("the ETL's micro-batch size (input bytes per batch)"),
            "settle_seconds": driver("which listed files a run takes (etl_listing.settled)")},
    "to-petastorm": {
        "input": PATHS, "output": PATHS,
        "input_format": READER, "glob": READER, "image_column": READER, "path_column": READER,
        "label_column": READER, "storage_options": READER,
        "codec": TASK, "jpeg_quality": TASK, "on_error": TASK, "max_pixels": TASK, "max_file_bytes": TASK,
        "row_group_mb": driver("the driver's Parquet writer (parquet.block.size)"),
        "master": INFERENCE["master"], "overwrite": INFERENCE["overwrite"], "quiet": INFERENCE["quiet"]},
}
INFERENCE_SAMPLES = {"input_format": ["--input-format", "parquet"]}  # etl: a table input is refused
# detect and segment run the tiny models of their kind; another model of that kind as the sample.
DENSE_MODELS = {"detect": TINY_DETECTOR, "segment": TINY_SEGMENTER}
DENSE_SAMPLES = {"detect": {"model": ["--model", "ssdlite320_mobilenet_v3_large"],
                            "weights": ["--weights", "{detector}"], "labels": ["--labels", "{tiny_labels}"]},
                 "segment": {"model": ["--model", "lraspp_mobilenet_v3_large"],
                             "weights": ["--weights", "{segmenter}"], "labels": ["--labels", "{tiny_labels}"]}}
# Flags given before and after the sample: the digits model takes only 32x32 crops.
BASE_FOR = {"crop": ["--model", "mobilenet_v3_small"]}

# Commands that run no Spark job and plan no inference: each flag and what it changes.
TOOLS = {
    "run": {"preset": "the YAML preset whose job and options run", "overrides": "the job's own flags, as above"},
    "demo": {"workdir": "where the demo images and weights go", "output": "the demo's Parquet output",
             "master": "the demo's Spark master", "summary": "a copy of the demo's summary"},
    "bench-sidecar": {
        "model": "the benchmarked model", "clients": "client processes", "request_size": "images per request",
        "batch_size": "the benchmark sidecar's batch size", "device": "the benchmark sidecar's device",
        "decode": "where the benchmark decodes", "precision": "the benchmark sidecar's precision",
        "channels_last": "the benchmark sidecar's memory layout", "compile": "torch.compile in the benchmark",
        "threads": "torch threads in the benchmark", "seconds": "measured seconds", "warmup": "warm-up seconds",
        "rounds": "off/on alternations", "in_flight": "requests in flight per client",
        "image_size": "the benchmark's input size", "json": "the results file"},
    "bench": {"quick": "the smaller comparison", "models": "the compared models", "images": "images per variant",
              "variants": "the compared pipelines", "data_dir": "the image cache", "json": "the results file",
              "plot": "the chart file"},
    "bench-decode": {"images": "files per image set", "seconds": "measured seconds", "rounds": "rounds",
                     "resize": "the resize target", "crop": "the crop", "sets": "the image sets",
                     "json": "the results file"},
    "bench-scale": {"files": "how many images", "quick": "one run, no baseline",
                    "plan_only": "planning alone, no inference", "etl": "an etl run as well",
                    "data_dir": "the image cache", "json": "the results file"},
    "profile": {"model": "the profiled model", "weights": "its state_dict", "device": "the profiled device",
                "batch_sizes": "the predicted batch sizes", "threads": "torch threads", "tuning": "the tuner's mode",
                "validate": "measure as well as predict", "recalibrate": "measure the device again",
                "calibration_seconds": "calibration time", "json": "the result file", "plot": "the chart file",
                "allow_noisy_calibration": "nothing (deprecated)", "strict": "refuse a noisy calibration",
                "export": "the exported device profile"},
    "plan": {"model": "the planned model", "weights": "its state_dict", "images": "the planned images",
             "executors": "the planned executors", "cores": "cores per executor", "device": "the planned device",
             "threads": "torch threads", "calibration_seconds": "calibration time", "json": "the result file",
             "device_profile": "the profile planned from, instead of calibrating here",
             "allow_noisy_calibration": "nothing (deprecated)", "strict": "refuse a noisy calibration"},
    "submit": {"spark_submit_args": "spark-submit's own arguments, passed on unchanged"},
    "doctor": {"master": "the probed session's Spark master", "device": "the probe sidecar's device",
               "json": "the results file"},
    "validate": {"models": "the validated models", "batch_sizes": "the measured batch sizes",
                 "repeats": "timed calls per point", "sweeps": "passes over the sizes",
                 "point_budget_s": "time per point", "threads": "torch threads", "layers_at": "the per-layer report",
                 "cache_dir": "the device profiles", "refresh": "calibrate again", "calibrate_each": "per model",
                 "clock": "what is timed", "json": "the results file", "zoo": "every torchvision classifier",
                 "heldout": "the held-out timm networks", "generated": "the hand-written networks of a frozen seed",
                 "max_gflops": "the zoo's FLOP budget", "attribute_at": "the zoo's per-kind attribution",
                 "markdown": "the zoo's tables"},
}


def _subcommands() -> dict:
    return build_parser()._subparsers._group_actions[0].choices  # argparse has no public walk


def _dests(parser) -> list[str]:
    return [a.dest for a in parser._actions if a.dest != "help"]


def test_every_flag_is_accounted_for():
    commands = _subcommands()
    assert set(commands) == set(JOBS) | set(TOOLS), "a new command: list its flags in JOBS or TOOLS"
    for name, parser in commands.items():
        dests = set(_dests(parser))
        listed = JOBS[name] if name in JOBS else TOOLS[name]
        missing = dests - set(listed)
        assert not missing, f"{name}: flags {sorted(missing)} are not accounted for: add them to JOBS or TOOLS"
        if name in TOOLS:
            assert set(listed) == dests, f"{name}: stale entries {sorted(set(listed) - dests)}"
        without_sample = dests - set(SAMPLES) - {"input", "output"} if name in JOBS else set()
        assert not without_sample, f"{name}: give {sorted(without_sample)} a non-default value in SAMPLES"


INFERENCE_COMMANDS = ("classify", "embed", "etl", "detect", "segment")
CASES = [(name, dest) for name, parser in _subcommands().items() if name in JOBS
         for dest in _dests(parser) if dest not in ("input", "output")]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reach")
    weights, labels, profile = folder / "digits.pth", folder / "labels.txt", folder / "device.json"
    torch.save(digits_cnn().state_dict(), weights)
    labels.write_text("".join(f"digit {i}\n" for i in range(10)))
    profile.write_text(synthetic_profile().to_json())
    detector, segmenter, tiny_labels = folder / "detector.pth", folder / "segmenter.pth", folder / "tiny.txt"
    torch.save(tiny_detector().state_dict(), detector)
    torch.save(tiny_segmenter().state_dict(), segmenter)
    tiny_labels.write_text("".join(f"class {i}\n" for i in range(TINY_CLASSES)))
    return {"weights": str(weights), "labels": str(labels), "profile": str(profile), "detector": str(detector),
            "segmenter": str(segmenter), "tiny_labels": str(tiny_labels)}


def _argv(name: str, dest: str, files: dict, *, sample: bool = True) -> list[str]:
    """The command line for `dest`'s case: with its sample value, or (sample=False) the baseline."""
    base = [name, "in/", "out/"]
    if name in DENSE_MODELS:
        base += ["--model", DENSE_MODELS[name]]
    elif name in INFERENCE_COMMANDS:
        base += ["--model", DIGITS_FACTORY, *BASE_FOR.get(dest, [])]
        if name == "etl":
            base += ["--checkpoint", "ck/"]
    if not sample:
        return base
    sample = (INFERENCE_SAMPLES.get(dest) if name == "etl" else None) or DENSE_SAMPLES.get(name, {}).get(dest) or \
        SAMPLES[dest]
    return base + [token.format(**files) for token in sample]


def _surfaces(name: str, argv: list[str]) -> dict:
    """What the reader, the tasks and the sidecar would see for these flags, built as the command builds them."""
    args = build_parser().parse_args(argv)
    if name == "to-petastorm":
        config = petastorm_config(args)
        encoder = vars(petastorm_encoder(config, None))
        return {"config": config, READER: config.inputs, TASK: encoder, SIDECAR: None}
    if name == "etl":
        job = etl.etl_config(resolution.resolve(etl.option_table(), flags=resolution.given(args)))
        config = job.classify
    else:
        config = classify.classify_config(args, embed=name == "embed", task=name if name in DENSE_MODELS else
                                          "classify")
        job = config
    options = config.inference
    plan = plan_inference(options, check_model(options), app_id="app", job_id="job")
    hello = Hello.from_json(Hello("token", plan.endpoint, plan.job_id, decode=plan.decode,
                                  run_options=plan.run_options, decode_options=plan.decode_options).to_json())
    task = dataclasses.replace(plan, endpoint=None, run_options=None)  # those two travel in the HELLO
    return {"config": job, READER: config.inputs, TASK: task, SIDECAR: hello}


@pytest.mark.parametrize("name, dest", CASES, ids=[f"{n}-{d}" for n, d in CASES])
def test_a_non_default_value_reaches_its_place_or_is_refused(name, dest, files):
    where = JOBS[name][dest]
    argv = _argv(name, dest, files)
    if where == REFUSED:
        with pytest.raises(ConfigError):
            _surfaces(name, argv)
        return
    before, after = _surfaces(name, _argv(name, dest, files, sample=False)), _surfaces(name, argv)
    if isinstance(where, tuple):  # driver-only: in the job's config, and nowhere the tasks or sidecar look
        assert after["config"] != before["config"], f"{name} {dest} did not reach the job config"
        for place in (READER, TASK, SIDECAR):
            assert after[place] == before[place], f"{name} {dest} is listed driver-only but changes the {place}"
        return
    assert after[where] != before[where], f"{name} {dest}: the {where} does not see the value"


# Options without a flag (presets and spark.cnn.* keys only): a value for each, with what else it needs.
FLAGLESS = {"request_rows": {"request-rows": 8}, "max_in_flight": {"max-in-flight": 2},
            "idle_timeout_s": {"idle-timeout-s": 60}, "layer": {"layer": "features", "embeddings": True}}


@pytest.mark.parametrize("job", [classify, etl])
def test_options_without_a_flag_reach_the_tasks(job):
    table = job.option_table()
    flagless = {name for name, option in table.items() if option.flag is None} - {"input", "output"}
    assert flagless == set(FLAGLESS), "an option without a flag: give it a value in FLAGLESS"
    flags = {"input": "in/", "output": "out/", "model": DIGITS_FACTORY, "checkpoint": "ck/"}

    def plan(preset: dict):
        config = job.config_from(resolution.resolve(table, flags=flags, preset=preset)) if job is classify else \
            job.etl_config(resolution.resolve(table, flags=flags, preset=preset)).classify
        return plan_inference(config.inference, check_model(config.inference), app_id="app", job_id="job")

    before = plan({})
    for name, preset in FLAGLESS.items():
        assert plan(preset) != before, f"{name} set in a preset does not reach the plan"
