"""DSpark prefix scheduler (sync Alg. 1 and the production form) and STS calibration."""

from __future__ import annotations

import numpy as np
import pytest

from autospec.errors import InputError
from autospec.policies import build_verify
from autospec.policies.dspark import (
    DsparkAsyncVerifier,
    DsparkVerifier,
    admit_top,
    global_argmax_budget,
    schedule_sync,
    table_sps,
)
from autospec.policies.sts import StsCalibration, ece, fit_sts, sigmoid, survival

from policy_helpers import make_ctx, make_drafts

APPENDIX = {"sps_tokens": [1, 2, 3], "sps_values": [1.0, 0.5, 0.45]}


def test_appendix_a_returns_zero():
    # R = 1: Θ_best = 1·SPS(1) = 1.0; admitting a₁ = 0.8 gives 1.8·0.5 = 0.9 → stop, ℓ = 0
    assert DsparkVerifier(**APPENDIX).select(make_ctx(1), make_drafts([[0.8]])) == [0]


def test_early_stop_is_what_differs_from_global_argmax():
    sps = table_sps([1, 2, 3], [1.0, 0.5, 0.45])
    surv = [[0.8, 0.72]]
    # Θ(1) = 0.9 < 1.0 stops Alg. 1, although Θ(2) = (1.8 + 0.72)·0.45 = 1.134 is the global max
    assert schedule_sync(surv, sps) == [0]
    assert global_argmax_budget(surv, sps) == 2
    assert admit_top(surv, 2) == [2]


def _first_token_distribution(policy) -> tuple[float, float]:
    """Exact distribution of the first committed token over vocabulary {A, B} (App. A):
    p_target = (0.7, 0.3), p_draft = (0.5, 0.5); the draft's second-token confidence depends on the
    first token (0.9 after A, 0.1 after B); rejection sampling with residual resampling."""
    p_t, p_d = np.array([0.7, 0.3]), np.array([0.5, 0.5])
    residual = np.maximum(p_t - p_d, 0.0)
    residual /= residual.sum()
    dist = np.zeros(2)
    for x, second_conf in ((0, 0.9), (1, 0.1)):
        length = policy.select(make_ctx(1), make_drafts([[0.8, second_conf]]))[0]
        if length == 0:
            dist += p_d[x] * p_t  # nothing verified: the target samples the token itself
        else:
            accept = min(1.0, p_t[x] / p_d[x])
            dist[x] += p_d[x] * accept
            dist += p_d[x] * (1.0 - accept) * residual
    return tuple(dist)


def test_sync_form_is_lossless_and_global_argmax_is_not():
    assert _first_token_distribution(DsparkVerifier(**APPENDIX)) == pytest.approx((0.7, 0.3))
    no_early_stop = DsparkAsyncVerifier(lag=0, **APPENDIX)
    assert _first_token_distribution(no_early_stop) == pytest.approx((0.85, 0.15))


def test_sync_admits_by_survival_across_requests():
    # every extra verification token costs 0.1 steps per second
    sps = table_sps([1, 2, 3, 4, 5, 6], [1.0, 0.9, 0.8, 0.7, 0.6, 0.5])
    # R = 2, Θ0 = 2·0.9 = 1.8; E = (0.9, r0 j1), (0.6, r1 j1), (0.45, r0 j2), (0.18, r1 j2)
    # B=3: 2.9·0.8 = 2.32; B=4: 3.5·0.7 = 2.45; B=5: 3.95·0.6 = 2.37 → stop
    assert schedule_sync([[0.9, 0.45], [0.6, 0.18]], sps) == [1, 1]


def test_table_sps_interpolates_and_saturates():
    sps = table_sps([1, 2, 4], [1.0, 0.5, 0.3])
    assert sps(3) == pytest.approx(0.4)
    assert sps(8) == pytest.approx(0.15)  # past the table tokens/s stay flat: 0.3·4/8


def test_sps_from_latency_model(simple_model):
    # two draft passes 0.02 s; SPS(B) = 1/(0.02 + 0.05 + 0.01·B): Θ = 12.5, 21.1, 27.1 → verify both
    assert DsparkVerifier().select(make_ctx(1, model=simple_model), make_drafts([[0.9, 0.9]])) == [2]
    with pytest.raises(InputError, match="SPS table"):
        DsparkVerifier().select(make_ctx(1), make_drafts([[0.9]]))


def test_async_budget_uses_stale_confidences():
    table = {"sps_tokens": [1, 2, 3, 4, 5], "sps_values": [1.0, 0.9, 0.8, 0.7, 0.6]}
    policy = DsparkAsyncVerifier(lag=2, **table)
    confident, poor = [[0.95] * 4], [[0.3] * 4]
    ctx = make_ctx(1)
    # confident chains: Θ peaks at 4 tokens (4.524·0.6 = 2.71); poor ones at 1 (1.3·0.9 = 1.17)
    answers = [policy.select(ctx, make_drafts(c)) for c in (confident, confident, poor, poor, poor)]
    assert answers == [[4], [4], [4], [4], [1]]
    assert DsparkVerifier(**table).select(ctx, make_drafts(poor)) == [1]


def test_sts_temperatures_change_survival():
    cal = StsCalibration(temperatures=[2.0], ece_before=0.0, ece_after=0.0)
    # σ(logit(0.8)/2) = σ(ln 2) = 2/3; σ(logit(0.5)/2) = 0.5
    assert cal.calibrate([0.8, 0.5]) == pytest.approx([2 / 3, 0.5])
    assert survival(np.array([[0.8, 0.5]]), [])[0] == pytest.approx([0.8, 0.4])
    assert DsparkVerifier(temperatures=[2.0], **APPENDIX).select(make_ctx(1), make_drafts([[0.8]])) == [0]


def test_bad_sps_table_is_input_error():
    with pytest.raises(InputError, match="same length"):
        build_verify("dspark", sps_tokens=[1, 2], sps_values=[1.0])


def test_ece_hand_worked():
    probs, labels = [0.1, 0.15, 0.9, 0.95], [0, 0, 1, 0]
    assert ece(probs, labels, bins=20) == pytest.approx((0.1 + 0.15 + 0.1 + 0.95) / 4)
    # two bins: |0 − 0.125|·2 + |0.5 − 0.925|·2 over 4
    assert ece(probs, labels, bins=2) == pytest.approx(0.275)


def _overconfident_chains(n: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """True per-token acceptance q; the draft reports σ(2·logit(q)) (over-confident)."""
    rng = np.random.default_rng(seed)
    q = rng.uniform(0.2, 0.95, (n, k))
    reported = sigmoid(2.0 * np.log(q / (1 - q)))
    ok = rng.random((n, k)) < q
    accepted = np.where(ok.all(axis=1), k, np.argmin(ok, axis=1))
    lengths = rng.integers(1, k + 1, n)  # chains of different lengths: NaN past the end
    reported[np.arange(k)[None, :] >= lengths[:, None]] = np.nan
    return reported, np.minimum(accepted, lengths)


def test_sts_reduces_ece_on_overconfident_drafts():
    conf, acc = _overconfident_chains(20000, 4, seed=0)
    cal = fit_sts(conf, acc, seed=0)
    assert cal.ece_before > 0.05
    assert cal.ece_after < 0.3 * cal.ece_before
    assert 1.6 <= cal.temperatures[0] <= 2.5  # the over-confidence factor is 2
    assert len(cal.ece_after_by_position) == 4
