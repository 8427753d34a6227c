"""Does the sidecar's vector-math guard keep silu & co. fast in a network on this CPU? (docs/perf-model-journal.md,
"The vector-exp guard")

One process with the sidecar's environment, on --threads threads: rounds of forwards of a torchvision model with
random weights, on random images normalised as the sidecar does, alternating a plain copy and a guarded copy
(spark_cnn.models.vector_math_guard) of the same module. Per round: the isolated probe (sigmoid on 32K floats,
best of 30: ~11 us on the project's Xeon guest when fast, ~40 when its vector exp is in the slow state), each
copy's forward time, then each copy's large guarded-kind calls (silu, sigmoid, gelu, elu on >= 100K elements per
image) under the torch profiler, in ns per element. A call counts as slow above SLOW_FACTOR times the median of
the guarded copy's calls. At the end, per copy: slow calls of all, median forward.

    .venv/bin/python scripts/vector-math-guard.py --model efficientnet_b0 --batch 32 --rounds 8
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time

_CHILD = "SPARK_CNN_VECTOR_MATH_GUARD_CHILD"
_KERNELS = ("aten::silu_", "aten::silu", "aten::sigmoid", "aten::sigmoid_", "aten::gelu", "aten::elu", "aten::elu_")
SLOW_FACTOR = 1.6  # the slow state runs these kernels 2.2x slower; the fast calls spread by about +-25%


def _calls_ns_per_element(events, batch: int) -> list[float]:
    out = []
    for event in events:
        if event.name in _KERNELS and event.input_shapes and event.input_shapes[0]:
            elements = 1
            for dim in event.input_shapes[0]:
                elements *= dim
            if elements >= batch * 100_000:
                out.append(event.cpu_time_total * 1e3 / elements)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="efficientnet_b0", help="a torchvision classifier (default efficientnet_b0)")
    parser.add_argument("--batch", type=int, default=32, help="images per forward (default 32)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds of forwards (default 8)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    args = parser.parse_args()
    if not os.environ.get(_CHILD):  # glibc reads the sidecar's malloc settings only when a process starts
        from spark_cnn.perf_tools.child_env import sidecar_child_env
        os.execve(sys.executable, [sys.executable, *sys.argv], sidecar_child_env(**{_CHILD: "1"}))

    import numpy as np
    import torch
    from torch.profiler import ProfilerActivity, profile

    from spark_cnn.models.loader import build_module
    from spark_cnn.models.tensors import flush_denormals, normalise
    from spark_cnn.models.timing import preprocessing_for
    from spark_cnn.models.vector_math_guard import guard_vector_math

    torch.set_num_threads(args.threads)
    flush_denormals()
    plain = build_module(args.model).eval()
    guarded = copy.deepcopy(plain)
    print(f"{args.model}: {guard_vector_math(guarded)} modules guarded, batch {args.batch}, "
          f"{args.threads} thread(s)", flush=True)
    pixels = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (args.batch, 224, 224, 3), dtype=np.uint8))
    images = normalise(pixels, preprocessing_for((3, 224, 224)))
    probe, probe_out = torch.rand(32768) - 0.5, torch.empty(32768)
    copies = {"plain": plain, "guarded": guarded}
    walls: dict[str, list[float]] = {name: [] for name in copies}
    calls: dict[str, list[float]] = {name: [] for name in copies}
    with torch.inference_mode():
        for module in copies.values():
            module(images)
        for _ in range(args.rounds):
            best = float("inf")
            for _ in range(30):
                start = time.perf_counter()
                torch.sigmoid(probe, out=probe_out)
                best = min(best, time.perf_counter() - start)
            row = [f"{time.strftime('%H:%M:%S')} probe {best * 1e6:5.1f} us"]
            for name, module in copies.items():
                start = time.perf_counter()
                module(images)
                walls[name].append(time.perf_counter() - start)
            for name, module in copies.items():
                with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
                    module(images)
                ns = _calls_ns_per_element(prof.events(), args.batch)
                calls[name].extend(ns)
                row.append(f"{name} {walls[name][-1] * 1e3:6.0f} ms, calls {min(ns, default=0):.2f}-"
                           f"{max(ns, default=0):.2f} ns/el")
            print(" | ".join(row), flush=True)
    fast = statistics.median(calls["guarded"]) if calls["guarded"] else 0.0
    for name in copies:
        slow = sum(ns > SLOW_FACTOR * fast for ns in calls[name])
        print(f"{name}: {slow} of {len(calls[name])} large calls slow (> {SLOW_FACTOR} x {fast:.2f} ns/el), "
              f"forward median {statistics.median(walls[name]) * 1e3:.0f} ms "
              f"({min(walls[name]) * 1e3:.0f}-{max(walls[name]) * 1e3:.0f})", flush=True)


if __name__ == "__main__":
    main()
