"""At T>0, SD must sample exactly the target's distribution (Leviathan/Chen rejection sampling).

On a tiny random pair with a 6-token vocabulary we enumerate the target's exact probability of every
3-token continuation and compare 20,000 SD samples against it with a chi-square goodness-of-fit test.
The same test rejects samples drawn from the draft model alone, which shows it has the power to see a
wrong distribution of that size.

Long continuations cannot be enumerated (6^40 of them), so for those `conditional_pit` tests every
token against the target's exact conditional distribution given the tokens before it (the
probability integral transform; see there); `uniformity_p` then asks whether the transformed values
are uniform. tests/engine/test_strategies_lossless.py uses it on requests long enough for the
policies' per-request state to engage.
"""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers import AutoModelForCausalLM

from autospec.engines.base import GenRequest
from autospec.engines.torch_engine import TorchSDEngine

PROMPT = [1, 4, 2]
N_TOKENS = 3
SAMPLES = 20_000


def exact_distribution(model_dir, temperature: float) -> dict[tuple[int, ...], float]:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    vocab = model.config.vocab_size
    seqs = list(itertools.product(range(vocab), repeat=N_TOKENS))
    batch = torch.tensor([PROMPT + list(s) for s in seqs])
    with torch.no_grad():
        logp = torch.log_softmax(model(batch).logits / temperature, dim=-1)
    out = {}
    for i, s in enumerate(seqs):
        out[s] = float(sum(logp[i, len(PROMPT) - 1 + j, tok] for j, tok in enumerate(s)).exp())
    return out


def chi_square_p(samples: Counter, expected: dict[tuple[int, ...], float]) -> float:
    """Goodness of fit with cells of expected count < 5 pooled into one."""
    n = sum(samples.values())
    obs, exp, pooled_obs, pooled_exp = [], [], 0, 0.0
    for seq, p in expected.items():
        if p * n >= 5:
            obs.append(samples.get(seq, 0))
            exp.append(p * n)
        else:
            pooled_obs += samples.get(seq, 0)
            pooled_exp += p * n
    obs.append(pooled_obs)
    exp.append(pooled_exp)
    exp_arr = np.array(exp)
    return float(chisquare(np.array(obs), exp_arr * (sum(obs) / exp_arr.sum())).pvalue)


def sample_static(target, draft, k: int, temperature: float, seed: int) -> Counter:
    engine = TorchSDEngine(target, draft, temperature=temperature, seed=seed)
    res = engine.add([GenRequest(PROMPT, N_TOKENS, ignore_eos=True) for _ in range(SAMPLES)])
    live = list(res.req_ids)
    while live:
        if k:
            for _ in range(k):
                engine.draft(live)
        outcome = engine.verify({rid: k for rid in live})
        live = [rid for rid, done in zip(outcome.req_ids, outcome.finished) if not done]
    return Counter(tuple(engine.output(rid)) for rid in res.req_ids)


@pytest.mark.parametrize("k,temperature", [(1, 1.0), (3, 1.0), (2, 0.7)])
def test_sd_samples_follow_the_target_distribution(tiny_pair, k, temperature):
    target, draft = tiny_pair
    expected = exact_distribution(target, temperature)
    samples = sample_static(target, draft, k, temperature, seed=k)
    assert chi_square_p(samples, expected) > 1e-3


def test_the_chi_square_check_rejects_the_draft_distribution(tiny_pair):
    target, draft = tiny_pair
    expected = exact_distribution(target, 1.0)
    draft_only = sample_static(draft, None, 0, 1.0, seed=5)  # plain sampling from the draft model
    assert chi_square_p(draft_only, expected) < 1e-6


# --- long continuations: the exact conditional test ------------------------------------------------------


def target_conditionals(model_dir, prompt: list[int], outputs: list[list[int]], temperature: float = 1.0
                        ) -> np.ndarray:
    """(N, T, V): the target's exact (float64) next-token distribution before each of the T tokens of
    each continuation, given the prompt and the continuation's earlier tokens (one teacher-forced pass)."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64).eval()
    seqs = torch.tensor([prompt + list(o) for o in outputs])
    with torch.no_grad():
        probs = torch.softmax(model(seqs).logits / temperature, dim=-1).numpy()
    return probs[:, len(prompt) - 1: -1, :]


def conditional_pit(conditionals: np.ndarray, tokens: np.ndarray, seed: int = 0) -> np.ndarray:
    """(N, T) randomized probability integral transforms u = F(x⁻) + V·p(x), V ~ U(0, 1), of each token x
    under its conditional p, tokens ordered by descending p (F(x⁻): the mass of the tokens before x).

    Exact for any length: if every token is drawn from the target's conditional given its prefix, each
    u is U(0, 1) given everything before it, so the u of one continuation are i.i.d. U(0, 1)
    (Rosenblatt's transform), and continuations are independent. Ordering by p puts the target's likely
    tokens at small u, so a sampler that over- or under-weights them (what a biased verifier does) moves
    mass between the ends of [0, 1] instead of scattering it."""
    order = np.argsort(-conditionals, axis=-1, kind="stable")
    ranked = np.take_along_axis(conditionals, order, axis=-1)
    before = np.cumsum(ranked, axis=-1) - ranked
    rank = np.argmax(order == tokens[..., None], axis=-1)[..., None]
    p = np.take_along_axis(ranked, rank, axis=-1)[..., 0]
    return np.take_along_axis(before, rank, axis=-1)[..., 0] + np.random.default_rng(seed).random(p.shape) * p


def uniformity_p(u: np.ndarray, bins: int = 20) -> float:
    """Chi-square goodness of fit of `u` to U(0, 1) on equal-width bins."""
    counts = np.bincount(np.minimum((np.ravel(u) * bins).astype(int), bins - 1), minlength=bins)
    return float(chisquare(counts).pvalue)


LONG_TOKENS = 40


def test_the_conditional_test_accepts_the_target_and_rejects_the_draft(tiny_pair):
    """Plain sampling from the target passes on every position; plain sampling from the draft, which
    differs from the target per token, fails — the test has the power to see a wrong conditional."""
    target, draft = tiny_pair
    for model_dir, seed in ((target, 21), (draft, 22)):
        engine = TorchSDEngine(model_dir, None, temperature=1.0, seed=seed)
        res = engine.add([GenRequest(PROMPT, LONG_TOKENS, ignore_eos=True) for _ in range(200)])
        live = list(res.req_ids)
        while live:
            outcome = engine.verify({rid: 0 for rid in live})
            live = [rid for rid, done in zip(outcome.req_ids, outcome.finished) if not done]
        tokens = np.array([engine.output(rid) for rid in res.req_ids])
        u = conditional_pit(target_conditionals(target, PROMPT, tokens.tolist()), tokens)
        if model_dir == target:
            assert uniformity_p(u) > 1e-3 and uniformity_p(u[:, -10:]) > 1e-3
        else:
            assert uniformity_p(u) < 1e-6
