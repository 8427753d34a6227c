"""`validate --generated`: the zoo's sweep and judgement (spark_cnn.perf_tools.zoo) over the hand-written networks of
spark_cnn.perf_tools.generated_nets, each at its own image size, judged against the targets for networks from no zoo.

No seed is taken here or on the command line: the set is `generated_nets.frozen_set()`, drawn from the committed
SEED.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["TARGET_MAPE", "TARGET_MAPE_GE8", "TARGET_PICK_SHARE", "generated_catalogue", "no_zoo_targets",
           "settings_shape"]

# The targets on networks from no zoo: MAPE at batch >= 8 and over 1-64 (the set's median, the
# 90th percentile shown beside it), and the share of networks whose tuner pick reaches 95% of the best measured.
TARGET_MAPE_GE8 = 7.0
TARGET_MAPE = 12.0
TARGET_PICK_SHARE = 0.90


def settings_shape() -> str:
    """What the sweep stores as its input shape: each network has its own, and the set is named by its seed (a
    sweep file of another seed refuses to resume)."""
    from spark_cnn.perf_tools.generated_nets import SEED

    return f"per network, generated_nets seed {SEED}"


def generated_catalogue() -> tuple[dict[str, float], dict[str, str], str, Callable[[str], tuple[int, ...]],
                                   Callable[[str], Any]]:
    """(model source -> GFLOPs per image at its own size as the time model counts them, excluded (none), the
    sentence naming the set, source -> image shape, source -> the model's cost)."""
    from spark_cnn.models.loader import build_module
    from spark_cnn.perf.layers import analyse
    from spark_cnn.perf_tools.generated_nets import SEED, frozen_set, input_shape_of, source_of

    def cost_of(source: str) -> Any:
        return analyse(build_module(source), input_shape_of(source))

    nets = frozen_set()
    flops = {source_of(net): analyse(net.build(), net.input_shape).flops() / 1e9 for net in nets}
    sizes = sorted(net.input_shape[1] for net in nets)
    gflops = sorted(flops.values())
    families = sorted({net.family for net in nets})
    networks = (f"{len(nets)} hand-written networks from no zoo, drawn from the committed seed {SEED} "
                f"(spark_cnn.perf_tools.generated_nets; families {', '.join(families)}; {sizes[0]}-{sizes[-1]} px "
                f"images; {gflops[0]:.2f}-{gflops[-1]:.2f} GFLOPs per image)")
    return flops, {}, networks, input_shape_of, cost_of


def no_zoo_targets(judged: dict[str, Any]) -> str:
    """Markdown lines judging `judged` (zoo.judge) against the targets for networks from no zoo.

    >>> r = [{"mape_ge8": 5.0, "mape": 8.0, "pick": {"meets": True}}, {"mape_ge8": 9.0, "mape": 13.0,
    ...      "pick": {"meets": False}}]
    >>> print(no_zoo_targets({"results": r}).strip().splitlines()[-1])
    - tuner pick >= 95% of the best for >= 90% of networks: **not met** (50%)
    """
    from spark_cnn.perf_tools.zoo import percentile

    results: Sequence[dict[str, Any]] = judged["results"]
    ge8 = [r["mape_ge8"] for r in results if r["mape_ge8"] is not None]
    every = [r["mape"] for r in results if r["mape"] is not None]
    share = sum(1 for r in results if r["pick"]["meets"]) / len(results) if results else 0.0

    def line(name: str, values: list[float], target: float) -> str:
        median, p90 = percentile(values, 50), percentile(values, 90)
        within = sum(1 for v in values if v <= target)
        met = median is not None and median <= target
        return (f"- {name} <= {target:g}% (median): {'met' if met else '**not met**'} (median {_pct(median)}, "
                f"90th percentile {_pct(p90)}; {within} of {len(values)} networks within)")
    return "\n".join(["", "The targets on networks from no zoo:", "",
                      line("MAPE at batch >= 8", ge8, TARGET_MAPE_GE8),
                      line("MAPE over every size", every, TARGET_MAPE),
                      f"- tuner pick >= 95% of the best for >= {100 * TARGET_PICK_SHARE:.0f}% of networks: "
                      f"{'met' if share >= TARGET_PICK_SHARE else '**not met**'} ({100 * share:.0f}%)", ""])


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"
