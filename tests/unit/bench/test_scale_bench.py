"""`spark-cnn bench-scale` pieces that need no Spark: the generated files, the event-log maths, output sizing,
the targets."""

from __future__ import annotations

import io
import os

import pyarrow as pa
import pyarrow.parquet as pq
from PIL import Image

from spark_cnn.bench import scale, scale_data, scale_job


def _task_end(stage: int, launch: int, finish: int, records: int, failed: bool = False) -> dict:
    return {"Event": "SparkListenerTaskEnd", "Stage ID": stage,
            "Task Info": {"Launch Time": launch, "Finish Time": finish, "Failed": failed},
            "Task Metrics": {"Output Metrics": {"Records Written": records, "Bytes Written": 10 * records}}}


def test_generated_files_are_real_pngs_in_class_folders_and_are_made_once(tmp_path):
    root = scale_data.scale_input(25, str(tmp_path), workers=1, log=lambda _: None)
    files = sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names)
    assert "_COMPLETE" in files and len(files) == 26
    labels = scale_data.digit_labels()
    for i in (0, 13, 24):
        path = scale_data.file_path(root, i, labels[i])
        assert path.startswith(os.path.join(root, str(labels[i]), "g00000"))
        with Image.open(path) as image:
            assert (image.format, image.size, image.mode) == ("PNG", (8, 8), "L")
    before = os.stat(scale_data.file_path(root, 3, labels[3])).st_mtime_ns
    assert scale_data.scale_input(25, str(tmp_path), workers=1, log=lambda _: 1 / 0) == root  # cached: no log
    assert os.stat(scale_data.file_path(root, 3, labels[3])).st_mtime_ns == before
    with Image.open(io.BytesIO(scale_data.digit_pngs()[0])) as first:
        assert first.getextrema()[1] > 200  # 0-16 scaled to 0-255


def test_slices_cover_every_index_once_in_whole_groups():
    parts = scale_data.slices(1_000_000, 3)
    assert parts[0][0] == 0 and parts[-1][1] == 1_000_000
    assert all(a[1] == b[0] for a, b in zip(parts, parts[1:], strict=False))
    assert all(start % scale_data.INDICES_PER_GROUP == 0 for start, _ in parts)
    assert scale_data.slices(10, 4) == [(0, 10)]


def test_the_steady_rate_leaves_out_the_first_wave_and_counts_the_slots():
    tasks = [{"launch_ms": 0, "finish_ms": 4000, "records": 100},  # first wave: worker and sidecar start
             {"launch_ms": 0, "finish_ms": 4000, "records": 100},
             *({"launch_ms": 4000 + 1000 * k, "finish_ms": 5000 + 1000 * k, "records": 100} for k in range(6))]
    tasks[2]["launch_ms"] = 3998  # Spark launched it just before it recorded the finish of the task it follows
    rate = scale.steady_rate(tasks, slots=2)
    assert (rate["tasks"], rate["slots"]) == (8, 2)
    assert rate["steady"] == round(2 * 600 / 6.002, 2)  # ~100 rows per task-second, two slots
    assert rate["job"] == 80.0  # 800 rows over 10 s
    one_wave = scale.steady_rate(tasks[:2], slots=2)
    assert one_wave["steady"] == one_wave["job"] == 50.0
    assert scale.steady_rate([], slots=2)["steady"] is None


def test_the_inference_stage_is_the_one_that_wrote_the_rows_and_failed_attempts_do_not_count():
    events = [_task_end(0, 0, 10, 0), _task_end(1, 10, 20, 500), _task_end(1, 10, 30, 500),
              _task_end(1, 10, 15, 400, failed=True), {"Event": "SparkListenerJobStart"}]
    tasks = scale.tasks_of(events)
    assert len(tasks) == 3
    chosen = scale.inference_tasks(tasks)
    assert {t["stage"] for t in chosen} == {1} and sum(t["records"] for t in chosen) == 1000
    # nothing written (--plan-only): the stage with the most tasks
    plan = scale.inference_tasks(scale.tasks_of([_task_end(0, 0, 1, 0), _task_end(2, 1, 2, 0), _task_end(2, 1, 3, 0)]))
    assert {t["stage"] for t in plan} == {2}
    starts = [{"Event": "SparkListenerTaskStart", "Task Info": {"Launch Time": t}} for t in (5, 50, 70)]
    assert scale.first_task_ms(starts, 40) == 50 and scale.first_task_ms(starts, 80) is None


def test_output_stats_count_visible_parquet_files_and_judge_their_number(tmp_path):
    table = pa.table({"path": [f"p{i}" for i in range(30)], "error": [None] * 30})
    for i in range(3):
        pq.write_table(table, tmp_path / f"part-{i}.parquet")
    (tmp_path / "_staging").mkdir()
    pq.write_table(table, tmp_path / "_staging" / "part-9.parquet")  # hidden from readers: not counted
    stats = scale.output_stats(str(tmp_path))
    assert (stats["files"], stats["rows"], stats["rows_per_file"]) == (3, 90, 30.0)
    assert scale.output_ok(stats, cores=2)  # few rows: up to three files per core
    assert not scale.output_ok({"files": 2_000, "rows": 1_000_000}, cores=2)  # 500 rows per file
    assert scale.output_ok({"files": 50, "rows": 1_000_000}, cores=2)


def test_targets_compare_the_big_run_with_the_baseline_and_etl_with_classify():
    def run(steady: float, call_s: float, planning: float, rss: float, files: int, rows: int) -> dict:
        return {"rate": {"steady": steady}, "call_s": call_s, "first_inference_task_s": planning,
                "driver_rss_mb": rss, "output": {"files": files, "rows": rows}}

    report = {"files": 200_000, "runs": {
        "classify-20000": run(700.0, 40.0, 20.0, 900.0, 6, 20_000),
        "classify-200000": run(660.0, 300.0, 25.0, 1_100.0, 10, 200_000),
        "etl-200000": run(0.0, 330.0, 0.0, 1_000.0, 10, 200_000)}}
    found = {t["target"].split(" at ")[0].split(" for ")[0].split(" 200")[0]: t for t in scale.targets(report, cores=2)}
    assert all(t["met"] for t in found.values()), found
    assert found["steady rate"]["value"] == round(660 / 700, 3)
    assert found["etl / classify rate over"]["value"] == round(300 / 330, 3)
    report["runs"]["classify-200000"]["rate"]["steady"] = 600.0  # 0.86 of the baseline
    assert [t["met"] for t in scale.targets(report, cores=2) if t["target"].startswith("steady")] == [False]


def test_the_measured_driver_loads_the_near_free_model_by_name_without_torch():
    from spark_cnn.bench import tiny
    from spark_cnn.bench.variants import IDENTITY_FACTORY

    assert scale_job.IDENTITY_FACTORY == IDENTITY_FACTORY
    module, _, name = IDENTITY_FACTORY.partition(":")
    assert module == tiny.__name__ and callable(getattr(tiny, name))


def test_the_command_line_sizes_the_run_and_refuses_a_contradiction():
    import pytest

    from spark_cnn.cli import build_parser
    from spark_cnn.cli.bench_scale import scale_config
    from spark_cnn.errors import ConfigError

    def config(*argv: str) -> scale.ScaleConfig:
        return scale_config(build_parser().parse_args(["bench-scale", *argv]))

    assert (config().files, config().quick) == (1_000_000, False)
    assert (config("--quick").files, config("--quick", "--files", "300").files) == (20_000, 300)
    assert config("--plan-only", "--files", "5").plan_only
    with pytest.raises(ConfigError, match="choose one"):
        config("--quick", "--plan-only")
    with pytest.raises(ConfigError, match="positive"):
        config("--files", "0")
