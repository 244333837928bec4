"""GP-LCB drafter (FASER §4.1): β_n, the GP posterior, LCB selection, refinement, and convergence."""

from __future__ import annotations

import numpy as np
import pytest

from autospec.policies.gp_lcb import GpLcbLength, batch_bucket, beta_n, per_request_gain, per_request_gains

from policy_helpers import make_ctx, make_outcome


def test_beta_n_hand_worked():
    # 2·ln(8·π²/(6·0.1)) and 2·ln(8·9·π²/0.6)
    assert beta_n(1, 8) == pytest.approx(9.759453874)
    assert beta_n(3, 8) == pytest.approx(14.153903029)


def test_batch_buckets_are_powers_of_two():
    assert [batch_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 33)] == [1, 2, 4, 4, 8, 8, 16, 64]


def test_posterior_one_observation():
    gp = GpLcbLength()
    gp.record((4, None), 1, 2.5)
    mu, sd = gp.posterior((4, None), np.arange(1, 9))
    # one point: the window mean is the prediction everywhere; σ(1)² = 1 − 1/(1 + 0.05)
    assert mu == pytest.approx([2.5] * 8)
    assert sd[0] == pytest.approx(0.2182178902)
    # LCB picks the point farthest from the observation
    assert gp.select((4, None), 8)[0] == 8


def test_posterior_two_observations_and_lcb_selection():
    gp = GpLcbLength()
    gp.record((4, None), 2, 1.0)
    gp.record((4, None), 6, 3.0)
    mu, sd = gp.posterior((4, None), np.array([1, 2, 4, 8]))
    # standardized y = (−1, +1); Matérn-5/2 k(4) = 0.138660; noise 0.05 (numbers worked by hand)
    assert mu == pytest.approx([1.160424088, 1.054864279, 2.0, 2.544550669])
    assert sd == pytest.approx([0.586510764, 0.218121042, 0.733497088, 0.858392498])
    # n = 3: sqrt(β_3) = 3.7622; LCB(1) = −1.046 is the smallest over 1..8
    assert gp.select((4, None), 8) == (1, pytest.approx(1.160424088))


def test_window_is_sliding():
    gp = GpLcbLength(window=3)
    for s in range(1, 6):
        gp.record((1, None), s, float(s))
    assert gp.observations((1, None)) == [(3, 3.0), (4, 4.0), (5, 5.0)]


def test_observe_records_cost_per_accepted_token():
    gp = GpLcbLength()
    ctx = make_ctx(2)
    gp.begin_step(ctx)
    s_n = gp.step_targets[0]
    accepted = [s_n, 0]
    gp.observe(ctx, make_outcome([s_n, s_n], accepted, draft_time=0.02, verify_time=0.06))
    # J = 0.08 / (s_n · (s_n / (2·s_n)) + ε) = 0.08 / (s_n/2)
    (s, cost), = gp.observations((2, None))
    assert s == s_n and cost == pytest.approx(0.16 / s_n, rel=1e-4)


def test_per_request_refinement(simple_model):
    assert per_request_gain(0.5, 3) == pytest.approx(0.875)
    p = np.array([0.0, 0.3, 0.9, 1.0])
    gains = per_request_gains(p, [2, 3, 4])  # one column per length, from one pass of partial sums
    assert gains.T.tolist() == [per_request_gain(p, s).tolist() for s in (2, 3, 4)]
    assert gains[:, 2] == pytest.approx([0.0, 0.3 + 0.09 + 0.027 + 0.0081, 0.9 + 0.81 + 0.729 + 0.6561, 4.0])
    gp = GpLcbLength()
    ctx = make_ctx(2, model=simple_model)
    # teach request 0 a perfect acceptance and request 1 a poor one
    gp.observe(ctx, make_outcome([4, 4], [4, 0]))
    for _ in range(4):
        for s in range(1, 9):
            gp.record((2, None), s, 1.0 + 0.5 * (s - 4) ** 2)
    gp.begin_step(ctx)
    s_n = gp._last[1]
    assert s_n == 4
    # T̂(s) = 0.01s + 0.05 + 0.02(s+1): p = 1 → cost falls with s → s_n + 1; p = 0 → s_n − 1
    assert gp.step_targets == {0: 5, 1: 3}


def test_sm_pool_picks_the_split_with_lowest_posterior_mean():
    gp = GpLcbLength(sm_pool=[0.3, 0.5])
    assert gp.chooses_sm_split and not GpLcbLength().chooses_sm_split
    for s in range(1, 9):
        gp.record((1, 0.3), s, 2.0)
        gp.record((1, 0.5), s, 1.0)
    gp.begin_step(make_ctx(1))
    assert gp.step_sm_split() == 0.5  # what the serving step has the engine apply
    assert GpLcbLength().step_sm_split() is None  # no pool: nothing chosen, the configured split stands


def test_the_cost_is_recorded_under_the_split_the_engine_applied():
    gp = GpLcbLength(sm_pool=[0.3, 0.5], refine=False)
    for s in range(1, 9):
        gp.record((1, 0.3), s, 2.0)
        gp.record((1, 0.5), s, 1.0)
    ctx = make_ctx(1)
    gp.begin_step(ctx)
    s_n = gp.step_targets[0]
    gp.sm_split_applied(0.3)  # an engine that ran the step at another split than the one chosen
    gp.observe(ctx, make_outcome([s_n], [s_n], verify_time=0.5))
    assert len(gp.observations((1, 0.3))) == 9 and len(gp.observations((1, 0.5))) == 8
    assert gp.observations((1, 0.3))[-1] == (s_n, pytest.approx(0.5 / s_n))


def test_refinement_uses_the_observed_step_time_of_its_context():
    """Eq. 2's T̂(s; b, r) is the context's observed step time: with two distinct s observed the
    refinement runs without any latency model, and it reads only its own split's times."""
    gp = GpLcbLength(sm_pool=[0.5])
    ctx = make_ctx(2)  # no latency model
    gp.observe(ctx, make_outcome([4, 4], [4, 0]))  # request 0 accepts everything, request 1 nothing
    for _ in range(4):
        for s in range(1, 9):
            gp.record((2, 0.5), s, 1.0 + 0.5 * (s - 4) ** 2)
    gp.begin_step(ctx)
    assert gp.step_targets == {0: 4, 1: 4}  # no observed times, no model: everyone drafts s_n
    assert gp.observed_step_time((2, 0.5), [3, 4, 5]) is None
    gp.record_time((2, 0.5), 2, 0.30)
    gp.record_time((2, 0.5), 6, 0.50)  # T̂(s) = 0.2 + 0.05·s
    gp.record_time((2, 0.25), 2, 9.0)  # another split's times are not this context's
    assert gp.observed_step_time((2, 0.5), [3, 4, 5]) == pytest.approx([0.35, 0.40, 0.45])
    gp.begin_step(ctx)
    # p = 1: cost T̂(s)/s falls with s → s_n + 1; p = 0: T̂ grows with s → s_n − 1
    assert gp.step_targets == {0: 5, 1: 3}
    # a time that falls with s is noise: the slope is clamped at 0 (T̂ = the window's mean)
    gp.record_time((4, 0.5), 1, 0.5)
    gp.record_time((4, 0.5), 3, 0.3)
    assert gp.observed_step_time((4, 0.5), [1, 2]) == pytest.approx([0.4, 0.4])


def _true_cost(s: int) -> float:
    return 1.0 + 0.08 * (s - 4) ** 2  # argmin 4; neighbours 8% worse


def _converges(seed: int, steps: int = 50) -> bool:
    rng = np.random.default_rng(seed)
    gp = GpLcbLength(refine=False)
    ctx = make_ctx(4)
    for _ in range(steps):
        gp.begin_step(ctx)
        s = gp.step_targets[0]
        noisy = _true_cost(s) * (1.0 + rng.normal(0.0, 0.03))
        # every draft accepted: J̃ = T / s, so a step time of noisy·s reports cost `noisy`
        gp.observe(ctx, make_outcome([s] * 4, [s] * 4, verify_time=noisy * s))
    mu, _ = gp.posterior((4, None), np.arange(1, 9))
    return int(np.argmin(mu)) + 1 == 4


def test_finds_argmin_of_noisy_cost_within_50_observations():
    found = sum(_converges(seed) for seed in range(10))
    assert found >= 9, found


@pytest.mark.parametrize("recorded", [64, 203])
def test_posterior_over_repeated_draft_lengths_is_the_full_window_regression(recorded):
    """The posterior groups the window's observations by s (n at one s ≡ their mean with noise σ²/n):
    it must give what exact GP regression on all W points gives — scikit-learn's GaussianProcessRegressor
    with the same fixed kernel and noise on the standardized window — at integer and non-integer s, on a
    full window and on one that has slid past 139 older observations."""
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import ConstantKernel, Matern

    rng = np.random.default_rng(5)
    gp = GpLcbLength(window=64)
    drafted = rng.choice([1, 2, 2, 3, 5, 8], size=recorded)
    costs = 0.02 + 0.004 * drafted + rng.normal(0, 0.003, recorded)
    for s, j in zip(drafted, costs):
        gp.record((8, None), int(s), float(j))
    drafted, costs = drafted[-64:], costs[-64:]
    assert gp.observations((8, None)) == [(int(s), float(j)) for s, j in zip(drafted, costs)]
    p = gp.params
    kernel = ConstantKernel(p.signal_variance, "fixed") * Matern(p.lengthscale, "fixed", nu=2.5)
    full = GaussianProcessRegressor(kernel, alpha=p.noise_variance, optimizer=None, normalize_y=False)
    mean, sd = costs.mean(), costs.std()
    full.fit(drafted[:, None].astype(float), (costs - mean) / sd)
    for query in (np.arange(1, 9), np.array([1.5, 4.25, 7.0])):
        mu, std = gp.posterior((8, None), query)
        want_mu, want_std = full.predict(query[:, None].astype(float), return_std=True)
        assert mu == pytest.approx(mean + sd * want_mu, rel=1e-9, abs=1e-12)
        assert std == pytest.approx(sd * want_std, rel=1e-7, abs=1e-12)


def test_observed_step_time_is_the_least_squares_line_clamped_at_a_flat_slope():
    gp = GpLcbLength()
    rng = np.random.default_rng(2)
    drafted = rng.integers(1, 9, 40)
    times = 0.01 + 0.002 * drafted + rng.normal(0, 0.001, 40)
    for s, t in zip(drafted, times):
        gp.record_time((2, None), int(s), float(t))
    slope, intercept = np.polyfit(drafted.astype(float), times, 1)
    assert gp.observed_step_time((2, None), [1, 4, 8]) == pytest.approx(intercept + slope * np.array([1, 4, 8]))
    falling = GpLcbLength()
    for s, t in ((1, 0.03), (2, 0.02), (3, 0.01)):
        falling.record_time((2, None), s, t)
    assert falling.observed_step_time((2, None), [1, 3]) == pytest.approx([0.02, 0.02])  # the window's mean
