"""What the driver does with paths on a real local Spark: outputs around the input are refused and the input
survives, `--overwrite` keeps the old output until the new one is in place (and a later job recovers it),
weights changed in place reach the executors, and local listing gives one row per reachable file."""

from __future__ import annotations

import os
from urllib.parse import urlparse

import pyarrow.parquet as pq
import pytest
import torch

from spark_cnn.config import ClassifyConfig, EtlConfig, InferenceOptions, PetastormConfig
from spark_cnn.errors import InputError
from spark_cnn.models.digits import DIGITS_FACTORY
from spark_cnn.models.spec import ModelSpec
from spark_cnn.spark import listing
from spark_cnn.spark.classify_job import classify, embed
from spark_cnn.spark.etl_job import run_etl
from spark_cnn.spark.job_lock import job_lock
from spark_cnn.spark.petastorm_job import to_petastorm
from spark_cnn.spark.storage import HadoopFS
from tests.sample_images import real_image_files, write_files

pytestmark = pytest.mark.spark


def _digits(root) -> str:
    return write_files(str(root), {k: v for k, v in real_image_files().items() if "digits" in k})


def _snapshot(root: str) -> dict[str, bytes]:
    found = {}
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                found[os.path.relpath(os.path.join(folder, name), root)] = f.read()
    return found


def _rows(output: str) -> dict[str, dict]:
    rows = pq.read_table(output).to_pylist()
    by_path = {urlparse(r["path"]).path: r for r in rows}
    assert len(by_path) == len(rows), "a path appears twice in the output"
    return by_path


def _jobs_run(spark) -> int:
    return len(spark.sparkContext.statusTracker().getJobIdsForGroup())


def _run(job: str, spark, weights: str, source: str, output: str):
    model = InferenceOptions(ModelSpec(DIGITS_FACTORY, weights))
    if job == "classify":
        return classify(ClassifyConfig(source, output, model, overwrite=True), spark=spark)
    if job == "embed":
        return embed(ClassifyConfig(source, output, model, overwrite=True), spark=spark)
    if job == "to-petastorm":
        return to_petastorm(PetastormConfig(source, output, overwrite=True), spark=spark)
    return run_etl(EtlConfig(ClassifyConfig(source, output, model), checkpoint=output + "-checkpoint"), spark=spark)


@pytest.mark.parametrize("job", ["classify", "embed", "to-petastorm", "etl"])
@pytest.mark.parametrize("where, refused", [("photos/..", "contains the input"), ("photos", "is the input"),
                                            ("photos/out", "lies inside the input"), ("link/..", "contains")])
def test_an_output_around_the_input_is_refused_before_spark_and_the_input_survives(spark, demo_assets, tmp_path,
                                                                                    job, where, refused):
    photos = _digits(tmp_path / "photos")
    os.symlink(photos, tmp_path / "link")  # link/.. is tmp_path once the link is resolved
    before, jobs_before = _snapshot(str(tmp_path)), _jobs_run(spark)
    with pytest.raises(InputError, match=refused):
        _run(job, spark, demo_assets.weights, photos, str(tmp_path / where))
    assert _jobs_run(spark) == jobs_before, "a Spark job ran before the path check"
    assert _snapshot(str(tmp_path)) == before


def test_an_etl_checkpoint_inside_the_input_is_refused(spark, demo_assets, tmp_path):
    photos = _digits(tmp_path / "photos")
    config = EtlConfig(ClassifyConfig(photos, str(tmp_path / "out"), InferenceOptions(
        ModelSpec(DIGITS_FACTORY, demo_assets.weights))), checkpoint=str(tmp_path / "photos" / "_checkpoint"))
    with pytest.raises(InputError, match="checkpoint .* overlaps the input"):
        run_etl(config, spark=spark)
    assert not (tmp_path / "out").exists() and not (tmp_path / "photos" / "_checkpoint").exists()


def _hidden_siblings(folder) -> list[str]:
    return sorted(name for name in os.listdir(folder) if ".spark_cnn-" in name)


def test_overwrite_leaves_no_old_output_behind(spark, demo_assets, tmp_path):
    photos, output = _digits(tmp_path / "photos"), tmp_path / "out"
    output.mkdir()
    (output / "old.parquet").write_bytes(b"old")
    _run("classify", spark, demo_assets.weights, photos, str(output))
    assert not (output / "old.parquet").exists() and len(_rows(str(output))) == 3
    assert _hidden_siblings(tmp_path) == []


def test_a_failed_rename_of_the_new_output_puts_the_old_one_back(spark, demo_assets, tmp_path, monkeypatch):
    photos, output = _digits(tmp_path / "photos"), tmp_path / "out"
    output.mkdir()
    (output / "old.parquet").write_bytes(b"old")
    rename = HadoopFS.rename

    def failing(self, source, target):
        if source.endswith(".tmp"):  # the staged output going in: the filesystem refuses
            raise OSError(f"could not rename {source} to {target}")
        rename(self, source, target)

    monkeypatch.setattr(HadoopFS, "rename", failing)
    with pytest.raises(OSError, match="could not rename"):
        _run("classify", spark, demo_assets.weights, photos, str(output))
    assert (output / "old.parquet").read_bytes() == b"old"
    assert not any(name.endswith((".old", ".aside")) for name in _hidden_siblings(tmp_path))


@pytest.mark.parametrize("overwrite", [False, True])
def test_the_next_job_restores_an_old_output_a_killed_publish_left_aside(spark, demo_assets, tmp_path, overwrite):
    # What a driver killed between publish's two renames leaves: the old output aside, the new one staged.
    photos = _digits(tmp_path / "photos")
    aside, staged = tmp_path / ".out.spark_cnn-killed.old", tmp_path / ".out.spark_cnn-killed.tmp"
    aside.mkdir()
    (aside / "old.parquet").write_bytes(b"old")
    staged.mkdir()
    (staged / "part-0.parquet").write_bytes(b"new, never published")
    config = ClassifyConfig(photos, str(tmp_path / "out"), InferenceOptions(
        ModelSpec(DIGITS_FACTORY, demo_assets.weights)), overwrite=overwrite)
    if not overwrite:
        with pytest.raises(InputError, match="already exists; use --overwrite"):
            classify(config, spark=spark)
        assert (tmp_path / "out" / "old.parquet").read_bytes() == b"old"
    else:
        classify(config, spark=spark)
        assert len(_rows(str(tmp_path / "out"))) == 3
    assert _hidden_siblings(tmp_path) == []


@pytest.mark.parametrize("job, locked", [("classify", "out"), ("to-petastorm", "out"), ("etl", "out"),
                                         ("etl", "out-checkpoint")])
def test_a_second_job_on_a_locked_output_or_checkpoint_stops_before_spark_and_touches_nothing(
        spark, demo_assets, tmp_path, job, locked):
    # A scheduler's retry started while the first driver still runs: the first holds the lock.
    photos, output = _digits(tmp_path / "photos"), tmp_path / "out"
    output.mkdir()
    (output / "part-0.parquet").write_bytes(b"the first job's output")
    before, jobs_before = _snapshot(str(tmp_path)), _jobs_run(spark)
    what = "checkpoint" if locked.endswith("checkpoint") else "output"
    with job_lock(str(tmp_path / locked), what=what):
        with pytest.raises(InputError, match=f"{what} .*{locked} is being written by another job") as raised:
            _run(job, spark, demo_assets.weights, photos, str(output))
    assert "\n" not in str(raised.value)
    assert _jobs_run(spark) == jobs_before and _snapshot(str(tmp_path)) == before


def test_weights_changed_in_place_reach_the_executors_in_the_same_session(spark, demo_assets, tmp_path):
    photos, weights = _digits(tmp_path / "photos"), str(tmp_path / "w.pth")
    state = torch.load(demo_assets.weights, weights_only=True)
    torch.save(state, weights)
    spec = ModelSpec(DIGITS_FACTORY, weights)
    first = classify(ClassifyConfig(photos, str(tmp_path / "first"), InferenceOptions(spec)), spark=spark)
    labels = {row["label"] for row in _rows(str(tmp_path / "first")).values()}
    assert labels != {7}

    state["classifier.3.bias"][7] = 1e4  # every image is now a 7
    torch.save(state, weights)  # same path, same session
    second = classify(ClassifyConfig(photos, str(tmp_path / "second"), InferenceOptions(spec)), spark=spark)
    assert {row["label"] for row in _rows(str(tmp_path / "second")).values()} == {7}
    assert first["ok"] == second["ok"] == 3


def test_listing_gives_one_row_per_reachable_file_and_one_per_unreadable_folder(spark, demo_assets, tmp_path,
                                                                                monkeypatch):
    photos = _digits(tmp_path / "in" / "real")
    os.symlink(tmp_path / "in", os.path.join(photos, "loop"))  # in/real/loop/real/loop/... without end
    elsewhere = write_files(str(tmp_path / "elsewhere"), {"empty.png": b"", "ok.png": _snapshot(photos)[
        next(iter(sorted(_snapshot(photos))))]})
    os.symlink(elsewhere, tmp_path / "in" / "linked")
    locked = write_files(str(tmp_path / "in" / "locked"), {"hidden-from-us.png": b"x"})
    scandir = os.scandir

    def refuse_locked(path):  # tests run as root, which reads any folder: refuse it as the kernel would a user
        if path == locked:
            raise PermissionError(13, "Permission denied", path)
        return scandir(path)

    monkeypatch.setattr(listing, "_scandir", refuse_locked)
    output = str(tmp_path / "out")
    summary = classify(ClassifyConfig(str(tmp_path / "in"), output, InferenceOptions(
        ModelSpec(DIGITS_FACTORY, demo_assets.weights))), spark=spark)
    rows = _rows(output)
    inside = {os.path.relpath(p, tmp_path / "in"): r for p, r in rows.items()}
    expected = {os.path.join("real", name) for name in _snapshot(photos)} | {"linked/empty.png", "linked/ok.png",
                                                                              "locked"}
    assert set(inside) == expected, "each reachable file exactly once, the loop walked once"
    assert "empty" in inside["linked/empty.png"]["error"]
    assert inside["linked/ok.png"]["error"] is None
    assert "could not list this folder when the job started" in inside["locked"]["error"]
    assert summary["images"] == len(expected) and summary["errors"] == 2
