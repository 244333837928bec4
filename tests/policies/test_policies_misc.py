"""Static / no-SD, SmartSpec, AdaEDL, oracle, FASER early-exit rules, and the registries."""

from __future__ import annotations

import numpy as np
import pytest

from autospec.early_exit import (
    EarlyExitParams,
    expected_rejections,
    rank_flag,
    rank_threshold,
    ratio_times,
    should_prune,
    start_layer,
    time_saved,
)
from autospec.errors import InputError
from autospec.latency import LinearCoeffs, LinearLatencyModel
from autospec.policies import (
    LENGTH_POLICIES,
    SCHEDULE_POLICIES,
    VERIFY_POLICIES,
    LengthPolicy,
    SchedulePolicy,
    VerifyPolicy,
    build_length,
    build_schedule,
    build_verify,
)
from autospec.policies.adaedl import AdaEdlLength, acceptance_bound
from autospec.policies.smartspec import SmartSpecLength, expected_tokens

from policy_helpers import make_ctx, make_drafts, make_outcome


def _drafted_lengths(policy, ctx, entropies=None, max_steps=20):
    drafts = make_drafts([[] for _ in ctx.requests])
    policy.begin_step(ctx)
    for _ in range(max_steps):
        more = policy.keep_drafting(ctx, drafts)
        if not any(more):
            break
        for i, m in enumerate(more):
            if m:
                drafts.confidences[i].append(0.9)
                drafts.tokens[i].append(0)
                drafts.entropies[i].append(entropies[i][len(drafts.entropies[i])] if entropies else 0.0)
    return drafts.lengths()


def test_static_and_no_sd():
    ctx = make_ctx(3, k_max=5)
    assert _drafted_lengths(build_length("static", k=3), ctx) == [3, 3, 3]
    assert _drafted_lengths(build_length("static", k=7), ctx) == [5, 5, 5]  # clipped to K_max
    assert _drafted_lengths(build_length("static", k=0), ctx) == [0, 0, 0]
    assert _drafted_lengths(build_length("none"), ctx) == [0, 0, 0]


def test_smartspec_argmax_hand_worked():
    # b = 1, α = 0.7: draft pass 10 ms; target 50 ms + 5 ms per token
    # goodput(k) = (1 − 0.7^(k+1))/0.3 / (0.01k + 0.05 + 0.005(k+1)):
    #   k=0 18.18, k=1 24.29, k=2 25.76, k=3 25.33 → k* = 2
    model = LinearLatencyModel(draft=LinearCoeffs(0, 0, 0.01), target=LinearCoeffs(0, 0.005, 0.05))
    policy = SmartSpecLength()
    assert policy.best_k(make_ctx(1, model=model)) == 2
    assert expected_tokens(0.7, 2, 1) == pytest.approx(2.19)
    assert expected_tokens(1.0, 2, 3) == 9.0


def test_smartspec_running_acceptance_and_reset():
    policy = SmartSpecLength()
    ctx = make_ctx(2)
    policy.observe(ctx, make_outcome([4, 4], [4, 2]))  # 0.5·0.75 + 0.5·0.7
    assert policy.alpha == pytest.approx(0.725)
    policy.observe(ctx, make_outcome([4, 4], [0, 0]))  # 0.3625
    policy.observe(ctx, make_outcome([4, 4], [0, 0]))  # 0.18125 < 0.3 → reset
    assert policy.alpha == pytest.approx(0.65)


def test_adaedl_bound_and_lambda_update():
    assert acceptance_bound(1.25) == pytest.approx(0.5)
    policy = AdaEdlLength()
    ctx = make_ctx(2)
    policy.observe(ctx, make_outcome([4, 4], [2, 0]))
    # AR = 0.5·0.9 + 0.5·2/8 = 0.575 < 0.9 → λ' = 0.51; λ = 0.9·0.5 + 0.1·0.51
    assert (policy.ar, policy.lam) == pytest.approx((0.575, 0.501))
    # AR = 0.5·0.575 + 0.5·1 = 0.7875 < 0.9 → λ' = 0.511; λ = 0.9·0.501 + 0.1·0.511
    policy.observe(ctx, make_outcome([4, 4], [4, 4]))
    assert (policy.ar, policy.lam) == pytest.approx((0.7875, 0.502))
    policy.ar = 1.0
    policy.observe(ctx, make_outcome([4], [4]))  # AR 1.0 >= 0.9 → λ' = 0.492; λ = 0.4518 + 0.0492
    assert policy.lam == pytest.approx(0.501)


def test_adaedl_stops_each_request_on_its_entropy():
    policy = AdaEdlLength()  # λ = 0.5: stop once 1 − sqrt(0.2·H) < 0.5, i.e. H > 1.25
    ctx = make_ctx(2, k_max=6)
    entropies = [[0.1, 0.2, 2.0, 0.1, 0.1, 0.1], [0.1] * 6]
    assert _drafted_lengths(policy, ctx, entropies) == [3, 6]


def test_oracle_m_drafts_the_true_match_length():
    ctx = make_ctx(3, k_max=5, match_lens=[0, 3, 9])
    assert _drafted_lengths(build_length("oracle-m"), ctx) == [0, 3, 5]
    with pytest.raises(InputError, match="sim engine"):
        build_length("oracle-m").begin_step(make_ctx(1))


def _clock(fixed_draft_s: float, per_token_s: float = 1e-4, verify_s: float = 10e-3):
    """A step clock: one draft round costs `fixed_draft_s` + per_token_s per request in it; the verify pass
    `verify_s` + per_token_s per token."""
    def step_time_s(contexts, lengths):
        rounds = max(lengths, default=0)
        draft = sum(fixed_draft_s + per_token_s * sum(1 for k in lengths if k > j) for j in range(rounds))
        return draft + verify_s + per_token_s * (sum(lengths) + len(lengths))
    return step_time_s


def test_the_cost_aware_oracle_drafts_the_match_length_when_drafting_pays():
    ctx = make_ctx(3, k_max=5, match_lens=[0, 3, 9])
    ctx.step_clock = _clock(fixed_draft_s=1e-4)  # a draft round costs 1% of a verify pass
    assert _drafted_lengths(build_length("oracle"), ctx) == [0, 3, 5]


def test_the_cost_aware_oracle_drafts_less_where_a_round_does_not_pay():
    # One round costs 6 ms against a 10 ms verify: the first round (3 requests) gives 3 tokens, 6 tokens in
    # 16.9 ms beat 3 in 10.3 ms; a 2nd round (2 requests) gives 2 more for 6.4 ms, 8 in 23.3 ms, a lower
    # rate: the oracle stops at one round although two requests would accept more.
    ctx = make_ctx(3, k_max=5, match_lens=[1, 2, 5])
    ctx.step_clock = _clock(fixed_draft_s=6e-3)
    assert _drafted_lengths(build_length("oracle"), ctx) == [1, 1, 1]
    ctx.step_clock = _clock(fixed_draft_s=0.1)  # a round costs 10 verify passes: do not draft
    assert _drafted_lengths(build_length("oracle"), ctx) == [0, 0, 0]
    with pytest.raises(InputError, match="step clock"):
        build_length("oracle").begin_step(make_ctx(3, k_max=5, match_lens=[1, 2, 5]))


def test_faser_rank_threshold_is_linear_in_depth():
    # L = 32: L_init = 12; K falls from 64 at layer 12 to 10 at layer 31
    assert start_layer(32) == 12
    assert rank_threshold(12, 32) == 64 and rank_threshold(31, 32) == 10
    assert rank_threshold(21, 32) == round(64 - 54 * 9 / 19)  # 38.4 → 38
    with pytest.raises(ValueError):
        rank_threshold(5, 32)
    assert rank_threshold(3, 4, EarlyExitParams(k_start=20, k_end=20)) == 20


def test_faser_rank_test():
    logits = np.array([5.0, 1.0, 3.0, 4.0, 2.0])
    assert rank_flag(logits, token=4, k=3)  # 5, 3, 4 score above 2
    assert not rank_flag(logits, token=4, k=4)
    assert not rank_flag(logits, token=0, k=1)


def test_faser_prune_rule_eq5_10():
    assert expected_rejections([4, 2], [0.75, 0.5]) == pytest.approx(2.0)
    # L = 32, ℓ = 12, T_t = 40 ms, T_ee = 2 ms: ΔL = 1.6, L' = 18.4, T_save = 23 ms
    assert time_saved(32, 12, 0.040, 0.002) == pytest.approx(0.023)
    assert should_prune(32, 12, 0.040, 0.002, t_prune=0.010)
    assert not should_prune(32, 12, 0.040, 0.002, t_prune=0.030)
    assert time_saved(32, 31, 0.040, 0.002) == 0.0  # nothing left to save at the last layer
    assert time_saved(32, 12, 0.0, 0.002) == 0.0  # k̂_rej = 0: nothing expected to be rejected


def test_eq10_prices_the_saving_at_k_rej_not_the_whole_verify_pass():
    """FASER Eq. 6–10 evaluate T_save at k̂_rej: T_t is the target's time for the tokens expected to be
    rejected. 4 requests verify 4 drafts each (20 fed positions), L = 32, ℓ = 12, default cost ratios
    (check 5%, pruning 1% of a pass)."""
    params = EarlyExitParams()
    # confident batch (â = 0.95): k̂_rej = 16·0.05 = 0.8 → T_t = 0.8/20 = 0.04 of a pass,
    # ΔL = 32·0.05/0.04 = 40 layers of checking > the 20 left → T_save = 0: do not prune.
    k_rej = expected_rejections([4] * 4, [0.95] * 4)
    t_t, t_ee, t_pr = ratio_times(params, 20, k_rej)
    assert (t_t, t_ee, t_pr) == pytest.approx((0.04, 0.05, 0.01))
    assert not should_prune(32, 12, t_t, t_ee, t_pr)
    # pricing the whole verify pass (T_t = 1) says the opposite: T_save = 18.4/32 = 0.575 > 0.01
    assert should_prune(32, 12, 1.0, t_ee, t_pr)
    # a doubtful batch (â = 0.3): k̂_rej = 11.2 → T_t = 0.56, ΔL = 2.857, T_save = 17.14/32·0.56 = 0.3
    t_t, t_ee, t_pr = ratio_times(params, 20, expected_rejections([4] * 4, [0.3] * 4))
    assert time_saved(32, 12, t_t, t_ee) == pytest.approx((32 - 12 - 32 * 0.05 / 0.56) / 32 * 0.56)
    assert should_prune(32, 12, t_t, t_ee, t_pr)


def test_fitted_eq10_times_evaluate_the_target_at_k_rej():
    """With fitted FASER models T_t is T_p(b, r, k̂_rej) (b·s = k̂_rej, like T_pr), not the full pass:
    here the full pass would make pruning pay and the k̂_rej tokens' time does not."""
    from autospec.latency import FaserModels, PiecewiseLatency

    one = ((1.0, 0.0), (1.0, 0.0))
    models = FaserModels(PiecewiseLatency("draft", (0.0, 1e-3, 1e-3), *one),
                         PiecewiseLatency("target", (1e-3, 1e-3, 1e-2), *one),  # α_p·b·s + λ_p·s + c_p
                         PiecewiseLatency("early_exit", (0.0, 4e-3), *one),  # T_ee = 4 ms
                         PiecewiseLatency("prune", (0.0, 6e-3), *one))  # T_pr = 6 ms
    t_t, t_ee, t_pr = models.early_exit_times(0.0)(4, 5, 2.0)
    # k̂_rej = 2 over b = 4: s = 0.5 → 1e-3·2 + 1e-3·0.5 + 1e-2
    assert (t_t, t_ee, t_pr) == pytest.approx((0.0125, 0.004, 0.006))
    full = float(models.target(4, 5, 0.0))  # the whole pass: 1e-3·20 + 5e-3 + 1e-2 = 0.035
    assert full == pytest.approx(0.035)
    # ℓ = 16 of 32: the whole pass saves (16 − 3.66)/32·0.035 = 13.5 ms > 6 ms; the k̂_rej tokens
    # save (16 − 10.24)/32·0.0125 = 2.25 ms < 6 ms
    assert should_prune(32, 16, full, t_ee, t_pr)
    assert not should_prune(32, 16, t_t, t_ee, t_pr)
    assert models.early_exit_times(0.0)(4, 5, 0.0)[0] == 0.0


def test_registries_build_protocol_objects():
    for name in LENGTH_POLICIES:
        assert isinstance(build_length(name), LengthPolicy)
    for name in VERIFY_POLICIES:
        assert isinstance(build_verify(name), VerifyPolicy)
    for name in SCHEDULE_POLICIES:
        assert isinstance(build_schedule(name), SchedulePolicy)
    assert {"static", "none", "adaspec", "threshold", "gp-lcb", "dsde", "smartspec", "adaedl",
            "oracle", "oracle-m"} <= set(LENGTH_POLICIES)
    assert {"all", "adaspec", "dspark", "dspark-async"} <= set(VERIFY_POLICIES)
    assert {"fcfs", "laps-sd", "las", "lp-sjf"} <= set(SCHEDULE_POLICIES)


def test_build_errors_name_the_field():
    with pytest.raises(InputError, match=r"\[length.policy\].*unknown length policy 'nope'"):
        build_length("nope")
    with pytest.raises(InputError, match=r"\[length.k\]"):
        build_length("static", k="4")
    with pytest.raises(InputError, match=r"\[length.bogus\]"):
        build_length("static", bogus=1)


def test_batch_schedule_picks_k_by_batch_bucket_and_validates():
    policy = build_length("batch-schedule", edges=[1, 3, 9], k=[5, 2, 0])
    assert _drafted_lengths(policy, make_ctx(1, k_max=8)) == [5]
    assert _drafted_lengths(policy, make_ctx(2, k_max=8)) == [5, 5]
    assert _drafted_lengths(policy, make_ctx(3, k_max=8)) == [2, 2, 2]
    assert _drafted_lengths(policy, make_ctx(9, k_max=8)) == [0] * 9
    assert _drafted_lengths(build_length("batch-schedule", edges=[1], k=[9]), make_ctx(2, k_max=4)) == [4, 4]
    assert policy.params.ranges(16) == [(1, 2, 5), (3, 8, 2), (9, 16, 0)]
    assert policy.params.ranges(4) == [(1, 2, 5), (3, 4, 2)]
    for bad in ({"edges": [2, 4], "k": [1, 1]}, {"edges": [1, 1], "k": [1, 1]}, {"edges": [1, 2], "k": [1]},
                {"edges": [1], "k": [-1]}):
        with pytest.raises(InputError):
            build_length("batch-schedule", **bad)
