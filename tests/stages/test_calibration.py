"""Acceptance calibration (`autospec.fit.fit_calibration`, `autospec.policies.calibrators`): on synthetic
draft chains whose true acceptance is known, the isotonic calibrator fixes a monotone miscalibration
STS cannot; the held-out split never puts a prompt on both sides; the Brier skill score tells real
calibration from predicting the base rate; calibrators and the fit's record survive JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autospec.calibration import CalibrationFit
from autospec.errors import InputError
from autospec.fit import cluster_ece, ece_interval, fit_calibration, fit_profile, load_fit, prompt_folds, write_fit
from autospec.policies.calibrators import (
    CALIBRATOR,
    IsotonicCalibrator,
    PlattCalibrator,
    StsCalibrator,
    bin_index,
    fit_isotonic,
    fit_platt,
    survival_labels,
)
from autospec.policies.sts import DEFAULT_GRID, ece

from stage_helpers import write_synthetic_run

DOMAINS = ("code", "chat", "math")


def chains(n_prompts: int = 60, per_prompt: int = 100, k: int = 4, power: float = 3.0, seed: int = 0,
           informative: bool = True):
    """Draft chains with known truth: token j of a chain is accepted with probability q_j (independent),
    and the draft reports c_j = q_j ** power — a monotone miscalibration (power 3: a token accepted 60% of
    the time is reported at 0.22, below 1/2, where no temperature can lift it). `informative=False`
    reports confidences unrelated to acceptance."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.3, 0.99, (n_prompts * per_prompt, k))
    ok = rng.random(q.shape) < q
    accepted = np.where(ok.all(axis=1), k, np.argmin(ok, axis=1)).astype(float)
    conf = q ** power if informative else rng.uniform(0.05, 0.95, q.shape)
    pids = np.repeat([f"p{i}" for i in range(n_prompts)], per_prompt)
    domains = np.repeat([DOMAINS[i % 3] for i in range(n_prompts)], per_prompt)
    return conf, accepted, pids, domains


@pytest.fixture(scope="module")
def miscalibrated() -> CalibrationFit:
    conf, accepted, pids, domains = chains()
    return fit_calibration(conf, accepted, pids, domains, bootstrap=200, seed=0)


def test_isotonic_fixes_a_monotone_miscalibration_sts_cannot(miscalibrated):
    held = miscalibrated.held_out
    assert held["identity"].ece > 0.2  # the raw confidences are far off
    assert held["isotonic"].ece < 0.02
    assert held["sts"].ece > 0.1  # a binary temperature cannot move 0.22 above 1/2
    # the choice is the lowest held-out ECE, and it is one that calibrates
    assert miscalibrated.chosen in ("isotonic", "platt")
    assert held[miscalibrated.chosen].ece == min(held[k].ece for k in ("sts", "isotonic", "platt"))
    assert miscalibrated.calibrator == miscalibrated.candidates[miscalibrated.chosen]
    assert miscalibrated.after.ece_ci[1] < 0.05
    # the survivals it predicts match the known truth Π q_j = Π c_j^(1/3) on fresh chains
    conf, accepted, _, _ = chains(n_prompts=3, seed=7)
    truth = np.cumprod(conf ** (1 / 3), axis=1)
    pred = miscalibrated.candidates["isotonic"].survival(conf)
    assert np.mean(np.abs(pred - truth)) < 0.03
    assert np.all(np.diff(pred, axis=1) <= 1e-12)  # a survival never rises with the position


def test_every_ece_interval_is_ordered_and_holds_its_point_estimate(miscalibrated):
    for name, score in miscalibrated.held_out.items():
        low, high = score.ece_ci
        assert 0.0 <= low <= score.ece <= high, (name, score.ece, score.ece_ci)
        # a real interval; the base rate's held-out ECE is exactly 0 (equal folds: the training rates
        # average to the held-out ones) and its bias-corrected interval is [0, 0]
        assert low < high or name == "base_rate", name


def clustered_chains(rng, shift: float, n_prompts: int = 60, per_prompt: int = 40, spread: float = 0.03):
    """Samples (p, y, prompt) of a predictor off by `shift` on average, each prompt by its own offset
    (N(0, spread)): P(y = 1) = clip(p + shift + offset, 0, 1)."""
    groups = np.repeat(np.arange(n_prompts), per_prompt)
    p = rng.uniform(0.05, 0.95, groups.size)
    q = np.clip(p + shift + rng.normal(0.0, spread, n_prompts)[groups], 0.0, 1.0)
    return p, (rng.random(groups.size) < q).astype(float), groups


def per_group_gaps(p: np.ndarray, y: np.ndarray, groups: np.ndarray, bins: int = 20):
    """`ece_interval`'s inputs: per group Σ(y − p) per bin, and its sample count."""
    n_groups = int(groups.max()) + 1
    gap = np.zeros((n_groups, bins))
    np.add.at(gap, (groups, bin_index(p, bins)), y - p)
    return gap, np.bincount(groups, minlength=n_groups).astype(float)


def test_the_cluster_statistic_is_the_ece_of_the_resampled_prompts():
    p, y, groups = clustered_chains(np.random.default_rng(0), 0.05, n_prompts=12)
    stat = cluster_ece(*per_group_gaps(p, y, groups))
    resample = np.array([[3, 3, 0, 11, 7, 7, 7, 1, 2, 5, 5, 9], list(range(12))])
    for row, got in zip(resample, stat(resample)):
        take = np.concatenate([np.flatnonzero(groups == g) for g in row])
        assert got == pytest.approx(ece(p[take], y[take]), abs=1e-12)


@pytest.mark.filterwarnings("ignore::RuntimeWarning", "ignore::scipy.stats.DegenerateDataWarning")  # BCa's z0
def test_the_ece_interval_corrects_the_bootstraps_upward_bias():
    """A predictor 0.02 off (population ECE ~0.02), 60 prompts: the estimate's noise only adds to ECE (~0.034
    on average), and resampling prompts adds the same again. Over seeded replicates the bias-corrected
    interval covers the true ECE most of the time and always holds its estimate; the percentile interval
    it replaced (and BCa, whose extreme z0 collapses it) almost never covers the truth."""
    from scipy.stats import bootstrap

    rng = np.random.default_rng(3)
    p, y, _ = clustered_chains(rng, 0.02, n_prompts=20_000, per_prompt=100)
    truth = float(np.abs(np.bincount(bin_index(p), _true_gap(p, 0.02, 0.03, rng), minlength=20)).sum() / p.size)
    replicates, covered = 100, {"ours": 0, "percentile": 0, "BCa": 0}
    for _ in range(replicates):
        p, y, groups = clustered_chains(rng, 0.02)
        gap, count = per_group_gaps(p, y, groups)
        estimate = ece(p, y)
        low, high = ece_interval(gap, count, estimate, 300, seed=int(rng.integers(1 << 30)))
        assert 0.0 <= low <= estimate <= high
        covered["ours"] += low <= truth <= high
        for method in ("percentile", "BCa"):
            ci = bootstrap((np.arange(len(count)),), cluster_ece(gap, count), n_resamples=300, vectorized=True,
                           method=method, rng=rng).confidence_interval
            covered[method] += bool(ci.low <= truth <= ci.high)
    assert covered["ours"] >= 0.8 * replicates, covered
    assert covered["percentile"] <= 0.1 * replicates and covered["BCa"] <= 0.2 * replicates, covered


def _true_gap(p: np.ndarray, shift: float, spread: float, rng) -> np.ndarray:
    """E[y] − p of fresh prompts (the population's per-sample gap, before Bernoulli noise)."""
    return np.clip(p + shift + rng.normal(0.0, spread, p.size), 0.0, 1.0) - p


def test_the_ece_interval_holds_its_estimate_where_resampling_cannot_bracket_it():
    # every resample has ECE 0 (no group has any gap)
    assert ece_interval(np.zeros((4, 20)), np.full(4, 10.0), 0.0, 200, seed=0) == [0.0, 0.0]
    # gaps that cancel only when both prompts are in: estimate 0, every unequal resample 0.3: the
    # bias-corrected interval is [0 (clipped), 0]
    gap = np.zeros((2, 20))
    gap[:, 5] = [3.0, -3.0]
    assert ece_interval(gap, np.full(2, 10.0), 0.0, 200, seed=0) == [0.0, 0.0]
    # an estimate above every resample's ECE: the interval reaches up to it
    low, high = ece_interval(np.zeros((4, 20)), np.full(4, 10.0), 0.05, 200, seed=0)
    assert low == 0.0 and high == 0.05


def test_brier_skill_is_positive_for_calibration_and_zero_for_the_base_rate(miscalibrated):
    after = miscalibrated.after
    assert after.brier_skill > 0.05 and after.brier_skill_ci[0] > 0
    assert miscalibrated.held_out["base_rate"].brier_skill == 0.0
    # confidences that say nothing: any calibrator can only learn the base rate — low ECE, no skill
    conf, accepted, pids, domains = chains(informative=False)
    blind = fit_calibration(conf, accepted, pids, domains, bootstrap=100)
    assert blind.after.ece < 0.02
    assert blind.after.brier_skill < 0.01


def test_held_out_folds_never_split_a_prompt():
    conf, accepted, pids, domains = chains(n_prompts=23, per_prompt=5)
    folds = prompt_folds(pids, domains, k=5, seed=3)
    assert sorted(np.concatenate(folds).tolist()) == list(range(len(pids)))  # every row held out once
    for test in folds:
        train = np.setdiff1d(np.arange(len(pids)), test)
        assert not set(pids[test]) & set(pids[train])
        assert set(domains[test]) == set(DOMAINS)  # dealt per domain: each fold holds every domain
    with pytest.raises(InputError, match="at least 2"):
        prompt_folds(["only"] * 4, ["code"] * 4)


def test_out_of_fold_predictions_come_from_calibrators_that_did_not_see_the_prompt():
    # Every chain of prompt "a" is accepted whatever its confidence, every chain of the others never is.
    # A calibrator that saw "a" would predict its acceptance; held out by prompt it cannot.
    rng = np.random.default_rng(0)
    n = 40
    pids = np.repeat([f"p{i}" for i in range(10)], n)
    conf = rng.uniform(0.2, 0.9, (10 * n, 2))
    conf[:n] = 0.95  # prompt p0: confident and always accepted
    accepted = np.zeros(10 * n)
    accepted[:n] = 2
    fit = fit_calibration(conf, accepted, pids, None, kinds=("isotonic",), folds=10, bootstrap=50)
    # p0's chains are predicted by a calibrator fitted on prompts that are never accepted: survival ~0
    assert fit.held_out["isotonic"].ece > 0.09  # ~ 1/10 of the samples are off by ~1
    fit_seen = fit_isotonic(conf, accepted)  # in-sample it would look perfect
    p = fit_seen.survival(conf)
    assert ece(p.ravel(), survival_labels(accepted, 2).ravel()) < 0.01


def test_isotonic_applies_exactly_what_scikit_learn_fitted():
    from sklearn.isotonic import IsotonicRegression

    conf, accepted, _, _ = chains(n_prompts=6, per_prompt=50, k=1)
    cal = fit_isotonic(conf, accepted)
    reg = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip").fit(conf[:, 0], accepted >= 1)
    probe = np.linspace(-0.1, 1.1, 97)[:, None]
    assert cal.survival(probe)[:, 0] == pytest.approx(reg.predict(probe[:, 0]), abs=1e-12)


def test_calibrators_round_trip_through_json_and_refuse_bad_parameters(miscalibrated):
    conf, _, _, _ = chains(n_prompts=2, per_prompt=20)
    conf[0, 2:] = np.nan  # a chain that ended after two drafts
    for cal in (*miscalibrated.candidates.values(), fit_platt(conf[1:], np.full(39, 2.0))):
        back = CALIBRATOR.validate_json(json.dumps(cal.model_dump(mode="json")))
        assert back == cal
        np.testing.assert_array_equal(back.survival(conf), cal.survival(conf))
        assert np.isnan(cal.survival(conf)[0, 2:]).all() and not np.isnan(cal.survival(conf)[0, :2]).any()
    again = CalibrationFit.model_validate_json(miscalibrated.model_dump_json())
    assert again == miscalibrated
    with pytest.raises(ValueError):
        IsotonicCalibrator(x=[[0.0, 0.5]], y=[[0.6, 0.2]])  # not monotone
    with pytest.raises(ValueError):
        StsCalibrator(temperatures=[0.0])
    with pytest.raises(ValueError):
        PlattCalibrator(coef=[[1.0]])


def test_sts_grid_reaches_one_sixty_fourth():
    assert min(DEFAULT_GRID) == pytest.approx(1 / 64) and max(DEFAULT_GRID) == pytest.approx(8.0)
    assert len(DEFAULT_GRID) == 73  # m = -48..24


def test_fit_writes_the_calibration_and_load_fit_gives_it_to_policies(tmp_path):
    run = write_synthetic_run(tmp_path)
    write_fit(run, fit_profile(run))
    data = json.loads((run / "fit" / "models.json").read_text())
    cal = data["calibration"]
    assert cal["chosen"] in ("sts", "isotonic", "platt") and cal["calibrator"]["kind"] == cal["chosen"]
    assert {"identity", "base_rate", "sts", "isotonic", "platt"} == set(cal["held_out"])
    for score in cal["held_out"].values():
        assert {"ece", "ece_ci", "brier", "brier_skill", "brier_skill_ci", "reliability"} <= set(score)
    assert cal["prompts"] == 6 and cal["folds"] == 5
    # the STS key reports the same held-out numbers as the calibration's STS candidate
    assert data["sts"]["ece_after"] == cal["held_out"]["sts"]["ece"]
    assert data["sts"]["ece_before"] == cal["held_out"]["identity"]["ece"]
    fit = load_fit(run)
    assert fit.calibrator == fit.models.calibration.calibrator
    inputs = fit.policy_inputs
    assert inputs["calibration"] == cal["calibrator"]
    assert inputs["sps_tokens"] == [int(t) for t in data["sps"]["tokens"]]


def test_the_report_shows_the_chosen_calibrator_its_held_out_scores_and_reliability(tmp_path):
    from autospec.report.build import write_report

    run = write_synthetic_run(tmp_path)
    models = fit_profile(run)
    write_fit(run, models)
    html = write_report(run).read_text(encoding="utf-8")
    summary = (run / "summary.md").read_text(encoding="utf-8")
    cal = models.calibration
    before, after = cal.before, cal.after
    for page in (html, summary):
        assert f"Calibrator DSpark applies: {cal.chosen}" in page
        assert f"ECE {before.ece:.3f} on raw confidences → {after.ece:.3f} [95% CI {after.ece_ci[0]:.3f}, " \
               f"{after.ece_ci[1]:.3f}" in page
        assert f"Brier skill score against the per-position base rate {after.brier_skill:.3f}" in page
        assert f"{cal.chosen} — chosen" in page  # the table of every predictor marks the choice
    # the reliability plot is the held-out one of the chosen calibrator
    assert "held-out reliability" in html and f"{cal.chosen} (chosen) (ECE {after.ece:.3f})" in html
