"""tune searches the frontier chunk s_c where a preset declares it (0, fixed chunks, "auto"), scores it on
the simulator, records it in trials.parquet and writes a best.toml that loads back; the SM split r is
searched only when the profile has an r axis."""

from __future__ import annotations

import json

import optuna
import pandas as pd

from autospec.deploy import CONFIG_FILE
from autospec.fit import fit_profile, write_fit
from autospec.serving.metrics import Slo
from autospec.strategy import StrategySpec, load_preset, search_space
from autospec.tune import TuneSpec, open_storage, run_tune, sample_strategy

from stage_helpers import synthetic_workload, write_synthetic_run

WORKLOAD = synthetic_workload("frontier-tune", rate=40, duration_s=1, max_requests=30, prompt_tokens=48,
                              output_tokens=16)

PRESET = """
[strategy]
name = "chunked"

[length]
policy = "static"
k = 3

[execution]
chunk_size = 0

[search.length.k]
type = "int"
low = 1
high = 4

[search.execution.chunk_size]
type = "categorical"
choices = [0, 1, 2, "auto"]
"""


def test_tune_searches_the_chunk_and_best_toml_round_trips(tmp_path):
    run = write_synthetic_run(tmp_path / "profiled")
    write_fit(run, fit_profile(run))
    (tmp_path / "w.toml").write_text(WORKLOAD)
    (tmp_path / "chunked.toml").write_text(PRESET)
    spec = TuneSpec(workload=tmp_path / "w.toml", profile=run, trials=10, prune=False,
                    strategies=[str(tmp_path / "chunked.toml")], slo=Slo(ttft_s=0.5, tpot_s=0.05))
    out = tmp_path / "run"
    summary = run_tune(spec, out)
    trials = pd.read_parquet(out / "tune" / "trials.parquet")
    column = "params_chunked.execution.chunk_size"
    assert column in trials.columns
    assert set(trials[column].dropna().astype(str)) <= {"0", "1", "2", "auto"}
    assert trials[column].astype(str).iloc[0] == "0"  # the preset's own value is the first trial
    assert trials[column].dropna().astype(str).nunique() > 1
    assert not any("sm_split" in c for c in trials.columns)  # no r axis in this profile: r is not searched
    assert (trials["state"] == "COMPLETE").sum() == 10
    best = load_preset(out / "tune" / "best.toml")
    study = optuna.load_study(study_name=summary["study_name"], storage=open_storage(summary["storage"]))
    trial = study.trials[summary["best"]["number"]]
    ran = StrategySpec.model_validate(trial.user_attrs["spec"])
    assert best.execution == ran.execution and best.length == ran.length
    assert best.execution.chunk_size == trial.params["chunked.execution.chunk_size"]
    if best.execution.chunk_size != 0:  # vLLM cannot run frontier chunks: deploy/ says so, no crash
        assert json.loads((out / "deploy" / CONFIG_FILE).read_text())["supported"] is False


def test_gp_lcb_declares_the_chunk_and_r_needs_an_r_axis():
    spec = load_preset("gp-lcb")
    assert search_space(spec)["execution.chunk_size"].choices == [0, 1, 2, 4, "auto"]
    study = optuna.create_study()
    for axis in (False, True):
        trial = study.ask()
        sampled = sample_strategy(trial, {"gp-lcb": spec}, sm_split_axis=axis)
        assert "gp-lcb.execution.chunk_size" in trial.params
        assert sampled.execution.chunk_size == trial.params["gp-lcb.execution.chunk_size"]
        assert ("gp-lcb.execution.sm_split" in trial.params) is axis
