"""FASER token-wise early exit inside the target's verify pass: lossless at T=0 and T>0, bookkeeping."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from autospec.early_exit import EarlyExitParams
from autospec.engines.base import GenRequest
from autospec.engines.llama import CompactLlama
from autospec.engines.torch_engine import TorchSDEngine

from autospec_testing import make_tiny_model
from gpu_path_helpers import EAGER, check_caches, check_counts, run_static

PROMPTS = [[1, 4, 2], [3, 3, 1, 0, 2, 5, 4], [2], [5, 1, 1, 4, 2]]


@pytest.fixture(scope="module")
def deep_tiny(tmp_path_factory, tiny_pair):
    """A 4-layer target (checks at layers 1 and 2) over the tiny pair's vocabulary, same draft."""
    root = tmp_path_factory.mktemp("deep_tiny")
    return make_tiny_model(root / "target", vocab=6, layers=4, seed=3), tiny_pair[1]


def test_layer_hook_cut_keeps_the_surviving_positions_exact(tiny_pair):
    """Cutting the packed batch after a layer changes nothing for the positions that stay (causal)."""
    model = CompactLlama(tiny_pair[0])
    tokens = torch.tensor([[1, 4, 2, 5, 3], [2, 2, 1, 0, 0]])
    rows, lens, q_lens = torch.arange(2), torch.tensor([0, 0]), torch.tensor([5, 3])
    cache = model.new_cache()
    cache.ensure(2, 16)
    full = model.forward(tokens, cache, rows, lens, q_lens)
    cache2 = model.new_cache()
    cache2.ensure(2, 16)
    cut = model.forward(tokens, cache2, rows, lens, q_lens, layer_hook=lambda li, x: 2 if li == 0 else None)
    assert cut.shape[1] == 2
    torch.testing.assert_close(cut, full[:, :2], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("batch", [1, 4])
def test_t0_early_exit_is_token_identical_to_greedy(deep_tiny, k, batch):
    ref = run_static(TorchSDEngine(*deep_tiny), PROMPTS[:batch], 0, 20)
    engine = TorchSDEngine(*deep_tiny, early_exit=EAGER)
    outcomes = []
    out = run_static(engine, PROMPTS[:batch], k, 20,
                     check=lambda e, o: (check_caches(e, o), check_counts(o), outcomes.append(o)))
    assert out == ref
    assert engine.early_exit_stats["pruned"] > 0, "the eager constants should prune on this pair"
    fractions = [o.early_exit_fraction for o in outcomes]
    assert all(0.0 <= f <= 1.0 for f in fractions) and max(fractions) > 0


def test_no_bonus_after_an_accepted_pruned_block_keeps_going(deep_tiny):
    """A pruned block whose tested drafts were all accepted commits them without a bonus token and
    the caches stay consistent (at T=1 acceptance is random, so the branch is common)."""
    engine = TorchSDEngine(*deep_tiny, early_exit=EAGER, temperature=1.0, seed=3)
    seen = []

    def check(e, o):
        check_caches(e, o)
        check_counts(o)
        for i in range(o.batch_size):
            if o.pruned[i] and not o.finished[i] and len(o.committed[i]) == o.accepted[i]:
                seen.append(o.accepted[i])

    outputs = run_static(engine, PROMPTS * 4, 4, 30, check=check)
    assert all(len(o) == 30 for o in outputs)
    assert seen, "no accepted-and-pruned block"


def test_eq10_decides_whether_to_prune(deep_tiny):
    """With a pruning cost above any possible saving nothing is pruned, and the flags do not matter."""
    costly = EarlyExitParams(k_start=1, k_end=1, check_cost_ratio=0.0, prune_cost_ratio=2.0)
    engine = TorchSDEngine(*deep_tiny, early_exit=costly)
    run_static(engine, PROMPTS, 4, 12)
    assert engine.early_exit_stats["pruned"] == 0 and engine.early_exit_stats["verified"] > 0


def test_default_constants_never_flag_on_a_six_token_vocabulary(deep_tiny):
    """K_ℓ ≥ 10 > vocabulary − 1: the rank test cannot flag anything, output is plain SD's."""
    engine = TorchSDEngine(*deep_tiny, early_exit=EarlyExitParams())
    out = run_static(engine, PROMPTS, 3, 12)
    assert engine.early_exit_stats["pruned"] == 0
    assert out == run_static(TorchSDEngine(*deep_tiny), PROMPTS, 0, 12)


def test_fitted_times_feed_eq10(deep_tiny):
    calls = []

    def times(b, s, k_rej):
        calls.append((b, s, k_rej))
        return 1.0, 0.0, 10.0  # pruning never pays

    engine = TorchSDEngine(*deep_tiny, early_exit=EAGER, early_exit_times=times)
    run_static(engine, PROMPTS[:2], 2, 6)
    assert calls and all(b == 2 and s == 3 and k_rej >= 0 for b, s, k_rej in calls[:1])
    assert engine.early_exit_stats["pruned"] == 0


def test_t0_bundled_pair_default_constants_lossless(bundled_pair):
    from autospec.serving.factory import load_tokenizer
    from autospec.workloads.prompts import load_prompts

    from autospec_testing import shared_file

    tok = load_tokenizer(bundled_pair[0])
    ids = [tok.encode(p.text) for p in load_prompts(shared_file("humaneval.jsonl.gz"), limit=2)]
    ref = run_static(TorchSDEngine(*bundled_pair), ids, 0, 24)
    engine = TorchSDEngine(*bundled_pair, early_exit=EarlyExitParams())
    assert run_static(engine, ids, 4, 24, check=lambda e, o: (check_caches(e, o), check_counts(o))) == ref


# --- T > 0: the committed tokens are distributed as the target's --------------------------------------

def sample_early_exit(target, draft, k, temperature, seed, params, n):
    from engine.test_t1_distribution import N_TOKENS, PROMPT

    engine = TorchSDEngine(target, draft, temperature=temperature, seed=seed, early_exit=params)
    res = engine.add([GenRequest(PROMPT, N_TOKENS, ignore_eos=True) for _ in range(n)])
    live = list(res.req_ids)
    while live:
        for _ in range(k):
            engine.draft(live)
        outcome = engine.verify({rid: k for rid in live})
        live = [rid for rid, done in zip(outcome.req_ids, outcome.finished) if not done]
    assert engine.early_exit_stats["pruned"] > 0
    return Counter(tuple(engine.output(rid)) for rid in res.req_ids)


@pytest.mark.parametrize("k,temperature", [(3, 0.7)])
def test_t1_early_exit_samples_follow_the_target(deep_tiny, k, temperature):
    from engine.test_t1_distribution import SAMPLES, chi_square_p, exact_distribution

    target, draft = deep_tiny
    expected = exact_distribution(target, temperature)
    samples = sample_early_exit(target, draft, k, temperature, seed=11 + k, params=EAGER, n=SAMPLES)
    assert chi_square_p(samples, expected) > 1e-3
