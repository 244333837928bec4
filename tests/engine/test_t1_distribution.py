"""At T>0, SD must sample exactly the target's distribution (Leviathan/Chen rejection sampling).

On a tiny random pair with a 6-token vocabulary we enumerate the target's exact probability of every
3-token continuation and compare 20,000 SD samples against it with a chi-square goodness-of-fit test.
The same test rejects samples drawn from the draft model alone, which shows it has the power to see a
wrong distribution of that size.
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
