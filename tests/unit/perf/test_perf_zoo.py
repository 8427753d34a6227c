"""The zoo validation's pure parts: the choice by FLOP budget, the resumable store, the percentiles and targets,
and the attribution of the error to operator kinds (measurements here are stand-ins; the isolated runners are
exercised by tests/e2e/test_perf_commands.py)."""

from __future__ import annotations

import json

import pytest
from torch import nn

from spark_cnn.errors import ConfigError
from spark_cnn.perf.layers import LayerCost, analyse
from spark_cnn.perf.timemodel import layer_kind, predict_layers_ms
from spark_cnn.perf_tools import zoo
from tests.perf_doubles import synthetic_profile

SETTINGS = {"input_shape": [3, 224, 224], "clock": "cpu", "threads": 1, "repeats": 5, "warmup": 3,
            "point_budget_s": 4.0, "attribute_at": 8}


def test_select_keeps_the_budget_cheapest_first_and_says_why_not():
    chosen, excluded = zoo.select({"big": 12.0, "small": 0.1, "edge": 9.5, "mid": 3.0, "unknown": None}, 9.5)
    assert chosen == ["small", "mid", "edge"]
    assert excluded == {"big": "12.0 GFLOPs > 9.5", "unknown": "no FLOP count"}
    with pytest.raises(ConfigError, match="max_gflops"):
        zoo.select({"a": 1.0}, 0)


def test_catalogue_scales_torchvisions_counts_to_224_pixels():
    flops = zoo.catalogue()
    assert flops["resnet18"] == pytest.approx(2 * 1.814)  # torchvision's multiply-adds at its own 224 crop
    assert flops["efficientnet_b4"] == pytest.approx(2 * 4.394 * (224 / 380) ** 2)  # weights for 380 px
    chosen, _ = zoo.select(flops, zoo.DEFAULT_MAX_GFLOPS)
    assert len(chosen) >= 40 and chosen[0] == "shufflenet_v2_x0_5" and "resnet50" in chosen
    assert "vgg11" not in chosen and "vit_b_16" not in chosen


class Interrupt(BaseException):  # as KeyboardInterrupt: not a failure of the model
    pass


def _fake_measure(calls: list, stop_after: int | None = None, fail: str | None = None):
    def measure(model, shape, batch, threads, options):
        if stop_after is not None and len(calls) == stop_after:
            raise Interrupt  # a sweep killed midway
        calls.append((model, batch))
        if model == fail:
            raise RuntimeError("cannot run it")
        return 10.0 * batch + len(calls) * 0.01, 0.01, "retained"
    return measure


def _fake_layers(seen: list):
    def layers(model, shape, batch, threads, clock):
        seen.append((model, batch))
        return {"ms": {"0": 1.0}, "allocator": "retained"}
    return layers


def test_a_killed_sweep_resumes_where_it_stopped_and_new_sizes_add_only_their_points(tmp_path):
    path = str(tmp_path / "zoo.json")
    calls, layers = [], []
    options = dict(settings=SETTINGS, gflops={"a": 0.1, "b": 0.2}, log=lambda line: None)
    with pytest.raises(Interrupt):
        zoo.sweep(path, ["a", "b"], [1, 8], sweeps=2, measure=_fake_measure(calls, stop_after=5),
                  measure_layers=_fake_layers(layers), **options)
    assert calls == [("a", 1), ("a", 8), ("a", 1), ("a", 8), ("b", 1)] and layers == [("a", 8)]
    stored = json.loads(open(path).read())
    assert stored["models"]["a"]["runs"]["1"] == [10.01, 10.03] and stored["models"]["b"]["runs"] == {"1": [10.05]}
    assert not (tmp_path / "zoo.json.partial").exists()

    resumed = []
    state = zoo.sweep(path, ["a", "b"], [1, 8], sweeps=2, measure=_fake_measure(resumed),
                      measure_layers=_fake_layers(layers), **options)
    assert resumed == [("b", 8), ("b", 1), ("b", 8)] and layers == [("a", 8), ("b", 8)]
    assert {b: len(v) for b, v in state["models"]["b"]["runs"].items()} == {"1": 2, "8": 2}

    more = []
    zoo.sweep(path, ["a", "b"], [1, 8, 32], sweeps=1, measure=_fake_measure(more),
              measure_layers=_fake_layers(layers), **options)
    assert more == [("a", 32), ("b", 32)] and len(layers) == 2  # layers are not timed again


def test_a_failing_model_is_recorded_and_skipped_and_other_settings_are_refused(tmp_path):
    path = str(tmp_path / "zoo.json")
    calls = []
    state = zoo.sweep(path, ["bad", "good"], [1, 2], sweeps=1, settings=SETTINGS, gflops={}, log=lambda line: None,
                      measure=_fake_measure(calls, fail="bad"), measure_layers=_fake_layers([]))
    assert calls == [("bad", 1), ("good", 1), ("good", 2)]
    assert state["failed"] == {"bad": "batch 1: RuntimeError: cannot run it"}
    again = []
    zoo.sweep(path, ["bad", "good"], [1, 2], sweeps=1, settings=SETTINGS, gflops={}, log=lambda line: None,
              measure=_fake_measure(again), measure_layers=_fake_layers([]))
    assert again == []
    with pytest.raises(ConfigError, match="clock='cpu'"):
        zoo.load_state(path, {**SETTINGS, "clock": "wall"})
    (tmp_path / "other.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not a zoo sweep"):
        zoo.load_state(str(tmp_path / "other.json"), SETTINGS)


def test_percentiles_and_targets_by_hand():
    assert zoo.percentile([], 50) is None
    assert zoo.percentile([3, 1, 2], 50) == 2.0
    assert zoo.percentile(list(range(1, 11)), 90) == pytest.approx(9.1)  # 9 + 0.1 * (10 - 9)
    with pytest.raises(ValueError):
        zoo.percentile([1], 101)

    def result(ge8, every, pick):
        return {"mape_ge8": ge8, "mape": every, "pick": {"fraction_of_best": pick, "meets": pick >= 0.95}}
    results = [result(1.0 + i, 2.0 + i, 1.0) for i in range(9)] + [result(30.0, 40.0, 0.80)]
    s = zoo.summarise(results)
    assert s["mape_ge8"] == {"median": 5.5, "p90": pytest.approx(11.1)}  # 9 + 0.1 * (30 - 9)... of 1..9, 30
    assert s["mape"]["p90"] == pytest.approx(10.0 + 0.1 * (40.0 - 10.0))
    assert s["pick"]["share_meeting"] == 0.9 and s["pick"]["p10"] == pytest.approx(0.98)
    met = list(s["targets"].values())
    assert met == [False, False, False, True]  # median 5.5 > 5; p90 11.1 > 10; p90 13 > 12; 9 of 10 picks


class Block(nn.Module):
    """A squeeze-excitation block after a depthwise and a pointwise convolution."""

    def __init__(self):
        super().__init__()
        self.dw = nn.Conv2d(32, 32, 3, padding=1, groups=32)
        self.pw = nn.Conv2d(32, 64, 1)
        self.act = nn.Hardswish()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Conv2d(64, 64, 1)
        self.gate = nn.Hardsigmoid()

    def forward(self, x):
        x = self.act(self.pw(self.dw(x)))
        return x * self.gate(self.fc(self.pool(x)))


def test_layer_kinds_name_the_priced_classes():
    profile = synthetic_profile()
    cost = analyse(Block(), (32, 28, 28))
    kinds = {layer.name: layer_kind(layer, 8, profile) for layer in cost.layers}
    assert kinds == {"dw": "conv:depthwise", "pw": "conv:pointwise_gemm", "act": "hardswish",
                     "pool": "adaptive_avg_pool2d", "fc": "conv:squeeze", "gate": "hardsigmoid", "mul": "mul"}
    assert layer_kind(next(layer for layer in cost.layers if layer.name == "pw"), 16, profile) == "conv:pointwise"


def test_attribution_sums_kinds_and_names_the_cause():
    layers = [LayerCost(name, op, 0, 0, 0, 0) for name, op in
              [("c1", "conv"), ("c2", "conv"), ("r", "relu"), ("<modules>", "modules")]]
    predicted = list(zip(layers, [4.0, 4.0, 3.0, 0.5], strict=True))
    rows = zoo.attribute(predicted, {"c1": 5.0, "c2": 5.0, "r": 1.0}, lambda layer: layer.op)
    assert rows["kinds"] == [
        {"kind": "conv", "layers": 2, "predicted_ms": 8.0, "measured_ms": 10.0, "error": -0.2, "share": 0.9091},
        {"kind": "relu", "layers": 1, "predicted_ms": 3.0, "measured_ms": 1.0, "error": 2.0, "share": 0.0909}]
    assert rows["measured_ms"] == 11.0 and rows["unmatched_ms"] == 0.5
    assert zoo.cause(rows["kinds"]) == "conv -20% (91% of the time); relu +200% (9% of the time)"
    assert zoo.cause([]) == "no kind stands out"


def test_judge_predicts_stored_measurements_and_writes_the_tables():
    profile = synthetic_profile()
    cost = analyse(Block(), (32, 28, 28))
    batch = 8
    predicted = {layer.name: ms for layer, ms, _ in predict_layers_ms(cost, profile, batch)}
    measured = {name: ms * (2.0 if name == "dw" else 1.0) for name, ms in predicted.items()}  # depthwise at half
    state = {"settings": {**SETTINGS, "attribute_at": batch}, "failed": {"huge": "batch 1: MemoryError: x"},
             "models": {"block": {"gflops": 0.01, "runs": {"8": [1.0, 1.1], "1": [0.2]}, "spreads": {"8": [0, 0],
                                                                                                   "1": [0]},
                                  "load": [[1, 1.0, 2.0], [8, 3.0, 2.5]], "allocator": "retained",
                                  "layers": {"ms": measured, "allocator": "retained"}}}}
    judged = zoo.judge(state, profile, cost_of=lambda name: cost)
    (r,) = judged["results"]
    assert [p["batch_size"] for p in r["points"]] == [1, 8] and r["load"] == [1.0, 3.0]
    assert r["attribution"]["kinds"][0]["kind"] == "conv:depthwise"
    assert r["attribution"]["kinds"][0]["error"] == pytest.approx(-0.5, abs=1e-3)
    assert judged["kinds"][0]["kind"] == "conv:depthwise" and judged["summary"]["networks"] == 1
    table = zoo.markdown(judged, max_gflops=9.5, batch_sizes=[1, 8], clock="cpu")
    assert "| block | 0.01 |" in table and "conv:depthwise -50%" in table
    assert "Not measured: huge (batch 1: MemoryError: x)" in table
    assert "median MAPE at batch >= 8 <= 5%" in table
    assert table.startswith("1 networks under 9.5 GFLOPs per 224 px image, batch sizes 1,8, cpu clock")
    named = zoo.markdown(judged, max_gflops=9.5, batch_sizes=[1, 8], clock="cpu", networks="1 held-out network")
    assert named.startswith("1 held-out network, batch sizes 1,8, cpu clock")


def test_attention_is_priced_by_its_multiply_adds_at_the_gemm_rate():
    from spark_cnn.perf.timemodel import _Model
    from tests.perf_doubles import CALL_US, GFLOPS, US_PER_BYTE

    length, embed, batch = 64, 256, 8
    macs = 4 * length * embed * embed + 2 * length * length * embed  # q, k, v, out projections; scores, values
    out_bytes = length * embed * 4
    layer = LayerCost("attn", "multihead_attention", flops=2 * macs, input_bytes=out_bytes, output_bytes=out_bytes,
                      weight_bytes=4 * embed * embed * 4,
                      shape={"embed_dim": embed, "length": length, "heads": 4, "macs": macs})
    us, bound = _Model.of(synthetic_profile()).layer_us(layer, batch, 1.0, 0.0)
    by_hand = 2 * macs * batch / (GFLOPS * 1e3) + CALL_US + out_bytes * batch * US_PER_BYTE  # + what it writes
    # the GEMM table's neighbours differ a bit (its 512 rows are read at its largest, 64)
    assert bound == "compute" and us == pytest.approx(by_hand, rel=0.07)


def test_a_fused_scaled_dot_product_attention_is_priced_by_its_multiply_adds_too():
    # timm's transformers call F.scaled_dot_product_attention, whose layer names only heads, lengths and the
    # head width: read from the output curve, deit_tiny's came out at 4% of its measured time
    import torch.nn.functional as F  # noqa: N812

    from spark_cnn.perf.layers import analyse
    from spark_cnn.perf.timemodel import _Model
    from tests.perf_doubles import CALL_US, GFLOPS, US_PER_BYTE

    class Attend(nn.Module):
        def forward(self, x):
            q = x.view(1, 256, 4, 256).transpose(1, 2)  # 4 heads of 256 over 256 tokens
            return F.scaled_dot_product_attention(q, q, q)

    (layer,) = [layer for layer in analyse(Attend(), (256, 1024)).layers if "scaled_dot_product" in layer.op]
    heads, length, width, batch = 4, 256, 256, 8
    assert layer.macs == 2 * heads * length * length * width  # scores, then values
    us, bound = _Model.of(synthetic_profile()).layer_us(layer, batch, 1.0, 0.0)
    by_hand = 2 * layer.macs * batch / (GFLOPS * 1e3) + CALL_US + layer.output_bytes * batch * US_PER_BYTE
    assert bound == "compute" and us == pytest.approx(by_hand, rel=0.07)


def _make_recipe(target: str) -> tuple[list[str], dict[str, str]]:
    """The command lines of a Makefile target, and the Makefile's `?=` defaults."""
    lines = open("Makefile").read().splitlines()
    defaults = dict(line.split(" ?= ", 1) for line in lines if " ?= " in line)
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{target}:"))
    recipe = []
    for line in lines[start + 1:]:
        if not line.startswith("\t"):
            break
        recipe.append(line.strip())
    return recipe, {k.strip(): v.strip() for k, v in defaults.items()}


def test_the_benchmark_suite_runs_the_zoo_validation_and_make_test_does_not():
    import argparse
    import shlex

    from spark_cnn.perf_tools.validate_command import add_arguments

    recipe, defaults = _make_recipe("bench-zoo")
    assert len(recipe) == 1, recipe
    words = shlex.split(recipe[0].replace("$(ZOO_ARGS)", defaults["ZOO_ARGS"]))
    assert words[:2] == ["$(BIN)/spark-cnn", "validate"], words
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(words[2:])  # the options the CLI takes today
    assert args.zoo and args.json == "docs/zoo.json" and args.markdown == "docs/zoo.md"
    assert args.max_gflops == zoo.DEFAULT_MAX_GFLOPS and 8 in map(int, args.batch_sizes.split(","))
    test_recipe, _ = _make_recipe("test")
    assert not any("zoo" in line or "bench" in line for line in test_recipe), test_recipe


def test_the_held_out_set_has_its_own_benchmark_and_shares_nothing_with_the_zoo():
    import argparse
    import shlex

    from spark_cnn.perf_tools.validate_command import add_arguments

    recipe, _ = _make_recipe("bench-heldout")
    words = shlex.split(" ".join(line.rstrip("\\") for line in recipe))
    assert words[:2] == ["$(BIN)/spark-cnn", "validate"], words
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(words[2:])
    assert args.heldout and not args.zoo and args.calibrate_each
    assert args.json == "docs/zoo-heldout.json" and args.markdown == "docs/zoo-heldout.md"
    assert args.sweeps >= 3  # one sweep's judgement is the host's noise (docs/benchmarks.md, "Three sweeps")
    # held out means never developed on: no network of the torchvision catalogue the zoo judges
    assert len(zoo.HELDOUT) == 12 and all(name.startswith("timm:") for name in zoo.HELDOUT)
    assert not {name.split(":", 1)[1] for name in zoo.HELDOUT} & set(zoo.catalogue())
    with pytest.raises(SystemExit):
        parser.parse_args(["--zoo", "--heldout"])


def test_a_networks_own_profile_is_a_file_name_every_system_takes(tmp_path):
    path = str(tmp_path / "heldout.json")
    state = zoo.sweep(path, ["timm:a/b"], [1], sweeps=1, settings={**SETTINGS, "attribute_at": 0}, gflops={},
                      log=lambda line: None, measure=lambda *args: (1.0, 0.01, "retained"),
                      calibrate=lambda: synthetic_profile(key="own"))
    assert [p.name for p in (tmp_path / "heldout-profiles").iterdir()] == ["timm_a_b.json"]
    assert zoo.own_profiles(path, state)("timm:a/b").key == "own"


def test_calibrating_before_each_network_judges_each_against_its_own_profile(tmp_path):
    path = str(tmp_path / "zoo.json")
    fast = synthetic_profile(key="fast", conv_call_us=20.0)
    slow = synthetic_profile(key="slow", conv_call_us=2000.0,
                             notes=("pooled: each point the median over 3 calibrations of slow",))
    made = iter([fast, slow, synthetic_profile(key="third")])
    calls, log = [], []

    def calibrate():
        calls.append(("calibrate",))
        return next(made)

    def measure(model, shape, batch, threads, options):
        calls.append((model, batch))
        return 1.0, 0.01, "retained"
    settings = {**SETTINGS, "attribute_at": 0}
    state = zoo.sweep(path, ["a", "b"], [1, 8], sweeps=1, settings=settings, gflops={"a": 0.1, "b": 0.2},
                      log=log.append, measure=measure, calibrate=calibrate)
    assert calls == [("calibrate",), ("a", 1), ("a", 8), ("calibrate",), ("b", 1), ("b", 8)]
    assert state["models"]["a"]["profile"]["key"] == "fast" and state["models"]["b"]["profile"]["key"] == "slow"
    assert sorted(p.name for p in (tmp_path / "zoo-profiles").iterdir()) == ["a.json", "b.json"]
    assert log[1].startswith("a: calibrated in 0.0 s")
    # a resumed sweep calibrates only for networks with points left to measure
    zoo.sweep(path, ["a", "b"], [1, 8], sweeps=1, settings=settings, gflops={}, log=log.append, measure=measure,
              calibrate=calibrate)
    assert len(calls) == 6

    cost = analyse(Block(), (32, 28, 28))
    stored = json.loads(open(path).read())
    judged = zoo.judge(stored, synthetic_profile(key="common"), cost_of=lambda name: cost,
                       own_profile=zoo.own_profiles(path, stored))
    by_model = {r["model"]: r for r in judged["results"]}
    predicted = {m: {p["batch_size"]: p["predicted_ms"] for p in r["points"]} for m, r in by_model.items()}
    assert predicted["b"][1] > predicted["a"][1] + 1.9  # the slow profile's oneDNN convolution at 2 ms a call
    assert judged["own_profiles"] == 2 and judged["profile"] == "common"
    assert judged["pooled_runs"] == [1, 3]
    assert ("each network against the calibration made just before it, as the device's cached profile pooled it "
            "(each point the median of its latest 1-3 runs).") in zoo.markdown(
        judged, max_gflops=9.5, batch_sizes=[1, 8], clock="cpu")
    # a profile of another version, or none: the judgement says which network and what to do
    (tmp_path / "zoo-profiles" / "b.json").write_text('{"key": "old", "version": 0}')
    with pytest.raises(ConfigError, match="b's calibration .* version 0; measure b again"):
        zoo.judge(stored, synthetic_profile(key="common"), cost_of=lambda name: cost,
                  own_profile=zoo.own_profiles(path, stored))
    (tmp_path / "zoo-profiles" / "b.json").unlink()
    with pytest.raises(ConfigError, match="b's calibration .*measure b again"):
        zoo.judge(stored, synthetic_profile(key="common"), cost_of=lambda name: cost,
                  own_profile=zoo.own_profiles(path, stored))
