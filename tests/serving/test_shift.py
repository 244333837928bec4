"""±30% load and prompt-mix shifts (autospec.serving.shift): shifted workloads are what they claim, a longer
mix costs capacity on the simulator, the regret of a recommendation, and evaluate's summary["shift"]."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from autospec.evaluate import EvaluateSpec, open_sim_replay, run_evaluate
from autospec.serving.capacity import CapacitySpec, attainment, replay_capacity
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.shift import FACTORS, regret, shift_table, shifted_lengths
from autospec.strategy import load_preset
from autospec.workloads.spec import load_workload

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "reports" / "ci-profile"  # a real profile + fit of the bundled pair, committed
BURSTY = REPO / "workloads" / "bursty.toml"


@pytest.fixture(scope="module")
def replay():
    return open_sim_replay(PROFILE, load_workload(BURSTY).cap(120), k_max=8, max_batch=8)


@pytest.mark.parametrize("factor", [0.7, 1.3])
def test_a_prompt_mix_shift_scales_every_length_and_keeps_the_arrivals(replay, factor):
    shifted = shifted_lengths(replay.requests, factor)
    assert len(shifted) == len(replay.requests)
    for old, new in zip(replay.requests, shifted):
        assert (new.req_id, new.arrival_s, new.domain) == (old.req_id, old.arrival_s, old.domain)
        assert len(new.prompt) == max(1, round(len(old.prompt) * factor))
        assert new.max_tokens == max(1, round(old.max_tokens * factor))
        assert isinstance(new.prompt, SyntheticPrompt)
        assert (new.prompt.vocab, new.prompt.seed) == (old.prompt.vocab, old.prompt.seed)
    assert sum(len(r.prompt) for r in shifted) != sum(len(r.prompt) for r in replay.requests)


def test_lengths_stay_at_least_one_and_real_token_ids_are_refused(replay):
    tiny = ServeRequest(7, 0.5, SyntheticPrompt(1, 50, 7), 1, "chat", predicted_output_len=10.0)
    (short,) = shifted_lengths([tiny], 0.3)
    assert len(short.prompt) == 1 and short.max_tokens == 1 and short.predicted_output_len == pytest.approx(3.0)
    real = ServeRequest(0, 0.0, [5, 6, 7], 4)
    with pytest.raises(ValueError, match="real token ids"):
        shifted_lengths([real], 1.3)
    # the table refuses before replaying anything
    with pytest.raises(ValueError, match="real token ids"):
        shift_table(dataclasses.replace(replay, requests=[real]), [load_preset("no-sd")], 0)


@pytest.mark.parametrize("name", ["no-sd", "static-k2", "oracle"])
def test_a_longer_mix_does_not_raise_capacity_on_the_simulator(replay, name):
    """Measured first: on this profile capacity falls by ~30% at 1.3x the lengths for every preset tried
    (no-sd, static-k2/k4, adaspec, dspark, oracle; seeds 0-2) — far from the search's 2% tolerance."""
    strategy = load_preset(name)
    longer = dataclasses.replace(replay, requests=shifted_lengths(replay.requests, 1.3))
    assert replay_capacity(longer, strategy, 0).scale <= replay_capacity(replay, strategy, 0).scale


def test_the_table_measures_every_strategy_at_every_point_and_reuses_the_callers_runs(replay):
    strategies = [load_preset("no-sd"), load_preset("static-k2"), load_preset("oracle")]
    spec = CapacitySpec(rel_tol=0.05)
    own = {s.name: replay.run(s, 3) for s in strategies}
    caps = {s.name: replay_capacity(replay, s, 3, spec, at_own_load=own[s.name]) for s in strategies}
    table = shift_table(replay, strategies, 3, spec, oracles=["oracle"], at_own_load=own, own_capacity=caps)
    json.dumps(table)  # goes into summary.json as is
    assert table["factors"] == list(FACTORS) and table["seed"] == 3 and table["oracles"] == ["oracle"]
    for kind in ("load", "mix"):
        assert [p["factor"] for p in table[kind]] == list(FACTORS)
        for point in table[kind]:
            assert set(point["strategies"]) == {"no-sd", "static-k2", "oracle"}
            assert point["best"] != "oracle"  # a bound, not a choice
    at_one = {p["factor"]: p for p in table["load"]}[1.0]["strategies"]
    assert at_one["static-k2"]["slo_attainment"] == attainment(own["static-k2"], replay.slo)
    mix = {p["factor"]: p["strategies"] for p in table["mix"]}
    assert mix[1.0]["static-k2"]["capacity_rps"] == caps["static-k2"].rps
    assert mix[1.3]["no-sd"]["capacity_rps"] <= mix[1.0]["no-sd"]["capacity_rps"] <= mix[0.7]["no-sd"]["capacity_rps"]
    loads = {p["factor"]: p["strategies"] for p in table["load"]}
    assert loads[0.7]["no-sd"]["slo_attainment"] >= loads[1.3]["no-sd"]["slo_attainment"]
    assert all(v["tpot_mean"] > 0 and v["goodput"] > 0 for v in loads[1.0].values())


def crafted_table() -> dict:
    """b is best everywhere except the 1.3x load, where a and b tie; the oracle beats both."""
    load = [{"factor": f, "strategies": {"a": {"slo_attainment": att_a, "tpot_mean": 0.01, "goodput": 2.0},
                                         "b": {"slo_attainment": att_b, "tpot_mean": 0.02, "goodput": 3.0},
                                         "oracle": {"slo_attainment": 1.0, "tpot_mean": 0.005, "goodput": 4.0}}}
            for f, att_a, att_b in ((0.7, 0.9, 0.95), (1.0, 0.8, 0.9), (1.3, 0.5, 0.5))]
    mix = [{"factor": f, "strategies": {"a": {"capacity_rps": cap_a}, "b": {"capacity_rps": cap_b},
                                        "oracle": {"capacity_rps": 99.0}}}
           for f, cap_a, cap_b in ((0.7, 6.0, 8.0), (1.0, 4.0, 5.0), (1.3, 3.0, 4.0))]
    return {"factors": [0.7, 1.0, 1.3], "seed": 0, "target": 0.9, "oracles": ["oracle"], "load": load, "mix": mix}


def test_regret_is_zero_for_the_best_and_positive_for_another():
    table = crafted_table()
    best = regret(table, "b")
    assert len(best) == 6 and all(r["regret"] == 0 and r["best"] == "b" for r in best)
    other = {(r["shift"], r["factor"]): r for r in regret(table, "a")}
    assert other[("load", 1.0)]["regret"] == pytest.approx(10.0)  # 90% vs 80%: 10 points
    assert other[("load", 0.7)]["regret"] == pytest.approx(5.0) and other[("load", 0.7)]["best"] == "b"
    assert other[("load", 1.3)]["regret"] == 0 and other[("load", 1.3)]["best"] == "a"  # a tie: as good as any
    assert other[("mix", 1.3)]["regret"] == pytest.approx(0.25) and other[("mix", 1.3)]["best_value"] == 4.0
    assert other[("load", 1.0)]["value"] == 0.8 and other[("load", 1.0)]["goodput"] == 2.0
    # measured against the oracle, its own regret is 0 (nothing a user could pick keeps more)
    assert all(r["regret"] == 0 for r in regret(table, "oracle"))
    with pytest.raises(KeyError):
        regret(table, "missing")


def test_evaluate_reports_the_shift_table_on_the_simulator_and_why_not_otherwise():
    workload = REPO / "workloads" / "poisson.toml"
    common = dict(workload=workload, strategies=["static-k2"], engine="sim", profile=PROFILE)
    summary = run_evaluate(EvaluateSpec(**common), None).summary
    shift = summary["shift"]
    assert summary["shift_skipped"] is None and set(shift["load"][0]["strategies"]) == {"no-sd", "static-k2"}
    # the 1.0 points are the evaluation's own repeat-0 run and capacity
    mix_one = {p["factor"]: p for p in shift["mix"]}[1.0]["strategies"]
    own = summary["strategies"]["static-k2"]["capacity_rps"]["mean"]
    assert mix_one["static-k2"]["capacity_rps"] == pytest.approx(own)
    off = run_evaluate(EvaluateSpec(**common, shift=False), None).summary
    assert off["shift"] is None and "--no-shift" in off["shift_skipped"]
    assert off["strategies"]["static-k2"]["capacity_rps"]["mean"] is not None
    no_capacity = run_evaluate(EvaluateSpec(**common, capacity=None), None).summary
    assert no_capacity["shift"] is None and "--no-capacity" in no_capacity["shift_skipped"]
