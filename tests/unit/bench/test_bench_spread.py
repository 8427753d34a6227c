"""`spark-cnn bench --repeats N`: every variant measured in N rounds in a rotated order, each rate reported as the
median of its rounds with its min-max spread, each target as the median of ratios taken within a round."""

from __future__ import annotations

import doctest

import pytest

from spark_cnn.bench import dataset, report, spread, suite
from spark_cnn.cli import build_parser
from spark_cnn.errors import ConfigError


def test_the_spread_functions_do_what_their_examples_say():
    assert doctest.testmod(spread).failed == 0


def _details(**rates) -> dict:
    return {variant: {"images_per_s": rate, "peak_rss_mb": 100.0 + (rate or 0), "cpu_ms_per_image": {"total": rate},
                      "elapsed_s": 1.0} for variant, rate in rates.items()}


def test_an_entry_of_several_rounds_reports_medians_and_keeps_the_median_rounds_details():
    rounds = [_details(spark_cnn=300.0, predict_batch_udf=100.0, limit=330.0),
              _details(spark_cnn=270.0, predict_batch_udf=120.0, limit=320.0),
              _details(spark_cnn=330.0, predict_batch_udf=None, limit=340.0)]
    entry = suite._entry("2 CPU cores", "mobilenet_v3_small", 512, rounds)
    assert entry["results"] == {"predict_batch_udf": 100.0, "spark_cnn": 300.0, "limit": 330.0}
    assert entry["details"]["spark_cnn"] is rounds[0]["spark_cnn"]  # the median round's CPU and memory
    assert entry["cpu_ms_per_image"]["spark_cnn"] == {"total": 300.0}
    assert entry["rounds"][2] == {"predict_batch_udf": None, "spark_cnn": 330.0, "limit": 340.0}
    assert entry["spread"]["spark_cnn"] == {"median": 300.0, "min": 270.0, "max": 330.0, "spread": 0.2,
                                            "rounds": 3, "failed": 0}
    assert entry["spread"]["predict_batch_udf"]["failed"] == 1  # a failed round is counted, not hidden


def test_one_round_keeps_the_entry_as_it_was():
    entry = suite._entry("m", "resnet18", 256, _details(spark_cnn=40.0, limit=44.0))
    assert entry["results"] == {"spark_cnn": 40.0, "limit": 44.0}
    assert "rounds" not in entry and "spread" not in entry
    assert "min-max" not in report.table(entry)


def test_a_target_is_the_median_of_per_round_ratios_and_says_whether_every_round_met_it():
    rounds = [_details(spark_cnn=300.0, limit=330.0),   # 0.909
              _details(spark_cnn=270.0, limit=320.0),   # 0.844
              _details(spark_cnn=330.0, limit=340.0)]   # 0.971
    entry = suite._entry("2 CPU cores", "mobilenet_v3_small", 512, rounds)
    (line,) = [line for line in report.target_lines(entry) if "spark_cnn / limit" in line]
    assert "0.91" in line and "met, missed in 1 of 3 rounds (min 0.84)" in line
    # the ratio of the medians (300 / 330) would agree here; a host that slows between rounds is where they part
    rounds[1] = _details(spark_cnn=290.0, limit=300.0)
    (line,) = [line for line in report.target_lines(suite._entry("m", "mobilenet_v3_small", 512, rounds))
               if "spark_cnn / limit" in line]
    assert "met in every round (min 0.91)" in line
    table = report.table(entry)
    assert "median of 3 rounds" in table and "min-max images/s (spread)" in table
    assert "270.0-330.0 (20.0%)" in table


def test_rounds_run_every_variant_in_a_rotated_order_sized_once_from_the_first_limit(tmp_path, monkeypatch):
    ran: list[tuple[str, int]] = []

    def fake_run_variant(task, workdir):
        ran.append((task.variant, task.images))
        return {"images_per_s": 200.0 if task.variant == "limit" else 100.0 + len(ran), "wall_s": 1.0}

    monkeypatch.setattr(suite, "run_variant", fake_run_variant)
    monkeypatch.setattr(suite, "input_dir", lambda images, data_dir, *shapes: str(tmp_path / str(images)))
    monkeypatch.setattr(suite, "become_subreaper", lambda: False)  # pytest's process must not adopt orphans
    monkeypatch.setattr(dataset, "DATASET_IMAGES", 8)
    config = suite.BenchConfig(models=("mobilenet_v3_small",), images=64, quick=True, repeats=3,
                               variants=("spark_cnn", "predict_batch_udf", "limit"), data_dir=str(tmp_path))
    lines: list[str] = []
    (entry,) = suite.run_bench(config, log=lines.append)
    variants = [variant for variant, _ in ran]
    assert variants == ["limit", "predict_batch_udf", "spark_cnn",      # the first round measures the limit first
                        "spark_cnn", "limit", "predict_batch_udf",
                        "limit", "predict_batch_udf", "spark_cnn"]
    assert {images for variant, images in ran if variant != "limit"} == {64}
    assert len(entry["rounds"]) == 3 and set(entry["spread"]) == {"predict_batch_udf", "spark_cnn", "limit"}
    assert sum("round" in line for line in lines) == 3


def test_the_command_takes_repeats_and_refuses_less_than_one_round():
    from spark_cnn.cli import bench_compare

    args = build_parser().parse_args(["bench", "--repeats", "3"])
    assert args.repeats == 3 and build_parser().parse_args(["bench"]).repeats == 1
    with pytest.raises(ConfigError, match="--repeats 0: expected a positive number of rounds"):
        bench_compare.run(build_parser().parse_args(["bench", "--repeats", "0"]))


def test_the_table_splits_the_sidecars_cpu_into_its_forwards_and_its_serving():
    details = _details(spark_cnn=300.0, limit=330.0)
    details["spark_cnn"].update(images=1000, batch_size=32, mean_batch_size=[31.5], decode=["task"],
                                compute_cpu_s=3.4, cpu_ms_per_image={"sidecar": 3.6, "total": 7.0})
    (line,) = [line for line in report.table(suite._entry("m", "mobilenet_v3_small", 1000, details)).splitlines()
               if "spark_cnn: batch size" in line]
    assert line.endswith("; sidecar 3.60 ms an image: forward 3.40, serving 0.20"), line
    del details["spark_cnn"]["compute_cpu_s"]  # a run from before the sidecar counted its forwards: no split
    (line,) = [line for line in report.table(suite._entry("m", "mobilenet_v3_small", 1000, details)).splitlines()
               if "spark_cnn: batch size" in line]
    assert "forward" not in line


def test_the_useful_share_reads_each_rounds_rate_against_its_own_decoding_and_model_cpu():
    rounds = []
    for rate, decode_s, compute_s in ((300.0, 7.0, 12.0), (200.0, 9.0, 18.0), (330.0, 6.5, 11.5)):
        details = _details(spark_cnn=rate, limit=400.0)
        details["limit"]["cores"] = 2
        details["spark_cnn"].update(images=4096, task_decode_cpu_s=decode_s, decode_cpu_s=0.0,
                                    compute_cpu_s=compute_s, cpu_ms_per_image={"jvm": 0.5, "python_worker": 2.0,
                                                                               "sidecar": 3.2, "total": 5.7})
        rounds.append(details)
    entry = suite._entry("m", "mobilenet_v3_small", 4096, rounds)
    # 300 img/s * 19 s / 4096 images / 2 cores; the slow round slowed its work per image alike
    assert entry["useful_share"] == {"spark_cnn": [0.6958, 0.6592, 0.7251]}
    (line,) = [line for line in report.target_lines(entry) if "useful share" in line]
    assert "0.70 (rounds 0.66-0.73)" in line, line
    # where the median round's cores' time went: 2 cores / 300 img/s = 6.667 ms an image, 4.639 of it useful
    assert entry["cores_time_ms_per_image"]["spark_cnn"] == {"useful": 4.639, "jvm": 0.5, "python_worker": 0.291,
                                                              "sidecar": 0.27, "idle": 0.967}
    assert "the cores' time an image, median round: useful 4.64, jvm 0.50, python_worker 0.29, sidecar 0.27, " \
           "idle 0.97 ms" in line, line
    for details in rounds:  # a run whose tasks did not say what their decoding cost: no share, no line
        details["spark_cnn"]["task_decode_cpu_s"] = 0.0
    entry = suite._entry("m", "mobilenet_v3_small", 4096, rounds)
    assert "useful_share" not in entry and not [line for line in report.target_lines(entry) if "useful" in line]
