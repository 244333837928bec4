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
    mape,
    sd_step_time,
)

MODEL = LinearLatencyModel(draft=LinearCoeffs(1e-6, 1e-4, 0.002), target=LinearCoeffs(2e-6, 5e-4, 0.02))


def test_linear_draft_time_counts_growing_context():
    # per pass 1e-6·1000 + 1e-4·4 + 0.002 = 0.0034; three passes + α·b·(0+1+2) = 1.2e-5
    assert MODEL.draft_time(4, 1000, 3) == pytest.approx(0.010212)
    assert MODEL.draft_time(4, 1000, 0) == 0.0


def test_linear_verify_and_sd_time():
    # 2e-6·1000 + 5e-4·(4·4) + 0.02
    assert MODEL.verify_time(4, 1000, 4) == pytest.approx(0.030)
    assert MODEL.sd_time([3, 3, 3, 3], 1000) == pytest.approx(0.040212)
    # ragged k: verify N_b = 4+2+1+3 = 10 tokens, draft runs max(k) = 3 passes
    assert sd_step_time(MODEL, [3, 1, 0, 2], 1000) == pytest.approx(0.010212 + 0.027)
    # sunk draft passes are charged even when fewer tokens are verified
    assert MODEL.sd_time([1, 1, 1, 1], 1000, draft_steps=3) == pytest.approx(0.010212 + 0.002 + 0.004 + 0.02)


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
