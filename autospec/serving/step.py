"""One speculative-decoding step: the only code that talks to both an engine and a strategy.

The order of calls is the one `autospec.policies.base` documents: the length policy is asked one
token at a time (and once more after the K_max-th token), the verify policy picks a prefix per request,
the engine verifies, and every policy observes the outcome.
"""

from __future__ import annotations

from dataclasses import dataclass

from autospec.contract import DraftState, LatencyModel, StepContext, StepOutcome
from autospec.engines.base import Engine
from autospec.serving.state import RequestState
from autospec.strategy import Strategy


@dataclass
class StepSettings:
    k_max: int
    temperature: float = 0.0
    latency_model: LatencyModel | None = None
    slo_tpot_s: float | None = None
    sm_split: float | None = None


def sd_step(engine: Engine, strategy: Strategy, states: list[RequestState], now_s: float,
            settings: StepSettings, true_match_len: dict[int, int] | None = None) -> tuple[StepOutcome, DraftState]:
    """Draft, verify and observe once for the requests in `states` (all must be unfinished)."""
    views = [s.view() for s in states]
    if true_match_len is not None:
        for v in views:
            v.true_match_len = true_match_len.get(v.req_id)
    ctx = StepContext(now_s=now_s, requests=views, k_max=settings.k_max, temperature=settings.temperature,
                      sm_split=settings.sm_split, latency_model=settings.latency_model,
                      slo_tpot_s=settings.slo_tpot_s)
    strategy.length.begin_step(ctx)
    drafts = DraftState.empty(ctx.req_ids)
    while True:
        more = strategy.length.keep_drafting(ctx, drafts)
        ids = [rid for rid, m, n in zip(drafts.req_ids, more, drafts.lengths()) if m and n < settings.k_max]
        if not ids:
            break
        for rid, tok in zip(ids, engine.draft(ids)):
            drafts.append(rid, tok)
    n_verify = strategy.verify.select(ctx, drafts)
    plan = {rid: max(0, min(int(n), k)) for rid, n, k in zip(ctx.req_ids, n_verify, drafts.lengths())}
    outcome = engine.verify(plan)
    strategy.length.observe(ctx, outcome)
    strategy.verify.observe(ctx, outcome)
    strategy.schedule.observe(outcome)
    step_s = outcome.draft_time_s + outcome.verify_time_s
    for i, state in enumerate(states):
        state.record(outcome, i, drafts.confidences[i], step_s)
    return outcome, drafts
