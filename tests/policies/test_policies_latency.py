"""AdaSpec linear and FASER piecewise latency models against hand-worked numbers."""

from __future__ import annotations

import numpy as np
import pytest

from autospec.latency import (
    LinearCoeffs,
    LinearLatencyModel,
    PiecewiseLatency,
    faser_chunk_size,
    faser_eval,
    fit_linear,
    fit_piecewise,
    linear_features,
    mape,
    positions_context,
    sd_step_time,
)

MODEL = LinearLatencyModel(draft=LinearCoeffs(1e-6, 1e-4, 0.002), target=LinearCoeffs(2e-6, 5e-4, 0.02))


def test_linear_draft_time_counts_growing_context():
    # per pass 1e-6·1000 + 1e-4·4 + 0.002 = 0.0034; three passes + α·b·(0+1+2) = 1.2e-5
    assert MODEL.draft_time(4, 1000, 3) == pytest.approx(0.010212)
    assert MODEL.draft_time(4, 1000, 0) == 0.0


def test_linear_verify_and_sd_time():
    # Eq. 4: Σ_{i=1..4} N_c(i) = 4·1000 + 4·(0+1+2+3) = 4024 → 2e-6·4024 + 5e-4·(4·4) + 0.02
    assert MODEL.verify_time(4, 1000, 4) == pytest.approx(0.008048 + 0.008 + 0.02)
    assert MODEL.sd_time([3, 3, 3, 3], 1000) == pytest.approx(0.010212 + 0.036048)
    # ragged k: mean t = (4+2+1+3)/4 = 2.5 positions, Σ N_c(i) = 2.5·1000 + 4·2.5·1.5/2 = 2507.5,
    # N_b = 10 tokens; the draft runs max(k) = 3 passes
    assert sd_step_time(MODEL, [3, 1, 0, 2], 1000) == pytest.approx(0.010212 + 0.005015 + 0.005 + 0.02)
    # sunk draft passes are charged even when fewer tokens are verified (t = 2: Σ N_c(i) = 2004)
    assert MODEL.sd_time([1, 1, 1, 1], 1000, draft_steps=3) == pytest.approx(0.010212 + 0.004008 + 0.004 + 0.02)


def test_verify_time_sums_the_context_over_the_verified_positions_eq4():
    """AdaSpec Eq. 4: T_v = α_v·Σ_{i=1..t} N_c(i) + γ_v·b·t + δ_v, N_c(i) = N_c + b·(i − 1). Every
    extra verified position pays for the whole context again: the (t+1)-th costs α_v·(N_c + b·t) + γ_v·b,
    growing with positions × context (counting the context once per pass would make it γ_v·b)."""
    alpha, gamma = 1e-6, 1e-4
    model = LinearLatencyModel(draft=LinearCoeffs(0.0, 0.0, 0.0), target=LinearCoeffs(alpha, gamma, 0.01))
    for b, n_c in ((1, 500), (4, 2000), (8, 32000)):
        times = [model.verify_time(b, n_c, t) for t in range(1, 10)]
        assert times[0] == pytest.approx(alpha * n_c + gamma * b + 0.01)
        for t in range(1, 9):
            assert times[t] - times[t - 1] == pytest.approx(alpha * (n_c + b * t) + gamma * b)
        # t positions over N_c context: α_v·(t·N_c + b·t(t−1)/2)
        assert times[8] - 0.01 - gamma * b * 9 == pytest.approx(alpha * (9 * n_c + b * 36))
    assert positions_context(4, 2000, 3) == 3 * 2000 + 4 * 3
    assert positions_context(4, 2000, 0) == 0.0


def test_linear_features_are_what_eq3_and_eq4_price():
    # a draft pass (one position) is b·c; a verify pass over t positions b·(t·c + t(t−1)/2)
    nc, nb = linear_features(np.array([4.0, 4.0]), np.array([1.0, 5.0]), np.array([100.0, 100.0]))
    assert nc.tolist() == [400.0, 4 * (5 * 100 + 10)] and nb.tolist() == [4.0, 20.0]
    for b, t, c in ((1, 1, 37), (8, 9, 135), (4, 3, 389)):
        feat_c, feat_b = linear_features(b, t, c)
        assert float(MODEL.target.forward(feat_c, feat_b)) == pytest.approx(MODEL.verify_time(b, b * c, t))


def test_fit_fits_the_policies_model_on_eq4_and_keeps_the_clock_counting_context_once():
    """`autospec fit` on verify rows timed exactly as Eq. 4 says recovers (α, γ, δ) with zero error;
    the simulator's clock is fitted on the context counted once per pass (its own form)."""
    import pandas as pd

    from autospec.calibration import LATENCY_COLUMNS
    from autospec.fit import fit_latency

    true = {"draft": (3e-7, 7e-5, 1.2e-3), "target": (5e-7, 1.4e-4, 6e-3)}
    rows = []
    for model, (a, g, d) in true.items():
        for b in (1, 2, 4, 8):
            for c in (40, 130, 390):
                for t in (range(1, 10) if model == "target" else (1,)):
                    seconds = a * b * (t * c + t * (t - 1) / 2) + g * b * t + d
                    rows.append({"model": model, "phase": "decode", "batch": b, "tokens": t, "context": c,
                                 "sm_split": np.nan, "median_s": seconds, "mad_s": 0.0, "repeats": 5})
    lat = fit_latency(pd.DataFrame(rows, columns=LATENCY_COLUMNS))
    for model, (a, g, d) in true.items():
        co = lat["linear"][model]
        assert (co.alpha, co.gamma, co.delta) == pytest.approx((a, g, d), rel=1e-4)
        assert lat["linear_mape"][model] < 1e-4
    fitted = LinearLatencyModel(lat["linear"]["draft"], lat["linear"]["target"])
    assert fitted.verify_time(8, 8 * 390, 9) == pytest.approx(
        true["target"][0] * 8 * (9 * 390 + 36) + true["target"][1] * 72 + true["target"][2], rel=1e-4)
    # the clock counts the context once: it cannot fit Eq. 4's data exactly
    assert lat["clock_mape"]["target"] > 1e-3


def test_fit_linear_recovers_coefficients():
    rng = np.random.default_rng(0)
    n_c = rng.uniform(0, 5000, 40)
    n_b = rng.integers(1, 64, 40)
    t = 3e-6 * n_c + 4e-4 * n_b + 0.015
    c = fit_linear(np.column_stack([n_c, n_b, t]))
    assert (c.alpha, c.gamma, c.delta) == pytest.approx((3e-6, 4e-4, 0.015), rel=1e-6)
    round_trip = LinearLatencyModel.from_dict(LinearLatencyModel(c, c).to_dict())
    assert round_trip.draft == c


def test_fit_linear_rejects_bad_shape():
    with pytest.raises(ValueError):
        fit_linear([[1.0, 2.0]])


DRAFT = PiecewiseLatency("draft", load=(0.002, 0.001, 0.005), seg1=(1.0, 1.5), seg2=(0.7, 0.3), knee=0.4)


def test_faser_eval_hand_worked():
    # load = 0.002·4 + 0.001·2 + 0.005 = 0.015; r = 0.25 < knee: (1 − 1.5·0.25)·0.015
    assert float(DRAFT(4, 2, 0.25)) == pytest.approx(0.009375)
    assert float(DRAFT(4, 2, 0.5)) == pytest.approx(0.55 * 0.015)
    # the target's x is 1 − r: r = 0.75 → x = 0.25 lands in the first segment
    target = PiecewiseLatency("target", load=(0.001, 0.002, 0.01), seg1=(1.0, 1.0), seg2=(0.5, 0.0), knee=0.5)
    # load = 0.001·4·2 + 0.002·2 + 0.01 = 0.022
    assert float(faser_eval(target, 4, 2, 0.75)) == pytest.approx(0.75 * 0.022)
    assert float(faser_eval(target, 4, 2, 0.25)) == pytest.approx(0.5 * 0.022)


def _grid():
    b, s, r = np.meshgrid([1, 2, 4, 8], [1, 2, 4, 8], [0.2, 0.3, 0.4, 0.5, 0.6, 0.7], indexing="ij")
    return b.ravel().astype(float), s.ravel().astype(float), r.ravel()


def test_fit_piecewise_finds_knee_and_fits_held_out():
    b, s, r = _grid()
    t = DRAFT(b, s, r) * np.random.default_rng(1).normal(1.0, 0.02, b.size)
    train = np.arange(b.size) % 4 != 0
    model, train_mape = fit_piecewise("draft", b[train], s[train], r[train], t[train])
    assert model.knee == pytest.approx(0.4)
    assert train_mape < 0.03
    assert mape(model(b[~train], s[~train], r[~train]), t[~train]) < 0.04
    assert PiecewiseLatency.from_dict(model.to_dict()) == model


def test_fit_piecewise_single_r_is_one_linear_segment():
    b, s, _ = _grid()
    t = 0.001 * b + 0.002 * s + 0.004
    model, err = fit_piecewise("draft", b, s, np.full_like(b, 0.5), t)
    assert model.knee is None and model.seg1 == (1.0, 0.0)
    assert err < 1e-9
    assert model.load == pytest.approx((0.001, 0.002, 0.004))


def test_faser_chunk_size():
    t_q = PiecewiseLatency("draft", load=(0.0, 0.002, 0.001), seg1=(1.0, 0.0), seg2=(1.0, 0.0))
    t_p = PiecewiseLatency("target", load=(0.0, 0.001, 0.01), seg1=(1.0, 0.0), seg2=(1.0, 0.0))
    # s_c = 8: 0.017 + 0.018 = 0.035; s_c = 7: 0.015 + (8/7)·0.017 = 0.034429
    assert faser_chunk_size(8, 1, 0.5, t_q, t_p, t_hat=0.045) == 8
    assert faser_chunk_size(8, 1, 0.5, t_q, t_p, t_hat=0.0345) == 7
    assert faser_chunk_size(8, 1, 0.5, t_q, t_p, t_hat=0.03) is None
