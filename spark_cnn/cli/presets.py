"""YAML job presets: a file that names a job and its options, run with `spark-cnn run conf/JOB.yaml`.

    job: classify            # which job: classify | detect | segment | etl | to-petastorm
    input: /data/images
    output: /data/out
    model: resnet50
    batch-size: auto         # any option of the job, spelled as its flag without the dashes

Only the file format is checked here; the options are checked by `options.resolve` against the job's own.
"""

from __future__ import annotations

from spark_cnn.errors import ConfigError, InputError

JOB_KEY = "job"


def load_preset(path: str) -> tuple[str, dict]:
    """(job name, options) from a preset file. YAML is read with safe_load: no tags, no code."""
    import yaml

    try:
        with open(path, encoding="utf-8") as f:
            data = yaml.safe_load(f)
    except OSError as e:
        raise InputError(f"preset {path}: {e.strerror}") from e
    except yaml.YAMLError as e:
        raise ConfigError(f"preset {path} is not valid YAML: {' '.join(str(e).split())}") from e
    return parse_preset(data, path)


def parse_preset(data, name: str) -> tuple[str, dict]:
    if not isinstance(data, dict):
        raise ConfigError(f"preset {name}: expected a mapping of option: value, found {type(data).__name__}")
    options = dict(data)
    job = options.pop(JOB_KEY, None)
    if not isinstance(job, str) or not job:
        raise ConfigError(f"preset {name}: needs `{JOB_KEY}: NAME` saying which job it runs (e.g. job: classify)")
    return job, options
