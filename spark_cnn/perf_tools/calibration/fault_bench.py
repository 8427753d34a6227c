"""The cost of fresh memory pages: a first touch faults them in and a free returns them, which large batches
pay on every call in a process with glibc's malloc defaults (those map big tensors afresh each time)."""

from __future__ import annotations

import mmap
import resource

import torch

from spark_cnn.perf_tools.calibration.harness import Bench

__all__ = ["GLIBC_MMAP_THRESHOLD_MAX", "time_faults"]

FAULT_PROBE_BYTES = (48 << 20, 96 << 20)   # above glibc's largest mmap threshold (32 MiB): fresh pages every call
PAGE_BYTES = resource.getpagesize()
# glibc's DEFAULT_MMAP_THRESHOLD_MAX on 64-bit hosts: a freed mmapped chunk raises the threshold up to this,
# so in steady state smaller tensors come from the heap and larger ones are mapped (and faulted) every call.
GLIBC_MMAP_THRESHOLD_MAX = 32 << 20


def time_faults(bench: Bench) -> tuple[float, int]:
    """Microseconds per fresh page: a tensor on a new anonymous mapping filled and unmapped, minus the same fill
    of a kept tensor. The mapping is made here, not by malloc: under the sidecar's malloc settings (which
    calibration runs with) malloc never maps and never returns memory, so its tensors would not fault."""
    if bench.cuda:
        return 0.0, 0
    costs = []
    for nbytes in bench.points("faults", FAULT_PROBE_BYTES):
        numel = nbytes // 4
        kept = torch.empty(numel)
        reuse = bench.time(lambda kept=kept: kept.fill_(1.0))
        fresh = bench.time(lambda nbytes=nbytes: _fill_fresh_mapping(nbytes))
        for seconds, faults in zip(fresh.seconds, fresh.faults, strict=True):
            if faults >= 0.5 * numel * 4 / PAGE_BYTES:
                costs.append(max(seconds - reuse.best_s, 0.0) * 1e6 / faults)
        del kept
    costs.sort()
    return (costs[len(costs) // 2] if costs else 0.0), GLIBC_MMAP_THRESHOLD_MAX


def _fill_fresh_mapping(nbytes: int) -> None:
    pages = mmap.mmap(-1, nbytes)
    try:
        view = torch.frombuffer(pages, dtype=torch.float32)
        view.fill_(1.0)
        del view
    finally:
        pages.close()
