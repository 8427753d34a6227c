"""`spark-cnn bench-decode` runs end to end (a smoke run: few images, short windows, no speed thresholds)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e


def test_bench_decode_reports_every_case_with_its_pixel_differences(spark_cnn, tmp_path):
    out = tmp_path / "decode.json"
    result = spark_cnn("bench-decode", "--images", "2", "--seconds", "0.2", "--rounds", "1", "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert set(data["sets"]) == {"bench_320", "large"}
    small, large = data["sets"]["bench_320"], data["sets"]["large"]
    assert small["image_sizes"] == ["320x320"] and large["image_sizes"] == ["2400x1601"]
    assert {"full", "reduced", "reduced_headroom1"} <= set(large["cases"])
    for case in large["cases"].values():
        assert case["images_per_cpu_s"] > 0 and case["images_per_wall_s"] > 0
    assert large["cases"]["full"]["max_diff"] == 0 and large["cases"]["full"]["dct_scales"] == [1]
    assert large["cases"]["reduced"]["dct_scales"] == [2] and large["cases"]["reduced_headroom1"]["dct_scales"] == [4]
    assert 0 < large["cases"]["reduced"]["mean_diff"] <= 1.0
    assert small["cases"]["reduced"]["dct_scales"] == [1] and small["cases"]["reduced"]["max_diff"] == 0
    assert "large" in result.stdout and "reduced" in result.stdout
    for data in (small, large):  # resizing only the crop gave the bytes that resizing everything gives
        assert data["cases"]["reduced_resize_whole"]["max_diff_vs_reduced"] == 0


def test_bench_decode_rejects_unknown_sets(spark_cnn):
    result = spark_cnn("bench-decode", "--sets", "huge")
    assert result.returncode == 2
    assert "spark-cnn bench-decode: error: --sets huge: expected some of bench_320, large" in result.stderr
