"""At T>0 a greedy proposal (the draft's argmax, a point mass) is accepted with p_t(x), not with a
sampled proposal's min(1, p_t(x)/p_d(x)) (docs/policies.md, "Greedy proposals"): the simulator replays
the rule the strategy asks for, and the torch engine accepts greedy proposals with the p_t(x) that the
profile records.

Tolerances: each acceptance is a Bernoulli draw with a known probability p_i given everything before it
(a fresh uniform per tested draft), so Σ(X_i − p_i) has mean 0 and variance Σ p_i(1 − p_i); the tests
allow 4 standard deviations (a false failure about once in 16,000 runs; the seeds are fixed, so a run
is reproducible) and check that the rule they reject lies far outside that band.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from autospec.calibration import ACCEPTANCE_COLUMNS
from autospec.engines.base import DraftSampling, GenRequest, offers
from autospec.engines.sim import AcceptanceTraces, SimCosts, SimEngine
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError
from autospec.latency import LinearCoeffs, LinearLatencyModel
from autospec.profile import trace_prompt
from autospec.serving.loop import serve
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.step import StepSettings
from autospec.strategy import build_strategy, spec_from_dict

K = 4


def _traces(target_probs, confidences) -> pd.DataFrame:
    """Traces of 8 prompts × 50 positions whose accept_probs are min(1, p_t/p_d), as the profile
    records them; `target_probs` and `confidences` are (400, K) arrays or scalars."""
    n, positions = 8, 50
    rows = n * positions
    tp = np.broadcast_to(np.asarray(target_probs, float), (rows, K))
    conf = np.broadcast_to(np.asarray(confidences, float), (rows, K))
    rng = np.random.default_rng(0)
    return pd.DataFrame({
        "prompt_id": np.repeat([f"p{i}" for i in range(n)], positions), "domain": "chat",
        "position": np.tile(np.arange(positions), n), "target_token": rng.integers(0, 100, rows),
        "match_len": rng.integers(0, K + 1, rows), "chain_tokens": list(rng.integers(100, 200, (rows, K))),
        "confidences": list(conf), "entropies": list(np.ones((rows, K))), "klds": list(np.ones((rows, K))),
        "target_probs": list(tp), "accept_probs": list(np.minimum(1.0, tp / conf))})[ACCEPTANCE_COLUMNS]


def _sim(frame: pd.DataFrame, seed: int = 1) -> SimEngine:
    costs = SimCosts(LinearLatencyModel(LinearCoeffs(0.0, 0.0, 1e-3), LinearCoeffs(0.0, 0.0, 1e-2)),
                     (0.0, 0.0), (0.0, 0.0))
    return SimEngine(AcceptanceTraces(frame, K), costs, temperature=1.0, seed=seed)


def _band(p: list[float]) -> float:
    """4 standard deviations of the mean of independent Bernoulli(p_i) draws."""
    return 4.0 * math.sqrt(sum(q * (1.0 - q) for q in p)) / len(p)


@pytest.mark.parametrize("mode", ["greedy", "sample"])
def test_the_simulator_accepts_each_draft_with_its_proposal_rules_recorded_probability(mode):
    """One draft per request per step on traces whose p_t(x) and min(1, p_t/p_d) differ per position:
    the acceptance rate is the mean recorded p_t(x) for greedy proposals, the mean min(1, p_t/p_d) for
    sampled ones."""
    rng = np.random.default_rng(7)
    tp, conf = rng.uniform(0.05, 0.6, (400, K)), rng.uniform(0.3, 0.9, (400, K))
    engine = _sim(_traces(tp, conf))
    assert offers(engine, DraftSampling)
    engine.set_draft_sampling(mode)
    ids = engine.add([GenRequest([1, 2, 3], 10_000, trace_id=i) for i in range(200)]).req_ids
    hits, p_greedy, p_sampled = [], [], []
    for _ in range(20):  # 4,000 draws
        drafts = engine.draft_rounds(ids, [1] * len(ids))
        out = engine.verify({rid: 1 for rid in ids})
        for d, probs, a in zip(drafts, out.target_probs, out.accepted):
            p_greedy.append(probs[0])  # the recorded p_t(x) of the verified draft
            p_sampled.append(min(1.0, probs[0] / d[0].confidence))
            hits.append(a)
    want, other = (p_greedy, p_sampled) if mode == "greedy" else (p_sampled, p_greedy)
    rate, band = float(np.mean(hits)), _band(want)
    assert rate == pytest.approx(np.mean(want), abs=band)
    assert abs(np.mean(other) - np.mean(want)) > 3 * band  # the test tells the two rules apart


def test_a_greedy_proposal_strategy_replays_at_the_mean_target_probability():
    """Through the serving loop at T=1: a strategy that says draft_sampling = "greedy" is replayed at
    p_t(x) = 0.3 per draft, the same strategy sampling its proposals at min(1, 0.3/0.5) = 0.6."""
    engine_rates = {}
    for mode in ("greedy", "sample"):
        engine = _sim(_traces(0.3, 0.5), seed=11)
        spec = spec_from_dict({"strategy": {"name": "s"}, "length": {"policy": "static", "k": 1},
                               "execution": {"draft_sampling": mode}})
        reqs = [ServeRequest(i, 0.0, SyntheticPrompt(10, 100, i), 200, "chat") for i in range(16)]
        steps = serve(engine, build_strategy(spec), reqs, max_batch=16,
                      settings=StepSettings(k_max=K, temperature=1.0)).steps_frame()
        verified = sum(map(sum, steps["l"]))
        engine_rates[mode] = (sum(map(sum, steps["accepted"])) / verified, verified)
    for mode, p in (("greedy", 0.3), ("sample", 0.6)):
        rate, n = engine_rates[mode]
        assert rate == pytest.approx(p, abs=4 * math.sqrt(p * (1 - p) / n)), mode


def test_chains_stop_at_the_first_rejection_with_greedy_probabilities():
    """K drafts per step: E[accepted] = Σ_j Π_{i≤j} p_t(x_i) with constant p_t = 0.5 (0.9375 for K = 4)."""
    engine = _sim(_traces(0.5, 0.6), seed=2)
    engine.set_draft_sampling("greedy")
    ids = engine.add([GenRequest([1], 10_000, trace_id=i) for i in range(100)]).req_ids
    accepted = []
    for _ in range(40):
        engine.draft_rounds(ids, [K] * len(ids))
        accepted += engine.verify({rid: K for rid in ids}).accepted
    want = sum(0.5 ** j for j in range(1, K + 1))
    sd = float(np.std([min(a, K) for a in accepted]))
    assert np.mean(accepted) == pytest.approx(want, abs=4 * sd / math.sqrt(len(accepted)))


def test_an_unknown_proposal_rule_is_one_line():
    with pytest.raises(InputError) as err:
        _sim(_traces(0.3, 0.5)).set_draft_sampling("top-k")
    assert err.value.field == "draft_sampling" and "\n" not in str(err.value)


def test_the_torch_engine_accepts_greedy_proposals_with_the_recorded_target_probability(tiny_pair):
    """The real rule the simulator replays: at T=1 a greedy proposal x is accepted with p_t(x), the
    `target_probs` that `profile.trace_prompt` records for the draft's argmax in the same context —
    not with the recorded `accept_probs`, min(1, p_t(x)/p_d(x))."""
    prompt, n = [1, 4, 2], 4000
    engine = TorchSDEngine(*tiny_pair, temperature=1.0, k_max=1, seed=3, draft_sampling="greedy")
    added = engine.add([GenRequest(prompt, 8, ignore_eos=True) for _ in range(n)])
    drafts = engine.draft(added.req_ids)
    out = engine.verify({rid: 1 for rid in added.req_ids})
    # the recorded trace of each context the drafts were made in (prompt + the sampled first token)
    recorded = {y: trace_prompt(engine, prompt + [y], [0, 0], 1, 1) for y in set(added.first_tokens)}
    p_t, p_acc = [], []
    for y, d, probs in zip(added.first_tokens, drafts, out.target_probs):
        tr = recorded[y]
        assert d.token == int(tr["chain_tokens"][0, 0])  # the proposal is the recorded chain's argmax
        assert probs[0] == pytest.approx(float(tr["target_probs"][0, 0]), abs=1e-4)
        p_t.append(float(tr["target_probs"][0, 0]))
        p_acc.append(float(tr["accept_probs"][0, 0]))
    rate, band = float(np.mean(out.accepted)), _band(p_t)
    assert rate == pytest.approx(np.mean(p_t), abs=band)
    assert abs(np.mean(p_acc) - np.mean(p_t)) > 3 * band  # the sampled-proposal rule would not pass
