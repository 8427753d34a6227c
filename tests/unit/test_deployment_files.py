"""docker/ and conf/ cannot be built or run here (no Docker engine): check what can be checked without one, so they
stay consistent with pyproject.toml and the commands as both change."""

from __future__ import annotations

import os
import re

import pytest

from spark_cnn.cli import build_parser

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEPLOYMENT_FILES = [os.path.join(folder, name) for folder in ("docker", "conf")
                    for name in sorted(os.listdir(os.path.join(REPO, folder)))]


def _read(rel: str) -> str:
    with open(os.path.join(REPO, rel), encoding="utf-8") as f:
        return f.read()


def _requires_python() -> str:
    return re.search(r'^requires-python\s*=\s*"([^"]+)"', _read("pyproject.toml"), re.M)[1]


def _dependency(package: str) -> str:
    """The version range pyproject.toml gives `package`, required or in an extra ("pyspark>=3.5,<5" -> ">=3.5,<5")."""
    return re.search(rf'"{package}([<>=!~][^";]*)', _read("pyproject.toml"))[1].strip()


def test_the_image_python_satisfies_requires_python_and_spark_home_uses_it():
    dockerfile = _read("docker/Dockerfile")
    versions = set(re.findall(r"python(3\.\d+)", dockerfile))
    assert len(versions) == 1, f"the Dockerfile names several Pythons: {versions}"
    image = tuple(int(p) for p in versions.pop().split("."))
    minimum = re.fullmatch(r">=(\d+)\.(\d+)", _requires_python())
    assert image >= (int(minimum[1]), int(minimum[2]))
    assert f"lib/python{image[0]}.{image[1]}/site-packages/pyspark" in dockerfile


@pytest.mark.parametrize("package", ["pyspark", "torch"])
def test_docker_readme_states_the_pyproject_ranges(package):
    stated = _dependency(package)
    assert f"{package} {stated}" in _read("docker/README.md"), f"docker/README.md should say {package} {stated}"


def test_the_image_holds_jobs_conf_and_the_installed_package():
    dockerfile = _read("docker/Dockerfile")
    for line in ("COPY jobs /opt/spark_cnn/jobs", "COPY conf /opt/spark_cnn/conf", "COPY spark_cnn /tmp/src/spark_cnn",
                 "COPY pyproject.toml README.md /tmp/src/", '"/tmp/src[spark]"'):  # pyspark is the spark extra
        assert line in dockerfile


@pytest.mark.parametrize("rel", DEPLOYMENT_FILES + ["README.md"])
def test_files_and_commands_named_in_deployment_files_exist(rel):
    text = _read(rel)
    for path in set(re.findall(r"(?:/opt/spark_cnn/|\.\./|\b)((?:jobs|conf)/[\w.-]+\.\w+)", text)):
        assert os.path.exists(os.path.join(REPO, path)), f"{rel} names {path}, which does not exist"
    commands = build_parser()._subparsers._group_actions[0].choices
    for command in set(re.findall(r"\bspark-cnn ([a-z][a-z-]+)", text)):
        assert command in commands, f"{rel} runs `spark-cnn {command}`, which is not a command"
