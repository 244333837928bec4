"""One speculative-decoding step: the only code that talks to both an engine and a strategy.

The order of calls is the one `autospec.policies.base` documents: the length policy is asked one
token at a time (and once more after the K_max-th token), the verify policy picks a prefix per request,
the engine verifies, and every policy observes the outcome.

Ids: policies always see a request's stable `RequestState.req_id`; the engine is called with
`RequestState.eid`, which differs after the serving loop preempted and re-added a request (the engine
then gave it a new id). The outcome policies observe — and the one returned — carries the stable ids.

This runs once per step for every request in the batch, so it avoids per-token list searches and
per-step copies of request histories (see `RequestState.live_view`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping

from autospec.contract import DraftState, LatencyModel, StepContext, StepOutcome
from autospec.engines.base import Engine, draft_rounds
from autospec.serving.state import RequestState
from autospec.strategy import Strategy


@dataclass
class StepSettings:
    k_max: int
    temperature: float = 0.0
    latency_model: LatencyModel | None = None
    slo_tpot_s: float | None = None
    sm_split: float | None = None


# Either a table keyed by the stable req_id, or a function of the engine id (SimEngine.true_match_len).
TrueMatchLen = Mapping[int, int] | Callable[[int], "int | None"]


def sd_step(engine: Engine, strategy: Strategy, states: list[RequestState], now_s: float,
            settings: StepSettings, true_match_len: TrueMatchLen | None = None) -> tuple[StepOutcome, DraftState]:
    """Draft, verify and observe once for the requests in `states` (all must be unfinished)."""
    views = [s.live_view() for s in states]
    if true_match_len is not None:
        if callable(true_match_len):
            for v, s in zip(views, states):
                v.true_match_len = true_match_len(s.eid)
        else:
            for v in views:
                v.true_match_len = true_match_len.get(v.req_id)
    ctx = StepContext(now_s=now_s, requests=views, k_max=settings.k_max, temperature=settings.temperature,
                      sm_split=settings.sm_split, latency_model=settings.latency_model,
                      slo_tpot_s=settings.slo_tpot_s)
    eids = [s.eid for s in states]
    strategy.length.begin_step(ctx)
    drafts = DraftState.empty(ctx.req_ids)
    tokens, confidences, entropies = drafts.tokens, drafts.confidences, drafts.entropies
    k_max = settings.k_max
    fixed = strategy.length.fixed_lengths(ctx) if hasattr(strategy.length, "fixed_lengths") else None
    # FASER frontier overlap (POLICIES.md §4): with lengths fixed up front and every draft verified, the
    # engine drafts and verifies in chunks itself (TorchSDEngine.frontier_step, execution.chunk_size).
    chunk = getattr(engine, "frontier_chunk", None)
    frontier = bool(chunk) and fixed is not None and strategy.spec.verify.policy == "all"
    if frontier:
        lengths = [max(0, min(int(k), k_max)) for k in fixed]
        outcome = engine.frontier_step(dict(zip(eids, lengths)), chunk)  # type: ignore[attr-defined]
    elif fixed is not None:  # lengths decided in begin_step: every round in one engine call
        lengths = [max(0, min(int(k), k_max)) for k in fixed]
        for i, toks in enumerate(draft_rounds(engine, eids, lengths)):
            tokens[i].extend([t.token for t in toks])
            confidences[i].extend([t.confidence for t in toks])
            entropies[i].extend([t.entropy for t in toks])
    while fixed is None:
        more = strategy.length.keep_drafting(ctx, drafts)
        chosen = [i for i, m in enumerate(more) if m and len(tokens[i]) < k_max]
        if not chosen:
            break
        # Append by position: DraftState.append searches req_ids per token, O(batch) each.
        for i, tok in zip(chosen, engine.draft([eids[i] for i in chosen])):
            tokens[i].append(tok.token)
            confidences[i].append(tok.confidence)
            entropies[i].append(tok.entropy)
    if not frontier:
        n_verify = strategy.verify.select(ctx, drafts)
        plan = {eid: max(0, min(int(n), len(t))) for eid, n, t in zip(eids, n_verify, tokens)}
        outcome = engine.verify(plan)
    if outcome.req_ids != eids:
        if sorted(outcome.req_ids) != sorted(eids):
            raise RuntimeError(f"engine verified {outcome.req_ids}, asked for {eids}")
        outcome = _reorder(outcome, eids)
    if any(s.engine_id is not None and s.engine_id != s.req_id for s in states):
        outcome = dataclasses.replace(outcome, req_ids=list(ctx.req_ids))
    strategy.length.observe(ctx, outcome)
    strategy.verify.observe(ctx, outcome)
    strategy.schedule.observe(outcome)
    step_s = outcome.draft_time_s + outcome.verify_time_s
    for i, state in enumerate(states):
        state.record(outcome, i, confidences[i], step_s)
    return outcome, drafts


def _reorder(outcome: StepOutcome, order: list[int]) -> StepOutcome:
    """The outcome's per-request lists put in `order` (engines should keep the plan's order already)."""
    pos = {rid: i for i, rid in enumerate(outcome.req_ids)}
    idx = [pos[r] for r in order]
    per_request = ("req_ids", "drafted", "verified", "accepted", "committed", "finished", "target_probs", "klds")
    if outcome.pruned:
        per_request += ("pruned",)
    return dataclasses.replace(outcome, **{f: [getattr(outcome, f)[i] for i in idx] for f in per_request})
