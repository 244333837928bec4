"""Helpers for the GPU-path tests: step loops that drive TorchSDEngine with early exit / frontier."""

from __future__ import annotations

from typing import Sequence

from autospec.early_exit import EarlyExitParams
from autospec.engines.base import GenRequest
from autospec.engines.torch_engine import TorchSDEngine

# Aggressive constants so a tiny model actually prunes: flag a draft as soon as one token outranks it,
# and treat checks and pruning as free (Eq. 10 always says it pays).
EAGER = EarlyExitParams(k_start=1, k_end=1, check_cost_ratio=0.0, prune_cost_ratio=0.0)


def run_static(engine: TorchSDEngine, prompts: Sequence[Sequence[int]], k: int, max_tokens: int,
               ignore_eos: bool = True, check=None) -> list[list[int]]:
    """Draft k, verify k, until every request is done; `check(engine, outcome)` after each verify."""
    res = engine.add([GenRequest(list(p), max_tokens, ignore_eos=ignore_eos) for p in prompts])
    live = [rid for rid, fin in zip(res.req_ids, res.finished) if not fin]
    while live:
        for _ in range(k):
            engine.draft(live)
        out = engine.verify({rid: k for rid in live})
        if check is not None:
            check(engine, out)
        live = [rid for rid, done in zip(out.req_ids, out.finished) if not done]
    outputs = [engine.output(rid) for rid in res.req_ids]
    engine.remove(list(res.req_ids))
    return outputs


def run_frontier(engine: TorchSDEngine, prompts: Sequence[Sequence[int]], s: int, chunk: int, max_tokens: int,
                 ignore_eos: bool = True, check=None) -> list[list[int]]:
    res = engine.add([GenRequest(list(p), max_tokens, ignore_eos=ignore_eos) for p in prompts])
    live = [rid for rid, fin in zip(res.req_ids, res.finished) if not fin]
    while live:
        out = engine.frontier_step({rid: s for rid in live}, chunk)
        if check is not None:
            check(engine, out)
        live = [rid for rid, done in zip(out.req_ids, out.finished) if not done]
    outputs = [engine.output(rid) for rid in res.req_ids]
    engine.remove(list(res.req_ids))
    return outputs


def check_caches(engine: TorchSDEngine, outcome) -> None:
    """Bookkeeping invariants after a verify: the target cache holds every committed token but the
    last; the draft cache plus its pending tokens hold exactly the committed tokens; no drafts linger
    (a frontier step never leaves carried drafts behind)."""
    for rid, fin in zip(outcome.req_ids, outcome.finished):
        if fin:
            continue
        r = engine.request(rid)
        committed = r.prompt_len + len(r.output)
        assert r.target_len == committed - 1
        assert r.last_token == r.output[-1]
        assert r.draft_len + len(r.pending) == committed
        assert r.pending[-1] == r.output[-1]
        assert not r.drafts and not r.draft_probs


def check_counts(outcome) -> None:
    """Per request: a bonus/correction token unless early exit cut the block (then accepted only)."""
    for i in range(outcome.batch_size):
        a, c = outcome.accepted[i], len(outcome.committed[i])
        pruned = outcome.pruned[i] if outcome.pruned else 0
        assert 0 <= a <= outcome.verified[i] <= outcome.drafted[i]
        assert pruned <= outcome.verified[i]
        if not outcome.finished[i]:
            assert c == a + 1 or (pruned > 0 and c == a and a >= 1)
        assert len(outcome.klds[i]) == len(outcome.target_probs[i]) <= outcome.verified[i]
