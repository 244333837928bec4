"""FASER frontier overlap (§4.3): chunked verification with the next chunk pre-drafted — lossless at
T=0 and T>0, with its bookkeeping checked; the chunk-size chooser (a pure function)."""

from __future__ import annotations

from collections import Counter

import pytest

from autospec.engines.base import GenRequest
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError
from autospec.latency import PiecewiseLatency
from autospec.serving.frontier import choose_chunk_size

from gpu_path_helpers import EAGER, check_caches, check_counts, run_frontier, run_static

PROMPTS = [[1, 4, 2], [3, 3, 1, 0, 2, 5, 4], [2], [5, 1, 1, 4, 2]]


def frontier_checks(chunk):
    def check(engine, outcome):
        check_caches(engine, outcome)
        check_counts(outcome)
        for i in range(outcome.batch_size):
            # at most one pre-drafted chunk is thrown away after a rejection
            assert outcome.drafted[i] - outcome.verified[i] <= chunk
            assert outcome.accepted[i] <= outcome.verified[i]
    return check


@pytest.mark.parametrize("s,chunk", [(4, 1), (4, 2), (5, 2), (3, 3), (6, 4)])
def test_t0_frontier_is_token_identical_to_greedy(tiny_pair, s, chunk):
    ref = run_static(TorchSDEngine(*tiny_pair), PROMPTS, 0, 24)
    engine = TorchSDEngine(*tiny_pair)
    assert run_frontier(engine, PROMPTS, s, chunk, 24, check=frontier_checks(chunk)) == ref


def test_t0_frontier_with_early_exit_and_eos(tiny_pair):
    """Both mechanisms at once, with requests stopping at EOS mid-chunk."""
    ref = run_static(TorchSDEngine(*tiny_pair), PROMPTS, 0, 30, ignore_eos=False)
    engine = TorchSDEngine(*tiny_pair, early_exit=EAGER)
    out = run_frontier(engine, PROMPTS, 6, 2, 30, ignore_eos=False, check=frontier_checks(2))
    assert out == ref


def test_frontier_continues_past_a_fully_accepted_chunk(bundled_pair):
    """On the bundled pair (a distilled draft) whole chunks are accepted, so steps verify more than
    one chunk and commit more than chunk + 1 tokens; output is still greedy decoding's."""
    from autospec.serving.factory import load_tokenizer
    from autospec.workloads.prompts import load_prompts

    from autospec_testing import shared_file

    tok = load_tokenizer(bundled_pair[0])
    ids = [tok.encode(p.text) for p in load_prompts(shared_file("humaneval.jsonl.gz"), limit=2)]
    ref = run_static(TorchSDEngine(*bundled_pair), ids, 0, 32)
    long_steps = []

    def check(engine, outcome):
        frontier_checks(2)(engine, outcome)
        long_steps.extend(c for c in map(len, outcome.committed) if c > 3)

    assert run_frontier(TorchSDEngine(*bundled_pair), ids, 6, 2, 32, check=check) == ref
    assert long_steps, "no step went on past its first chunk"


def test_frontier_rejects_a_bad_chunk(tiny_pair):
    engine = TorchSDEngine(*tiny_pair)
    res = engine.add([GenRequest([1, 2], 4)])
    with pytest.raises(InputError, match="chunk size"):
        engine.frontier_step({res.req_ids[0]: 2}, 0)


def sample_frontier(target, draft, s, chunk, temperature, seed, n, early_exit=None):
    from engine.test_t1_distribution import N_TOKENS, PROMPT

    engine = TorchSDEngine(target, draft, temperature=temperature, seed=seed, early_exit=early_exit)
    res = engine.add([GenRequest(PROMPT, N_TOKENS, ignore_eos=True) for _ in range(n)])
    live = list(res.req_ids)
    while live:
        outcome = engine.frontier_step({rid: s for rid in live}, chunk)
        live = [rid for rid, done in zip(outcome.req_ids, outcome.finished) if not done]
    return Counter(tuple(engine.output(rid)) for rid in res.req_ids)


@pytest.mark.parametrize("s,chunk,temperature,early_exit", [(3, 1, 1.0, None), (4, 2, 0.7, EAGER)])
def test_t1_frontier_samples_follow_the_target(tiny_pair, s, chunk, temperature, early_exit):
    from engine.test_t1_distribution import SAMPLES, chi_square_p, exact_distribution

    target, draft = tiny_pair
    expected = exact_distribution(target, temperature)
    samples = sample_frontier(target, draft, s, chunk, temperature, seed=7 + s, n=SAMPLES, early_exit=early_exit)
    assert chi_square_p(samples, expected) > 1e-3


# --- the chunk-size chooser -----------------------------------------------------------------------------

def _models(draft_per_token: float, target_fixed: float, target_per_token: float):
    # draft T_q: load α·b + β·s + c; target T_p: load α·b·s + λ·s + c (autospec/latency.py)
    t_q = PiecewiseLatency("draft", (0.0, draft_per_token, 0.0), (1.0, 0.0), (1.0, 0.0), None)
    t_p = PiecewiseLatency("target", (0.0, target_per_token, target_fixed), (1.0, 0.0), (1.0, 0.0), None)
    return t_q, t_p


def test_chunk_chooser_picks_the_largest_chunk_that_beats_sequential():
    t_q, t_p = _models(draft_per_token=1.0, target_fixed=2.0, target_per_token=0.1)
    s, b, r = 8, 4, 0.3
    t_hat = float(t_q(b, s, r)) + float(t_p(b, s, r))  # sequential: draft all, then verify all
    chosen = choose_chunk_size(s, b, r, t_q, t_p, t_hat)
    assert chosen is not None and 1 <= chosen <= s
    cost = lambda c: float(t_q(b, c, r)) + (s / c) * float(t_p(b, c, r))  # noqa: E731
    assert cost(chosen) < t_hat
    assert all(cost(c) >= t_hat for c in range(chosen + 1, s + 1))


def test_chunk_chooser_returns_none_when_overlap_cannot_pay():
    t_q, t_p = _models(draft_per_token=0.01, target_fixed=10.0, target_per_token=0.0)
    assert choose_chunk_size(4, 1, 0.5, t_q, t_p, t_hat=5.0) is None
    with pytest.raises(ValueError):
        choose_chunk_size(0, 1, 0.5, t_q, t_p, t_hat=5.0)
