"""AdaSpec goodput, drafter (Alg. 1) and verifier (Alg. 2); the threshold baseline."""

from __future__ import annotations

import numpy as np
import pytest

from autospec.contract import DraftState
from autospec.errors import InputError
from autospec.latency import LinearCoeffs, LinearLatencyModel, sd_step_time
from autospec.policies import build_length, build_verify
from autospec.policies.adaspec import AdaSpecDrafter, AdaSpecVerifier, cumulative_acceptance, goodput
from autospec.policies.base import batch_context_tokens
from autospec.policies.threshold import ThresholdLength

from policy_helpers import make_ctx, make_drafts


def test_cumulative_acceptance():
    assert cumulative_acceptance([0.9, 0.5, 0.5]) == pytest.approx([0.9, 0.45, 0.225])


def test_goodput_hand_worked_and_slo():
    ars = [[0.8, 0.4], [0.5]]
    # (1 + 0.8 + 0.4) + (1 + 0.5) tokens over 0.1 s
    assert goodput(ars, [2, 1], 0.1) == pytest.approx(37.0)
    assert goodput(ars, [0, 0], 0.1) == pytest.approx(20.0)
    assert goodput(ars, [2, 1], 0.1, slo_tpot_s=0.05) == -1.0
    assert goodput(ars, [2, 1], 0.1, slo_tpot_s=0.1) == pytest.approx(37.0)


def _run_drafter(policy, ctx, confidences_per_step):
    """Drive keep_drafting like the loop; returns the answers and the final drafts."""
    drafts = DraftState.empty(ctx.req_ids)
    policy.begin_step(ctx)
    answers = []
    for step_confs in confidences_per_step:
        more = policy.keep_drafting(ctx, drafts)
        answers.append(more)
        if not any(more):
            return answers, drafts
        for rid, c in zip(ctx.req_ids, step_confs):
            drafts.confidences[rid].append(c)
            drafts.tokens[rid].append(0)
            drafts.entropies[rid].append(0.0)
    answers.append(policy.keep_drafting(ctx, drafts))
    return answers, drafts


def test_drafter_predict_execute_correct_hand_worked(simple_model):
    # b = 2: T_sd(k) = 0.01·k + 0.05 + 0.01·2·(k+1) = 0.07 + 0.03·k; G(0) = 2/0.07 = 28.57
    # predict k=1 at c̄=0.6: 3.2/0.10 = 32 → draft; real (0.9, 0.7): 3.6/0.10 = 36 → keep going, c̄ = 0.8
    # predict k=2 at c̄=0.8: (3.6 + 0.72 + 0.56)/0.13 = 37.5 → draft; real (0.5, 0.2):
    # (3.6 + 0.45 + 0.14)/0.13 = 32.2 < 36 → stop, keeping the two tokens
    ctx = make_ctx(2, model=simple_model)
    policy = AdaSpecDrafter()
    answers, drafts = _run_drafter(policy, ctx, [[0.9, 0.7], [0.5, 0.2], [0.9, 0.9]])
    assert answers == [[True, True], [True, True], [False, False]]
    assert drafts.lengths() == [2, 2]
    assert policy.mean_confidence == pytest.approx((0.9 + 0.7 + 0.5 + 0.2) / 4)
    # once stopped it stays stopped for the step
    assert policy.keep_drafting(ctx, drafts) == [False, False]


def test_drafter_prediction_can_stop_before_drafting(simple_model):
    # c̄ = 0.2: G(1) predicted = 2·1.2/0.10 = 24 < G(0) = 28.6
    policy = AdaSpecDrafter(initial_confidence=0.2)
    answers, drafts = _run_drafter(policy, make_ctx(2, model=simple_model), [[0.9, 0.9]])
    assert answers == [[False, False]] and drafts.lengths() == [0, 0]


def test_drafter_respects_k_max_and_slo(simple_model):
    policy = AdaSpecDrafter()
    answers, drafts = _run_drafter(policy, make_ctx(2, k_max=2, model=simple_model), [[0.99, 0.99]] * 4)
    assert drafts.lengths() == [2, 2]
    # TPOT 0.09 s: T_sd(1) = 0.10 breaks it → G(1) = −1 < G(0): plain decoding
    answers, drafts = _run_drafter(AdaSpecDrafter(), make_ctx(2, model=simple_model, slo=0.09), [[0.99, 0.99]])
    assert drafts.lengths() == [0, 0]


def test_an_slo_even_no_sd_misses_is_a_finding_and_ties_keep_drafting(simple_model):
    # b = 2: T_sd(0) = 0.07 s > the 0.05 s SLO, so G = −1 at every k: Alg. 1 never sees G fall and drafts
    # to K_max; the run reports that the rule could not choose (and no refusal: it did draft)
    policy = AdaSpecDrafter()
    _, drafts = _run_drafter(policy, make_ctx(2, k_max=3, model=simple_model, slo=0.05), [[0.99, 0.99]] * 4)
    assert drafts.lengths() == [3, 3]
    (line,) = policy.findings()
    assert "could not choose in 100% of its steps (1 of 1)" in line and "TPOT SLO (50 ms)" in line
    # under an SLO a no-SD step meets, nothing of the kind
    policy = AdaSpecDrafter()
    _run_drafter(policy, make_ctx(2, model=simple_model, slo=0.09), [[0.99, 0.99]])
    assert policy.slo_unmeetable == 0 and all("could not choose" not in f for f in policy.findings())


def test_drafter_needs_latency_model():
    with pytest.raises(InputError, match="latency model"):
        AdaSpecDrafter().begin_step(make_ctx(2))


def test_verifier_removes_lowest_tails_while_goodput_rises(simple_model):
    # AR: A = (0.9, 0.45), B = (0.7, 0.14); the two draft passes (0.02 s) are sunk.
    # (2,2): 4.19/0.13 = 32.23 → drop B's 0.14 → (2,1): 4.05/0.12 = 33.75 (better)
    # → drop A's 0.45 → (1,1): 3.6/0.11 = 32.73 (worse): stop at (2,1)
    drafts = make_drafts([[0.9, 0.5], [0.7, 0.2]])
    assert AdaSpecVerifier().select(make_ctx(2, model=simple_model), drafts) == [2, 1]


def _alg2_by_definition(ctx, drafts) -> list[int]:
    """Alg. 2 as written: every trial re-evaluates G over the whole batch with `goodput`."""
    ks, ars = drafts.lengths(), [cumulative_acceptance(c) for c in drafts.confidences]
    n_c, steps = batch_context_tokens(ctx), max(ks)

    def g_of(lengths):
        return goodput(ars, lengths, sd_step_time(ctx.latency_model, lengths, n_c, steps), ctx.slo_tpot_s)

    g = g_of(ks)
    while any(ks):
        _, i = min((ars[i][k - 1], i) for i, k in enumerate(ks) if k > 0)
        trial = [k - (j == i) for j, k in enumerate(ks)]
        if g_of(trial) <= g:
            break
        ks, g = trial, g_of(trial)
    return ks


@pytest.mark.parametrize("seed", range(40))
def test_the_verifiers_incremental_goodput_chooses_what_alg2_by_definition_does(seed):
    """The verifier keeps G's numerator and Σ k_i up to date instead of re-evaluating G per trial; it
    must choose exactly the lengths the by-definition loop chooses, over batches, contexts, draft lengths
    (some zero), tied confidences and SLOs that do and do not bind."""
    rng = np.random.default_rng(seed)
    batch = int(rng.choice([1, 2, 5, 16, 64]))
    model = LinearLatencyModel(draft=LinearCoeffs(*rng.uniform([0, 1e-6, 1e-4], [1e-7, 4e-5, 0.004])),
                               target=LinearCoeffs(*rng.uniform([0, 1e-5, 5e-3], [1e-6, 8e-4, 0.05])))
    lengths = rng.integers(0, 9, batch)
    if seed % 3 == 0:  # ties: every request's confidences from {0.2, 0.5, 0.9}, constant along its drafts
        confs = [[float(rng.choice([0.2, 0.5, 0.9]))] * int(k) for k in lengths]
    else:
        confs = [[float(c) for c in rng.beta(4, 2, k)] for k in lengths]
    if not any(confs):
        confs[0] = [0.5]
    slo = [None, 0.01, 0.2][seed % 3]
    ctx = make_ctx(batch, model=model, slo=slo, context_len=int(rng.integers(10, 2000)))
    drafts = make_drafts(confs)
    assert AdaSpecVerifier().select(ctx, drafts) == _alg2_by_definition(ctx, drafts)


def test_the_verifier_breaks_ties_between_equal_tails_toward_the_first_request():
    """Two requests with the same confidences have equal tails; Alg. 2 removes one at a time, and with
    the verify cost convex in the positions (Eq. 4) only the first removal pays: the lower request index
    loses its tail, as `min` over (AR_ij, i) picks it."""
    model = LinearLatencyModel(draft=LinearCoeffs(0.0, 1e-5, 0.002), target=LinearCoeffs(1e-4, 1e-4, 0.03))
    ctx, drafts = make_ctx(3, model=model, context_len=10), make_drafts([[0.9, 0.2]] * 3)
    assert _alg2_by_definition(ctx, drafts) == AdaSpecVerifier().select(ctx, drafts) == [1, 1, 2]


def test_verifier_keeps_confident_drafts(simple_model):
    drafts = make_drafts([[0.99, 0.99], [0.99, 0.99]])
    assert build_verify("adaspec").select(make_ctx(2, model=simple_model), drafts) == [2, 2]


def _drafted_length(batch: int, model: LinearLatencyModel, conf: float = 0.8) -> int:
    ctx = make_ctx(batch, model=model, context_len=200)
    policy = build_length("adaspec")
    _, drafts = _run_drafter(policy, ctx, [[conf] * batch] * 8)
    return max(drafts.lengths())


def test_drafter_drafts_shorter_as_batch_grows():
    # Memory-bound target: a big fixed cost per pass, a small cost per token; draft passes are cheap.
    # As b grows the per-token verify cost of speculative tokens overtakes the fixed cost they amortise.
    model = LinearLatencyModel(draft=LinearCoeffs(1e-7, 2e-5, 0.002), target=LinearCoeffs(5e-7, 4e-4, 0.03))
    lengths = [_drafted_length(b, model) for b in (1, 4, 16, 64)]
    assert all(a >= b for a, b in zip(lengths, lengths[1:])), lengths
    assert lengths[0] >= 4 and lengths[0] - lengths[-1] >= 3, lengths


def test_each_verified_position_pays_for_the_context_so_long_contexts_draft_and_verify_less():
    """Eq. 4 prices every verified position at α_v·N_c(i): with drafting free of context (α_d = 0) the
    only thing context changes is what each extra verified token costs, so the drafter drafts fewer
    and the verifier keeps fewer as the context grows. (Counting the context once per verify pass
    makes it a fixed cost that extra tokens amortise: lengths would stay put or grow.)"""
    model = LinearLatencyModel(draft=LinearCoeffs(0.0, 1e-5, 0.002), target=LinearCoeffs(1e-6, 1e-4, 0.03))
    drafted, verified = [], []
    for context in (100, 1000, 4000, 8000):
        ctx = make_ctx(4, model=model, context_len=context)
        _, drafts = _run_drafter(build_length("adaspec"), ctx, [[0.8] * 4] * 8)
        drafted.append(max(drafts.lengths()))
        chosen = build_verify("adaspec").select(ctx, make_drafts([[0.9, 0.8, 0.7, 0.6, 0.5, 0.4]] * 4))
        verified.append(max(chosen))
    assert all(a > b for a, b in zip(drafted, drafted[1:])), drafted
    assert all(a > b for a, b in zip(verified, verified[1:])), verified
    assert drafted[0] >= 6 and verified[0] >= 5 and drafted[-1] <= 2 and verified[-1] <= 2, (drafted, verified)


def test_threshold_stops_on_low_batch_mean():
    policy = ThresholdLength()
    ctx = make_ctx(2)
    policy.begin_step(ctx)
    assert policy.keep_drafting(ctx, make_drafts([[], []])) == [True, True]
    assert policy.keep_drafting(ctx, make_drafts([[0.9], [0.4]])) == [True, True]  # mean 0.65
    assert policy.keep_drafting(ctx, make_drafts([[0.9, 0.7], [0.4, 0.4]])) == [False, False]  # 0.55
    assert policy.keep_drafting(ctx, make_drafts([[0.9, 0.7, 1.0], [0.4, 0.4, 1.0]])) == [False, False]


def test_threshold_caps_at_max_len():
    policy = ThresholdLength(max_len=2)
    ctx = make_ctx(1)
    policy.begin_step(ctx)
    assert policy.keep_drafting(ctx, make_drafts([[0.99]])) == [True]
    assert policy.keep_drafting(ctx, make_drafts([[0.99, 0.99]])) == [False]
