"""The real-engine confirmation (autospec.confirm, `tune --confirm-top`): which candidates it confirms,
its tie rule, and an end-to-end run on the torch engine that puts its recommendation in deploy/."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from autospec.config import PairSpec
from autospec.confirm import Candidate, ConfirmSettings, confirm, pick_candidates, recommend, simplicity
from autospec.evaluate import open_sim_replay
from autospec.fit import fit_profile, write_fit
from autospec.strategy import apply_overrides, load_preset
from autospec.tune import TuneSpec, run_tune
from autospec.workloads.spec import load_workload

from stage_helpers import SlowedOnce, synthetic_workload, write_synthetic_run

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "reports" / "ci-profile"


def test_simplicity_orders_no_sd_static_schedule_then_policies():
    names = ["adaspec", "k-schedule", "static-k4", "no-sd", "gp-lcb"]
    assert sorted(names, key=lambda n: simplicity(load_preset(n))) == ["no-sd", "static-k4", "k-schedule", "adaspec",
                                                                       "gp-lcb"]


def _trials(specs: list) -> list:
    """Real Optuna trials (best first) carrying the strategy specs, as tune's ranked trials do."""
    dist = {"strategy": optuna.distributions.CategoricalDistribution([s.name for s in specs])}
    return [optuna.trial.create_trial(params={"strategy": s.name}, distributions=dist, value=10.0 - i,
                                      user_attrs={"spec": s.model_dump(mode="json")}) for i, s in enumerate(specs)]


def test_candidates_are_the_top_deployable_configurations_and_the_best_static_k():
    k3, k5 = apply_overrides(load_preset("static-k4"), {"length.k": 3}), load_preset("static-k4")
    ranked = _trials([load_preset("lp-sjf"), load_preset("k-schedule"), load_preset("k-schedule"), k3,
                      load_preset("adaspec"), k5, load_preset("no-sd")])
    for number, trial in enumerate(ranked):
        trial.number = number
    deployable = lambda s: s.schedule.policy == "fcfs" and s.verify.policy == "all"  # noqa: E731
    picked = pick_candidates(ranked, deployable, top=1)
    assert [(c.spec.name, c.trial, c.why) for c in picked] == [("k-schedule", 1, "tune rank 1"),
                                                               ("static-k4", 3, "best static K"),
                                                               ("no-sd", 6, "no-SD reference")]
    assert picked[1].spec.length.params["k"] == 3  # the best-ranked static K, not the preset's
    two = pick_candidates(ranked, deployable, top=2)  # the duplicate k-schedule counts once
    assert [c.trial for c in two] == [1, 3, 6]


def test_a_tie_on_the_real_engine_goes_to_the_simpler_configuration():
    """A per-batch-size schedule with K = 2 in every bucket serves exactly as static K = 2, so their real
    attainments tie; the schedule ranked first on the simulator, the static K is recommended. Both
    replays here are the simulator (deterministic): this checks the decision rule, not an engine."""
    trace = load_workload(REPO / "workloads" / "bursty.toml").cap(40)
    sim = open_sim_replay(PROFILE, trace, k_max=8, max_batch=8)
    schedule = apply_overrides(load_preset("k-schedule"), {"length.k": [2] * 7})
    static = apply_overrides(load_preset("static-k4"), {"length.k": 2})
    result = confirm([Candidate(schedule, 5, "tune rank 1"), Candidate(static, 9, "best static K")], sim, sim,
                     ConfirmSettings(repeats=2), target=0.9, seed=0)
    assert result["status"] == "confirmed" and result["capacity_scale"] > 0
    first, second = result["candidates"]
    assert first["real_attainment"] == second["real_attainment"]
    assert first["tied_with_best"] and second["tied_with_best"]
    assert result["recommended"] == "static-k4" and result["recommended_trial"] == 9
    assert len(result["scales"]) == 3 and result["scales"][1] == pytest.approx(result["capacity_scale"])
    assert len(first["real_step_speed"]) == 3 and all(len(inside) == 2 for inside in first["real_step_speed"])
    assert result["uneven_repeats"] == [] and "speeds more than" not in result["reason"]


def test_repeats_whose_host_slowed_inside_a_run_are_named():
    """A confirmation whose second repeat at the first load ran slow over its last third (the probes before
    and after a run cannot see that) names the candidate and load in its reason."""
    trace = load_workload(REPO / "workloads" / "bursty.toml").cap(40)
    sim = open_sim_replay(PROFILE, trace, k_max=8, max_batch=8)
    static = apply_overrides(load_preset("static-k4"), {"length.k": 2})
    result = confirm([Candidate(static, 0, "tune rank 1")], sim, SlowedOnce(sim, seed=1),
                     ConfirmSettings(repeats=2), target=0.9, seed=0)
    assert result["uneven_repeats"] == [f"static-k4 at {result['scales'][0]:.3g}x"]
    assert "ran their steps at speeds more than 10% apart" in result["reason"]


def _row(name: str, level: int, low: float, high: float, why: str = "tune rank") -> dict:
    return {"strategy": name, "simplicity": level, "why": why,
            "real_attainment": {"mean": (low + high) / 2, "ci_low": low, "ci_high": high}}


def test_no_sd_as_a_reference_is_recommended_only_when_the_real_engine_refutes_sd():
    schedule, static = _row("k-schedule", 2, 0.70, 0.80), _row("static-k4", 1, 0.66, 0.74)
    no_sd = _row("no-sd", 0, 0.60, 0.68, "no-SD reference")
    chosen, best, clause = recommend([schedule, static, no_sd])
    assert (chosen["strategy"], best["strategy"]) == ("static-k4", "k-schedule")  # a tie: the simpler SD
    assert "not shown outside the noise" in clause and no_sd["tied_with_best"] is False
    chosen, _, clause = recommend([_row("k-schedule", 2, 0.90, 0.95), _row("no-sd", 0, 0.60, 0.62, "no-SD reference")])
    assert chosen["strategy"] == "k-schedule" and "outside the noise" in clause and "not shown" not in clause
    refuted = [_row("static-k4", 1, 0.50, 0.55), _row("no-sd", 0, 0.56, 0.60, "no-SD reference")]
    chosen, best, clause = recommend(refuted)
    assert chosen["strategy"] == best["strategy"] == "no-sd" and clause == ""
    # no-SD the simulator ranked among the top is a candidate like the others: it wins a tie (simplest)
    chosen, best, _ = recommend([_row("static-k4", 1, 0.60, 0.70), _row("no-sd", 0, 0.58, 0.66)])
    assert (chosen["strategy"], best["strategy"]) == ("no-sd", "static-k4")


WORKLOAD = synthetic_workload("confirm", rate=30, duration_s=1, max_requests=24, prompt_tokens=12, output_tokens=6)


@pytest.mark.slow
def test_tune_confirm_top_runs_the_candidates_on_the_torch_engine_and_deploys_its_pick(tmp_path, tiny_pair):
    run = write_synthetic_run(tmp_path / "profiled")
    write_fit(run, fit_profile(run))
    workload = tmp_path / "w.toml"
    workload.write_text(WORKLOAD)
    target, draft = tiny_pair
    spec = TuneSpec(workload=workload, profile=run, trials=10, strategies=["k-schedule", "static-k4", "no-sd"],
                    confirm_top=1, confirm_repeats=1, confirm_requests=12, max_batch=4,
                    pair=PairSpec(target=target, draft=draft))
    summary = run_tune(spec, tmp_path / "out")
    confirmed = summary["confirmed"]
    assert confirmed["status"] == "confirmed", confirmed
    assert confirmed["window_requests"] == 12 and confirmed["repeats"] == 1
    rows = confirmed["candidates"]
    assert rows[0]["why"] == "tune rank 1"
    whys = [r["why"] for r in rows[1:]]
    assert whys in (["best static K"], ["best static K", "no-SD reference"], ["no-SD reference"], [])
    for row in rows:
        assert 0.0 <= row["real_attainment"]["mean"] <= 1.0 and len(row["real_attainment_by_load"]) == 3
        assert all(t is not None and t > 0 for t in row["real_tpot_mean_by_load"])  # measured on torch
    assert summary["deployed"]["number"] == confirmed["recommended_trial"]
    assert summary["deploy"]["strategy"] == summary["deployed"]["name"]
    assert summary["deploy"]["notes"][0].startswith("confirmed on the torch engine")
    written = json.loads((tmp_path / "out" / "tune" / "summary.json").read_text())
    assert written["confirmed"]["recommended"] == confirmed["recommended"]


@pytest.mark.slow
def test_the_tune_cli_confirms_with_its_flags(tmp_path):
    """--confirm-top/--confirm-repeats/--confirm-requests reach the confirmation (bundled pair on torch)."""
    run = write_synthetic_run(tmp_path / "profiled")
    write_fit(run, fit_profile(run))
    workload = tmp_path / "w.toml"
    workload.write_text(WORKLOAD)
    res = subprocess.run([sys.executable, "-m", "autospec", "tune", "--workload", str(workload), "--profile",
                          str(run), "--out", str(tmp_path / "out"), "--trials", "4", "--strategies",
                          "static-k4,no-sd", "--confirm-top", "1", "--confirm-repeats", "1", "--confirm-requests",
                          "8", "--max-batch", "4", "--json"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    confirmed = json.loads(res.stdout)["confirmed"]
    assert confirmed["status"] == "confirmed" and confirmed["window_requests"] == 8 and confirmed["repeats"] == 1
    assert confirmed["candidates"][0]["why"] == "tune rank 1"
