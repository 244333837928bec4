"""DSpark runs on the fit's calibrator and SPS(B) table by default (issue 15, item 1), applies the very
function the fit scored, and a run without a fit says it is uncalibrated."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest

from autospec.policies.calibrators import IsotonicCalibrator
from autospec.policies.dspark import DsparkParams, survivals
from autospec.strategy import (
    apply_fit,
    build_strategy,
    calibration_flags,
    load_preset,
    spec_from_dict,
    spec_to_toml,
    uncalibrated_warnings,
)

from policy_helpers import make_ctx, make_drafts

# A fit whose calibrator says the first draft survives 90% and the first two 85%, whatever the raw
# confidence, and whose SPS table loses 20% then 12.5% per extra verification token.
CALIBRATOR = IsotonicCalibrator(x=[[0.0, 1.0], [0.0, 1.0]], y=[[0.9, 0.9], [0.85, 0.85]])
FIT = {"calibration": CALIBRATOR.model_dump(mode="json"), "sps_tokens": [1, 2, 3], "sps_values": [1.0, 0.8, 0.7]}
# Raw confidences 0.2: survivals 0.2, 0.04. R = 1, Θ0 = 1·SPS(1) = 1.
#   raw:        admit a1 → (1 + 0.2)·0.8 = 0.96 < 1: stop, verify 0
#   calibrated: (1 + 0.9)·0.8 = 1.52 > 1, then (1.9 + 0.85)·0.7 = 1.925 > 1.52: verify 2
POOR = [[0.2, 0.2]]


@pytest.mark.parametrize("preset", ["dspark", "dspark-async"])
def test_dspark_takes_the_fits_calibrator_and_sps_table_by_default(preset):
    spec = load_preset(preset)
    assert not spec.verify.params.get("temperatures") and not spec.verify.params.get("sps_tokens")
    fitted = build_strategy(spec, FIT).verify
    assert fitted.params.calibration == CALIBRATOR
    assert fitted.params.sps_tokens == [1, 2, 3] and fitted.params.sps_values == [1.0, 0.8, 0.7]
    assert fitted.select(make_ctx(1), make_drafts(POOR)) == [2]
    # the same preset and SPS table on raw confidences verifies nothing: the calibrator is what changed it
    table_only = build_strategy(spec, {k: FIT[k] for k in ("sps_tokens", "sps_values")}).verify
    assert table_only.params.calibration is None
    assert table_only.select(make_ctx(1), make_drafts(POOR)) == [0]


def test_a_presets_own_calibration_and_table_win_over_the_fit():
    spec = load_preset("dspark")
    own = spec_from_dict({**spec.model_dump(), "verify": {**spec.verify.params, "policy": "dspark",
                                                          "temperatures": [2.0], "sps_tokens": [1, 2],
                                                          "sps_values": [1.0, 0.9]}})
    params = build_strategy(own, FIT).verify.params
    assert params.temperatures == [2.0] and params.calibration is None and params.sps_tokens == [1, 2]
    flags = calibration_flags([own], FIT)
    assert flags["dspark"] == {"calibrated": True, "kind": "sts", "source": "preset"}
    with pytest.raises(Exception, match="not both"):
        DsparkParams(temperatures=[2.0], calibration=CALIBRATOR)


def test_a_fitted_spec_round_trips_through_toml():
    import tomllib

    spec = apply_fit(load_preset("dspark"), FIT)
    back = spec_from_dict(tomllib.loads(spec_to_toml(spec)))
    assert build_strategy(back).verify.params.calibration == CALIBRATOR


def test_dspark_survivals_are_the_calibrators_own_function():
    # "one implementation": what DSpark ranks by is Calibrator.survival, the function `autospec fit` scored
    rng = np.random.default_rng(0)
    knots = np.sort(rng.uniform(0, 1, (3, 6)), axis=1)
    cal = IsotonicCalibrator(x=knots.tolist(), y=np.sort(rng.uniform(0, 1, (3, 6)), axis=1).tolist())
    confs = [[0.9, 0.4, 0.7], [0.3], [0.8, 0.8]]
    got = survivals(make_drafts(confs), cal)
    for row, conf in zip(got, confs):
        assert row == pytest.approx(cal.survival([conf])[0].tolist())


def test_a_run_without_a_fit_warns_that_dspark_is_uncalibrated(caplog):
    specs = [load_preset("dspark"), load_preset("static-k2")]
    with caplog.at_level(logging.WARNING, logger="autospec.strategy"):
        lines = uncalibrated_warnings(specs, None)
    assert len(lines) == 1 and "dspark runs uncalibrated" in lines[0] and "no fit" in lines[0]
    assert caplog.messages == lines
    assert calibration_flags(specs, None) == {"dspark": {"calibrated": False, "kind": "identity", "source": None}}
    # with a fit: no warning, and the summary flag names the fit's calibrator
    assert uncalibrated_warnings(specs, FIT) == []
    assert calibration_flags(specs, FIT) == {"dspark": {"calibrated": True, "kind": "isotonic", "source": "fit"}}


def test_evaluate_without_a_profile_says_so_in_its_summary(tiny_pair, tmp_path, caplog):
    from autospec.config import PairSpec
    from autospec.evaluate import EvaluateSpec, run_evaluate

    workload = tmp_path / "two.toml"
    workload.write_text("""
[workload]
name = "two"
format = "synthetic"
generator = "poisson"
rate = 50.0
duration_s = 10.0
max_requests = 2
mean_prompt_tokens = 8
mean_output_tokens = 4
max_prompt_tokens = 10
max_output_tokens = 5
prompts = []
seed = 3
""")
    spec = EvaluateSpec(workload=workload, strategies=["dspark"], max_batch=2, k_max=4,
                        pair=PairSpec(target=tiny_pair[0], draft=tiny_pair[1]))
    with caplog.at_level(logging.WARNING, logger="autospec.strategy"):
        result = run_evaluate(spec, tmp_path / "run")
    assert any("dspark runs uncalibrated" in m for m in caplog.messages)
    summary = json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())
    assert summary["calibration"] == {"dspark": {"calibrated": False, "kind": "identity", "source": None}}
    assert result.summary["calibration"] == summary["calibration"]


def test_a_sim_replay_builds_dspark_with_its_profiles_fit(tmp_path):
    from autospec.evaluate import open_sim_replay
    from autospec.fit import fit_profile, load_fit, write_fit
    from autospec.workloads.spec import load_workload

    from stage_helpers import synthetic_workload, write_synthetic_run

    run = write_synthetic_run(tmp_path)
    write_fit(run, fit_profile(run))
    (tmp_path / "w.toml").write_text(synthetic_workload("w", rate=10, duration_s=2, max_requests=4,
                                                        prompt_tokens=16, output_tokens=8, domains=False))
    replay = open_sim_replay(run, load_workload(tmp_path / "w.toml"))
    fit = load_fit(run)
    verify = replay.build(load_preset("dspark")).verify
    assert verify.params.calibration == fit.calibrator and verify.params.calibration.kind != "identity"
    assert verify.params.sps_tokens == fit.sps[0] and verify.params.sps_values == fit.sps[1]
    assert replay.calibration([load_preset("dspark")])["dspark"]["source"] == "fit"
    records = replay.run(load_preset("dspark"), 0)
    assert len(records.requests) == 4


def test_a_calibrated_survival_reads_no_later_confidence():
    # DSpark's sync form is lossless only if the decision on token j depends on tokens the target judges
    # (App. A): a_j may read c_1..c_j, never c_{j+1}.. — the isotonic/Platt monotone fix is a running min
    from autospec.policies.calibrators import PlattCalibrator

    iso = IsotonicCalibrator(x=[[0.0, 0.5, 1.0]] * 3, y=[[0.1, 0.5, 0.6], [0.2, 0.7, 0.9], [0.3, 0.8, 0.95]])
    platt = PlattCalibrator(coef=[[0.5, 1.0], [0.8, 2.0], [1.0, 3.0]])
    for cal in (iso, platt):
        rows = cal.survival([[0.9, 0.95, c3] for c3 in (0.01, 0.5, 0.99)])
        assert np.ptp(rows[:, :2], axis=0).max() == 0.0
        assert np.all(np.diff(rows, axis=1) <= 0)
