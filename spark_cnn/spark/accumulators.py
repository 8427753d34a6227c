"""Collect each sidecar's counters from the tasks that used it, through a Spark accumulator."""

from __future__ import annotations

from pyspark.accumulators import AccumulatorParam


def merge_snapshots(merged: dict, snapshots: dict) -> dict:
    """Fold {sidecar key: counters} into `merged`. Counters are cumulative snapshots for one job, so merging
    keeps the latest (most requests) per sidecar; a retried task adding a snapshot twice changes nothing."""
    for key, snapshot in snapshots.items():
        if key not in merged or snapshot["requests"] >= merged[key]["requests"]:
            merged[key] = snapshot
    return merged


class SidecarStatsParam(AccumulatorParam):
    """Accumulates {sidecar key: counters} with `merge_snapshots`."""

    def zero(self, value: dict) -> dict:
        return {}

    def addInPlace(self, value1: dict, value2: dict) -> dict:
        return merge_snapshots(value1, value2)
