"""`autospec tune` scores a trial with the replay `autospec evaluate --engine sim` runs: one strategy on
one profile, workload, seed and SLO gives the same metrics through either command — on a torch
profile and on a vLLM profile (whose simulator prefills inside the running requests' step). Both
commands run with their default SLO, which must be the one `autospec run` uses (config.SloSpec)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autospec.config import SloSpec
from autospec.evaluate import HEADLINE, RELATIVE
from autospec.fit import fit_profile, write_fit

from stage_helpers import K_MAX, synthetic_workload, write_synthetic_run

# Arrivals overlap (≈3 requests in flight at 40/s): admissions land while others run, so the step
# structure of a vLLM profile (fused prefill) shows in TTFT, TPOT and the makespan.
WORKLOAD = synthetic_workload("tune-vs-evaluate", rate=40, duration_s=2, max_requests=60, prompt_tokens=64,
                              output_tokens=24)
STRATEGY = "static-k2"


def cli(*args: str) -> dict:
    res = subprocess.run([sys.executable, "-m", "autospec", *args, "--json"], capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


@pytest.mark.parametrize("engine", ["torch", "vllm"])
def test_a_tune_trial_scores_what_evaluate_on_the_simulator_measures(tmp_path, engine):
    run = write_synthetic_run(tmp_path / "profiled", engine=engine)
    write_fit(run, fit_profile(run))
    workload = tmp_path / "w.toml"
    workload.write_text(WORKLOAD)
    common = ["--workload", str(workload), "--profile", str(run), "--seed", "0", "--max-batch", "4"]

    # one trial: the candidate at its preset values (tune enqueues every candidate's defaults first)
    tuned = cli("tune", *common, "--out", str(tmp_path / "tune"), "--trials", "1", "--strategies", STRATEGY)
    assert tuned["best"]["strategy"] == STRATEGY and tuned["best"]["params"] == {f"{STRATEGY}.length.k": 2}
    evaluated = cli("evaluate", *common, "--out", str(tmp_path / "eval"), "--engine", "sim",
                    "--strategies", STRATEGY, "--k-max", str(K_MAX))

    default_slo = SloSpec().model_dump()
    assert tuned["slo"] == evaluated["slo"] == default_slo  # one default for run, tune and evaluate
    trial = tuned["best"]["metrics"]
    measured = {key: evaluated["strategies"][STRATEGY][key]["mean"] for key in HEADLINE}
    # tune has no no-SD run to divide by; the default objective (capacity) searches what evaluate does
    compared = [k for k in HEADLINE if k not in RELATIVE]
    assert set(trial) == {k for k in compared if measured[k] is not None}
    for key in compared:
        if measured[key] is None:
            continue
        assert trial[key] == pytest.approx(measured[key], rel=1e-12, abs=1e-15), key


def test_the_pruning_signal_counts_the_requests_the_metrics_count_as_meeting_the_slo(tmp_path):
    """GoodputSoFar (tune's pruning signal) judges each finished request with serving.metrics' SLO
    check: over a whole replay it counts exactly the requests slo_attainment counts, with an SLO at
    the medians so that some requests miss it on TTFT and others on TPOT."""
    import optuna

    from autospec.serving.metrics import Slo, compute_metrics, per_request_latencies
    from autospec.strategy import load_preset
    from autospec.tune import GoodputSoFar, TuneSpec, open_replay

    run = write_synthetic_run(tmp_path / "profiled", engine="vllm")
    write_fit(run, fit_profile(run))
    workload = tmp_path / "w.toml"
    workload.write_text(WORKLOAD)
    strategy = load_preset(STRATEGY)
    loose = open_replay(TuneSpec(workload=workload, profile=run, max_batch=4))
    lat = per_request_latencies(loose.run(strategy, 0).requests_frame())
    slo = Slo(ttft_s=float(lat["ttft_s"].median()), tpot_s=float(lat["tpot_s"].median()))

    replay = open_replay(TuneSpec(workload=workload, profile=run, max_batch=4, slo=slo))
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    hook = GoodputSoFar(optuna.create_study(direction="maximize").ask(), replay)
    records = replay.run(strategy, 0, on_finish=hook)
    metrics = compute_metrics(records.requests_frame(), records.steps_frame(), slo)
    assert hook.finished == len(replay.requests) == 60
    assert 0 < hook.met < hook.finished
    assert hook.met == round(metrics["slo_attainment"] * hook.finished)


def test_a_capacity_trial_scores_the_capacity_evaluate_reports(tmp_path):
    """--objective capacity: a trial's value is the capacity at the SLO `evaluate --engine sim` reports for
    the same strategy (one search, one definition), with --min-attainment as the attainment target."""
    run = write_synthetic_run(tmp_path / "profiled", engine="torch")
    write_fit(run, fit_profile(run))
    workload = tmp_path / "w.toml"
    workload.write_text(WORKLOAD)
    common = ["--workload", str(workload), "--profile", str(run), "--seed", "0", "--max-batch", "4"]
    tuned = cli("tune", *common, "--out", str(tmp_path / "tune"), "--trials", "1", "--strategies", STRATEGY,
                "--objective", "capacity", "--min-attainment", "0.8")
    evaluated = cli("evaluate", *common, "--out", str(tmp_path / "eval"), "--engine", "sim", "--strategies",
                    STRATEGY, "--k-max", str(K_MAX), "--capacity-target", "0.8")
    capacity = evaluated["strategies"][STRATEGY]["capacity_rps"]["mean"]
    assert capacity is not None and capacity > 0
    assert tuned["objective"] == "capacity" and tuned["objectives"] == ["capacity_rps"]
    assert tuned["best"]["value"] == pytest.approx(capacity, rel=1e-12)
    assert tuned["best"]["metrics"]["capacity_rps"] == pytest.approx(capacity, rel=1e-12)
