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
from autospec.errors import InputError
from autospec.latency import FaserModels
from autospec.policies.faser_frontier import frontier_chunk
from autospec.serving.state import RequestState, record_step
from autospec.strategy import Strategy


@dataclass
class StepSettings:
    k_max: int
    temperature: float = 0.0
    latency_model: LatencyModel | None = None
    slo_tpot_s: float | None = None
    sm_split: float | None = None
    # FASER's fitted piecewise models (fit/models.json via `autospec.fit.load_fit(...).faser`): the
    # frontier chunk of chunk_size = "auto" and the fitted early-exit times come from them
    faser: FaserModels | None = None


def check_execution(strategy: Strategy, settings: StepSettings) -> None:
    """Refuse, before a replay starts, an execution config the settings cannot run (one-line InputError)."""
    if strategy.execution.chunk_size == "auto" and settings.faser is None:
        raise InputError('execution.chunk_size = "auto" needs the fitted FASER latency models of a profile '
                         "(run `autospec fit` and pass its run directory as --profile)",
                         field="execution.chunk_size")


def auto_chunk(strategy: Strategy, settings: StepSettings, lengths: list[int]) -> int | None:
    """This step's chunk for chunk_size = "auto": s = the longest draft, b = the batch, r = the
    strategy's SM split (policies/faser_frontier.py: None without a split to overlap in)."""
    check_execution(strategy, settings)
    return frontier_chunk(settings.faser, max(lengths, default=0), len(lengths),  # type: ignore[arg-type]
                          float(strategy.execution.sm_split))


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
    eids = [s.req_id if s.engine_id is None else s.engine_id for s in states]  # RequestState.eid
    req_ids = [s.req_id for s in states]
    strategy.length.begin_step(ctx)
    k_max = settings.k_max
    fixed = strategy.length.fixed_lengths(ctx) if hasattr(strategy.length, "fixed_lengths") else None
    # FASER frontier overlap (docs/policies.md §4): with lengths fixed up front and every draft verified, the
    # engine drafts and verifies in chunks itself (TorchSDEngine.frontier_step, execution.chunk_size).
    # chunk_size = "auto": FASER's condition on the fitted models picks the chunk, None = no overlap.
    chunk = getattr(engine, "frontier_chunk", None)
    frontier = bool(chunk) and fixed is not None and strategy.spec.verify.policy == "all"
    if frontier:
        lengths = [max(0, min(int(k), k_max)) for k in fixed]
        if chunk == "auto":
            chunk = auto_chunk(strategy, settings, lengths)
            frontier = chunk is not None
    if frontier:
        outcome = engine.frontier_step(dict(zip(eids, lengths)), chunk)  # type: ignore[attr-defined]
        drafts = DraftState.empty(req_ids)
    elif fixed is not None:  # lengths decided in begin_step: every round in one engine call
        lengths = [k if type(k) is int and 0 <= k <= k_max else max(0, min(int(k), k_max)) for k in fixed]
        drafts = DraftState.from_rows(req_ids, draft_rounds(engine, eids, lengths))
    else:
        drafts = DraftState.empty(req_ids)
        tokens, confidences, entropies = drafts.tokens, drafts.confidences, drafts.entropies
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
        plan = {eid: n if type(n) is int and 0 <= n <= k else max(0, min(int(n), k))
                for eid, n, k in zip(eids, n_verify, drafts.lengths())}
        outcome = engine.verify(plan)
    if outcome.req_ids != eids:
        if sorted(outcome.req_ids) != sorted(eids):
            raise RuntimeError(f"engine verified {outcome.req_ids}, asked for {eids}")
        outcome = _reorder(outcome, eids)
    if eids != req_ids:  # the engine knows some request under another id (after a preemption)
        outcome = dataclasses.replace(outcome, req_ids=req_ids)
    strategy.length.observe(ctx, outcome)
    strategy.verify.observe(ctx, outcome)
    strategy.schedule.observe(outcome)
    step_s = outcome.draft_time_s + outcome.verify_time_s
    record_step(states, outcome, drafts, step_s)
    return outcome, drafts


def _reorder(outcome: StepOutcome, order: list[int]) -> StepOutcome:
    """The outcome's per-request lists put in `order` (engines should keep the plan's order already)."""
    pos = {rid: i for i, rid in enumerate(outcome.req_ids)}
    idx = [pos[r] for r in order]
    per_request = ("req_ids", "drafted", "verified", "accepted", "committed", "finished", "target_probs", "klds")
    if outcome.pruned:
        per_request += ("pruned",)
    return dataclasses.replace(outcome, **{f: [getattr(outcome, f)[i] for i in idx] for f in per_request})
