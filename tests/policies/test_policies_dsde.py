"""DSDE (KLD-stability draft lengths): weighted statistics, WVIR, SF, SL̂, SL_max calibration, batch cap."""

from __future__ import annotations

import pytest

from autospec.policies.dsde import (
    DsdeLength,
    DsdeParams,
    batch_cap,
    calibrate_sl_max,
    predicted_length,
    scale_factor,
    step_mean,
    weighted_mean_var,
    wvir,
)

from policy_helpers import make_ctx, make_outcome

THREE = [0.1, 0.3, 0.2]  # oldest first
TWELVE = [0.05, 0.4, 0.1, 0.3, 0.05, 0.35, 0.1, 0.2, 0.15, 0.2, 0.1, 0.15]


def test_weighted_mean_and_variance_hand_worked():
    # weights 1, 0.85, 0.7225 on 0.2, 0.3, 0.1 (most recent first)
    mean, var = weighted_mean_var(THREE, 0.85)
    assert mean == pytest.approx(0.52725 / 2.5725)
    assert var == pytest.approx(0.006088166, rel=1e-6)


def test_wvir_windows_and_degenerate_cases():
    assert wvir([0.3]) == 0.0  # fewer than 2 values
    assert wvir([0.2] * 12) == 20.0  # flat long window
    assert wvir(THREE) == pytest.approx(1.0)  # both windows hold the same 3 values
    # short window = last 10 values, long = all 12
    assert wvir(TWELVE) == pytest.approx(0.005682826 / 0.007603782, rel=1e-6)


def test_scale_factor():
    assert scale_factor(0.0) == 0.0
    assert scale_factor(0.5) == pytest.approx(1.718281828)


def test_predicted_length_hand_worked():
    p = DsdeParams()
    # THREE, last step (0.2): μ_KLD,last = 0.2, SF = exp(0.4) − 1 = 0.491825, WVIR = 1
    #   → (1 − 0.491825)·6 + 2 = 5.049 → 6. (The decay-weighted mean of the window, 0.204956, would
    #   give SF 0.50669 → 4.96 → 5: μ_KLD,last is the last step's plain mean, Eq. 3.)
    assert step_mean([0.2]) == pytest.approx(0.2)
    assert predicted_length(THREE, step_mean([0.2]), 8.0, p) == 6
    # TWELVE, last step (0.1, 0.15): SF = exp(0.25) − 1 = 0.284025, WVIR = 0.747368 → 0.212272
    #   → (1 − 0.212272)·6 + 2 = 6.73 → 7
    assert predicted_length(TWELVE, step_mean([0.1, 0.15]), 8.0, p) == 7
    # flat: WVIR 20 · SF(0.2) = 20·0.4918 > 1 → SL_min
    assert predicted_length([0.2] * 12, 0.2, 8.0, p) == 2
    # no history → SL_max
    assert predicted_length([], 0.0, 8.0, p) == 8
    assert step_mean([]) is None


def test_calibration_and_batch_cap():
    # SL_A,max = 3, mean KLD 0.2, max 0.5: 3·(1 + 0.2/0.500001)
    assert calibrate_sl_max(3, [0.1, 0.5, 0.0, 0.2]) == pytest.approx(4.19999760)
    assert batch_cap([2, 5, 7]) == 5  # ceil(14/3)
    assert batch_cap([4, 4]) == 4


def test_policy_warmup_then_per_request_lengths_with_cap():
    policy = DsdeLength()
    ctx = make_ctx(2)
    policy.begin_step(ctx)
    assert policy.step_targets == {0: 8, 1: 8}  # warm-up drafts K_max
    # warm-up: 16 proposed tokens, not yet 30
    policy.observe(ctx, make_outcome([8, 8], [3, 1], klds=[[0.1, 0.5, 0.0, 0.2], []]))
    assert policy.sl_max is None
    policy.observe(ctx, make_outcome([8, 8], [2, 2], klds=[[], []]))
    # 32 proposed: SL_max = 3·(1 + 0.2/0.5) = 4.2
    assert policy.sl_max == pytest.approx(4.2, rel=1e-5)
    # request 0 has 4 KLDs (WVIR 1), request 1 none (→ SL_max)
    policy.begin_step(ctx)
    # request 0: KLDs 0.1, 0.5, 0.0, 0.2 in one step → μ_KLD,last 0.2, SF 0.491825, WVIR 1
    #   → (1 − 0.491825)·(4.2 − 2) + 2 = 3.12 → 4
    # request 1: no history → ceil(4.2) = 5; cap = ceil((4 + 5)/2) = 5
    assert policy.step_targets == {0: 4, 1: 5}


def test_policy_forgets_finished_requests():
    policy = DsdeLength(warmup_tokens=1)
    ctx = make_ctx(1)
    policy.observe(ctx, make_outcome([4], [2], klds=[[0.3, 0.3]], finished=[True]))
    assert policy._klds == {} and policy._last_mean == {}


def test_batched_predicted_lengths_equal_the_per_request_formula():
    """The vectorised batch path must give exactly predicted_length for every history shape."""
    import numpy as np

    from autospec.policies.dsde import DsdeParams, predicted_length, predicted_lengths

    rng = np.random.default_rng(3)
    params = DsdeParams()
    histories = [[], [0.2], [0.1, 0.1], [0.0] * 12] + [list(rng.gamma(1.0, s, n)) for s in (0.05, 0.3, 1.0)
                                                          for n in (2, 9, 10, 11, 29, 30)]
    last = [float(rng.uniform(0.0, 1.5)) for _ in histories]
    for sl_max in (3.0, 6.5, 8.0):
        assert predicted_lengths(histories, last, sl_max, params) == [
            predicted_length(h, m, sl_max, params) for h, m in zip(histories, last)]


def test_the_last_steps_mean_sets_the_scale_factor_not_a_decayed_window_mean():
    """Eq. 3: μ_KLD,last is the mean of the request's last step. After 22 high-divergence values a
    step with KLDs (0.05, 0.04, 0.06) gives μ_KLD,last = 0.05 and SF·WVIR = 0.11 → SL̂ = SL_max = 8;
    a decay-weighted mean over the last ten values (0.18, still dominated by the old 0.3s) would give
    SF·WVIR = 0.46 → 6."""
    policy = DsdeLength(warmup_tokens=1)
    ctx = make_ctx(1)
    policy.observe(ctx, make_outcome([8], [8], klds=[[0.1]]))  # warm-up: SL_max = 8·(1 + 0.1/0.1) → K_max
    history = [0.3, 0.35, 0.25, 0.3] * 5 + [0.3, 0.32]
    for i in range(0, len(history), 2):
        policy.observe(ctx, make_outcome([2], [1], klds=[history[i:i + 2]]))
    policy.observe(ctx, make_outcome([3], [3], klds=[[0.05, 0.04, 0.06]]))
    policy.observe(ctx, make_outcome([0], [0], klds=[[]]))  # a step verifying nothing keeps the mean
    policy.begin_step(ctx)
    assert policy.step_targets == {0: 8}
    klds = [0.1] + history + [0.05, 0.04, 0.06]
    assert scale_factor(0.05) * wvir(klds[-30:]) < 0.2
    decayed, _ = weighted_mean_var(klds[-10:], 0.85)
    assert predicted_length(klds[-30:], decayed, 8.0, DsdeParams()) == 6
