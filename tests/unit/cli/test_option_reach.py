"""Each job option's declaration says where its value is read (`reaches`: the reader, the tasks, the sidecar or the
driver alone) and gives a non-default `example`; docs/options.md shows both. Here every option of every job,
parsed from its flag (or a preset, for those without one) and resolved as the command does it, is held to its
declaration: the example must change what that place sees, and a driver-only option must change nothing the
reader, the tasks or the sidecar see. A combination a command refuses must be refused with a ConfigError.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from spark_cnn.cli import build_parser, classify, etl, resolution, to_petastorm
from spark_cnn.cli.to_petastorm import petastorm_config
from spark_cnn.errors import ConfigError
from spark_cnn.models.digits import DIGITS_FACTORY, digits_cnn
from spark_cnn.models.tiny_dense import TINY_CLASSES, TINY_DETECTOR, TINY_SEGMENTER, tiny_detector, tiny_segmenter
from spark_cnn.options import READERS
from spark_cnn.spark.petastorm_job import petastorm_encoder
from spark_cnn.spark.planning import check_model, plan_inference
from spark_cnn.task.protocol import Hello
from tests.perf_doubles import synthetic_profile

READER, TASKS, SIDECAR, DRIVER = READERS
TABLES = {"classify": lambda: classify.option_table("classify"), "embed": lambda: classify.option_table("embed"),
          "detect": lambda: classify.option_table("detect"), "segment": lambda: classify.option_table("segment"),
          "etl": etl.option_table, "to-petastorm": to_petastorm.option_table}
# What each command refuses, whatever the declaration says: etl reads image files (no columns, no partitioning,
# it appends); detect and segment send images at their own size, which only the tasks make.
REFUSED = {"etl": {"image_column", "path_column", "label_column", "partition_by", "overwrite"},
           "detect": {"decode"}, "segment": {"decode"}}
# Options whose example names a file: the test's own files stand in for them.
FILE_OPTIONS = {"weights": "weights", "labels": "labels", "device_profile": "profile"}
# detect and segment run the tiny models of their kind; the sample is another model of that kind.
DENSE_MODELS = {"detect": TINY_DETECTOR, "segment": TINY_SEGMENTER}
DENSE_SAMPLES = {"detect": {"model": "ssdlite320_mobilenet_v3_large", "weights": "{detector}", "labels": "{tiny}"},
                 "segment": {"model": "lraspp_mobilenet_v3_large", "weights": "{segmenter}", "labels": "{tiny}"}}
# What else an option needs to be taken: the digits model takes only 32x32 crops.
BASE_FOR = {"crop": ["--model", "mobilenet_v3_small"]}

# Every option with a flag in a command, and each preset-only one (a flag in no command) in each command.
FLAGGED = {name for table in TABLES.values() for name, option in table().items() if option.flag}
CASES = [(command, name) for command, table in TABLES.items() for name, option in table().items()
         if not option.positional and (option.flag or name not in FLAGGED)]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("reach")
    weights, labels, profile = folder / "digits.pth", folder / "labels.txt", folder / "device.json"
    torch.save(digits_cnn().state_dict(), weights)
    labels.write_text("".join(f"digit {i}\n" for i in range(10)))
    profile.write_text(synthetic_profile().to_json())
    detector, segmenter, tiny = folder / "detector.pth", folder / "segmenter.pth", folder / "tiny.txt"
    torch.save(tiny_detector().state_dict(), detector)
    torch.save(tiny_segmenter().state_dict(), segmenter)
    tiny.write_text("".join(f"class {i}\n" for i in range(TINY_CLASSES)))
    return {"weights": str(weights), "labels": str(labels), "profile": str(profile), "detector": str(detector),
            "segmenter": str(segmenter), "tiny": str(tiny)}


def _base(command: str, name: str) -> list[str]:
    argv = [command, "in/", "out/"]
    if command in DENSE_MODELS:
        return argv + ["--model", DENSE_MODELS[command]]
    if command == "to-petastorm":
        return argv
    argv += ["--model", DIGITS_FACTORY, *BASE_FOR.get(name, [])]
    return argv + (["--checkpoint", "ck/"] if command == "etl" else [])


def _value(command: str, option, files: dict) -> str:
    """The option's example as typed, with this test's files for the options that name one."""
    dense = DENSE_SAMPLES.get(command, {}).get(option.name)
    if dense is not None:
        return dense.format(**files)
    if option.name in FILE_OPTIONS:
        return files[FILE_OPTIONS[option.name]]
    return option.example


def _surfaces(command: str, argv: list[str], preset: dict | None = None) -> dict:
    """What the reader, the tasks and the sidecar would see, built as the command builds them."""
    args = build_parser().parse_args(argv)
    if command == "to-petastorm":
        config = petastorm_config(args, preset=preset)
        return {"config": config, READER: config.inputs, TASKS: vars(petastorm_encoder(config, None)), SIDECAR: None}
    if command == "etl":
        job = etl.etl_config(resolution.resolve(etl.option_table(), flags=resolution.given(args), preset=preset))
        config = job.classify
    else:
        config = classify.classify_config(args, embed=command == "embed", preset=preset,
                                          task=command if command in DENSE_MODELS else "classify")
        job = config
    options = config.inference
    plan = plan_inference(options, check_model(options), app_id="app", job_id="job")
    hello = Hello.from_json(Hello("token", plan.endpoint, plan.job_id, decode=plan.decode,
                                  run_options=plan.run_options, decode_options=plan.decode_options).to_json())
    tasks = dataclasses.replace(plan, endpoint=None, run_options=None)  # those two travel in the HELLO
    return {"config": job, READER: config.inputs, TASKS: tasks, SIDECAR: hello}


@pytest.mark.parametrize("command, name", CASES, ids=[f"{c}-{n}" for c, n in CASES])
def test_an_example_value_reaches_where_the_declaration_says_or_is_refused(command, name, files):
    option = TABLES[command]()[name]
    assert option.reaches in READERS, f"{name}: declare reaches= (one of {READERS}) in its option(...)"
    assert option.switch or option.example, f"{name}: declare a non-default example= in its option(...)"
    base = _base(command, name)
    if option.flag:
        argv, preset = base + [option.flag] + ([] if option.switch else [_value(command, option, files)]), None
    else:  # no flag in this command: a preset key (and spark.cnn.* key) only
        argv = base
        preset = {option.preset_key: True if option.switch else _value(command, option, files)}
    if name in REFUSED.get(command, ()):
        with pytest.raises(ConfigError):
            _surfaces(command, argv, preset)
        return
    before = _surfaces(command, base)
    after = _surfaces(command, argv, preset)
    assert after["config"] != before["config"], f"{command} {name}: the example did not reach the job's config"
    if option.reaches == DRIVER:
        for place in (READER, TASKS, SIDECAR):
            assert after[place] == before[place], f"{command} {name} is declared driver-only but changes the {place}"
        return
    assert after[option.reaches] != before[option.reaches], \
        f"{command} {name}: declared read by the {option.reaches}, which does not see the example"
