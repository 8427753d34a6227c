"""A bench figure with its spread: the same variants measured in several rounds, so that a change is judged
against the run-to-run noise of the host rather than against one draw of it.

Each round runs every variant once, in an order rotated from the last round's, so that a host that speeds up or
slows down during the run does not always favour the same variant. A ratio between two variants (a target) is
taken within each round, where both saw the same state of the host, and its median over the rounds is reported
with whether every round met it.
"""

from __future__ import annotations

import statistics


def rotated(variants: list[str], round_index: int) -> list[str]:
    """The variants in the order round `round_index` runs them.

    >>> rotated(["a", "b", "c"], 0), rotated(["a", "b", "c"], 1), rotated(["a", "b", "c"], 4)
    (['a', 'b', 'c'], ['b', 'c', 'a'], ['b', 'c', 'a'])
    >>> rotated([], 3)
    []
    """
    if not variants:
        return []
    shift = round_index % len(variants)
    return variants[shift:] + variants[:shift]


def spread_of(values: list[float | None]) -> dict | None:
    """Median, min, max and the relative spread (max - min) / median of one variant's rates over the rounds;
    None when no round measured it. A failed round (None) is counted, not hidden. The median is the lower middle
    one of an even count: the median round's own rate (median_round), which the table reports.

    >>> spread_of([100.0, 110.0, 90.0])
    {'median': 100.0, 'min': 90.0, 'max': 110.0, 'spread': 0.2, 'rounds': 3, 'failed': 0}
    >>> spread_of([None, 50.0])
    {'median': 50.0, 'min': 50.0, 'max': 50.0, 'spread': 0.0, 'rounds': 2, 'failed': 1}
    >>> spread_of([100.0, 120.0])["median"]
    100.0
    >>> spread_of([None]) is None
    True
    """
    measured = [v for v in values if v is not None]
    if not measured:
        return None
    median = statistics.median_low(measured)
    low, high = min(measured), max(measured)
    return {"median": round(median, 2), "min": round(low, 2), "max": round(high, 2),
            "spread": round((high - low) / median, 4) if median else 0.0,
            "rounds": len(values), "failed": len(values) - len(measured)}


def paired_ratios(rounds: list[dict], top: str, bottom: str) -> list[float | None]:
    """top / bottom within each round (None where either failed or was not run).

    >>> paired_ratios([{"a": 90.0, "b": 100.0}, {"a": 99.0, "b": 110.0}, {"a": None, "b": 1.0}], "a", "b")
    [0.9, 0.9, None]
    """
    return [round(r[top] / r[bottom], 4) if r.get(top) and r.get(bottom) else None for r in rounds]


def median_round(rates: list[float | None]) -> int | None:
    """The index of the round whose rate is the median (the lower middle one of an even count): the round whose
    details (CPU per image, batch sizes) stand for the variant; None when every round failed.

    >>> median_round([120.0, 100.0, 110.0]), median_round([None, 5.0, 7.0, 6.0]), median_round([None])
    (2, 3, None)
    """
    measured = sorted((rate, index) for index, rate in enumerate(rates) if rate is not None)
    if not measured:
        return None
    return measured[(len(measured) - 1) // 2][1]
