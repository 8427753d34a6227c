"""The peer variants of `spark-cnn bench` (Ray Data, Daft) are wired like the others: selectable, run in the
variant process, in the table, the targets and the plot; without their package they are skipped with one line."""

from __future__ import annotations

import pytest

from spark_cnn.bench import dataset, peers, report, suite
from spark_cnn.bench.variants import PEER_VARIANTS, VARIANTS
from spark_cnn.cli import build_parser


def test_the_peers_are_variants_the_command_accepts_each_with_a_runner():
    assert PEER_VARIANTS == ("ray_data", "daft") and set(PEER_VARIANTS) < set(VARIANTS)
    assert VARIANTS[-1] == "limit"  # measured first, listed last
    assert set(peers.RUNNERS) == set(peers.PEER_PACKAGES) == set(PEER_VARIANTS)
    args = build_parser().parse_args(["bench", "--variants", "ray_data", "daft", "spark_cnn"])
    assert args.variants == ["ray_data", "daft", "spark_cnn"]


def test_a_peer_whose_package_is_missing_is_skipped_with_one_line(tmp_path, monkeypatch):
    monkeypatch.setitem(peers.PEER_PACKAGES, "daft", "no_such_package_for_the_bench")
    assert peers.missing_peer("daft") == ("daft: skipped, no_such_package_for_the_bench is not installed "
                                          "(pip install 'spark_cnn[peers]')")
    assert peers.missing_peer("spark_cnn") is None
    # The suite skips it before starting any process: nothing else runs with only that variant asked for.
    monkeypatch.setattr(dataset, "DATASET_IMAGES", 8)
    monkeypatch.setattr(suite, "become_subreaper", lambda: False)  # pytest's process must not adopt orphans
    lines: list[str] = []
    entries = suite.run_bench(suite.BenchConfig(models=("identity",), quick=True, variants=("daft",),
                                                data_dir=str(tmp_path)), log=lines.append)
    assert [line for line in lines if "daft" in line] == [
        "identity: daft: skipped, no_such_package_for_the_bench is not installed (pip install 'spark_cnn[peers]')"]
    assert entries[0]["results"] == {} and "daft" not in entries[0]["details"]


def _entry(model: str, **results) -> dict:
    return {"machine": "2 CPU cores", "model": model, "images": 192, "results": results,
            "memory_mb": {name: 1000.0 for name in results if name != "limit"}, "details": {}}


@pytest.mark.parametrize("model", ["identity", "mobilenet_v3_small"])
def test_the_table_and_targets_show_the_peers_for_every_model(model, tmp_path):
    entry = _entry(model, spark_cnn=300.0, ray_data=100.0, daft=250.0, limit=600.0)
    text = report.table(entry)
    rows = {line.split()[0]: line.split()[1:3] for line in text.splitlines()[2:] if line.startswith("  ")}
    assert rows["ray_data"] == ["100.0", "0.33"] and rows["daft"] == ["250.0", "0.83"]  # images/s, x spark_cnn
    verdicts = {line.split()[2]: line.rsplit(": ", 1)[1] for line in report.target_lines(entry)
                if line.split()[2] in PEER_VARIANTS}
    assert verdicts == {"ray_data": "met)", "daft": "MISSED)"}  # spark_cnn >= 1.5x each
    report.plot(str(tmp_path / "bench.png"), [entry])


def test_targets_of_variants_not_run_are_left_out():
    lines = report.target_lines(_entry("identity", spark_cnn=300.0, limit=600.0))
    assert not any(peer in line for line in lines for peer in PEER_VARIANTS)
    failed = report.target_lines(_entry("identity", spark_cnn=300.0, daft=None))
    assert any("spark_cnn / daft" in line and "n/a" in line for line in failed)  # run, but failed: said so
