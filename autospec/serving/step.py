"""One speculative-decoding step: the only code that talks to both an engine and a strategy.

The order of calls is the one `autospec.policies.base` documents: the length policy is asked one
token at a time (and once more after the K_max-th token), the verify policy picks a prefix per request,
the engine verifies, and every policy observes the outcome.

Ids: policies always see a request's stable `RequestState.req_id`; the engine is called with
`RequestState.eid`, which differs after the serving loop preempted and re-added a request (the engine
then gave it a new id). The outcome policies observe — and the one returned — carries the stable ids.

What the step may ask beyond the required `Engine` members and `LengthPolicy` methods — an engine's
batched draft rounds, frontier step and per-step SM split, a length policy's fixed lengths and SM split
choice — is resolved once per replay into `StepCapabilities` (`engines.base.offers`,
`policies.base.FixedLengthPolicy`, `policies.base.SmSplitChoice`).

SM split per step (GP-LCB's `sm_pool`, FASER §4.1): right after `begin_step` the split the length
policy chose is applied by the engine (`engines.base.StepSmSplit.set_step_sm_split`) before anything
is drafted, the applied split is reported back to the policy (`sm_split_applied`), and a frontier
step's "auto" chunk is computed at that split. An engine that cannot switch splits per step is
refused before the replay (`StepCapabilities.of`), not silently run at the configured split.

This runs once per step for every request in the batch, so it avoids per-token list searches and
per-step copies of request histories (see `RequestState.live_view`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Mapping, Sequence, cast

from autospec.contract import DraftState, DraftToken, LatencyModel, StepClockFn, StepContext, StepOutcome
from autospec.engines.base import BatchedDraftRounds, Engine, FrontierStep, StepSmSplit, draft_round_by_round, offers
from autospec.errors import InputError
from autospec.latency import FaserModels
from autospec.policies.base import FixedLengthPolicy, LengthPolicy, SmSplitChoice
from autospec.serving.frontier import frontier_chunk
from autospec.serving.state import RequestState, record_step
from autospec.strategy import Strategy

__all__ = ["StepSettings", "StepCapabilities", "TrueMatchLen", "check_execution", "auto_chunk", "sd_step"]


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
    # the engine's step clock (StepClock.step_time_s), set by the serving loop for a strategy with a
    # policy that reads "step_clock" (the cost-aware oracle); passed on in StepContext
    step_clock: StepClockFn | None = None


DraftRounds = Callable[[Sequence[int], Sequence[int]], "list[list[DraftToken]]"]


@dataclass(frozen=True)
class StepCapabilities:
    """The optional capabilities `sd_step` uses, resolved once per replay (an isinstance check on a
    runtime protocol costs microseconds, and a step of a long simulated replay not much more)."""

    draft_rounds: DraftRounds  # the engine's BatchedDraftRounds, else one `draft` call per round
    frontier: FrontierStep | None  # the engine, when it offers FASER's frontier step
    fixed_lengths: Callable[[StepContext], "list[int] | None"] | None  # the length policy's, if it has one
    # the length policy when it chooses each step's SM split (SmSplitChoice with a pool), and the
    # engine's StepSmSplit that applies it; both None otherwise
    split_choice: SmSplitChoice | None = None
    set_split: Callable[[float | None], "float | None"] | None = None

    @classmethod
    def of(cls, engine: Engine, strategy: Strategy) -> "StepCapabilities":
        """Resolve the capabilities; an InputError (before any step) when the length policy chooses an SM
        split per step and the engine cannot apply one (e.g. the torch engine on a CPU)."""
        length = strategy.length
        choice = (cast(SmSplitChoice, length) if offers(length, SmSplitChoice)
                  and cast(SmSplitChoice, length).chooses_sm_split else None)
        if choice is not None and not offers(engine, StepSmSplit):
            raise InputError(f"{strategy.spec.length.policy} chooses an SM split per step and "
                             f"this engine ({type(engine).__name__}) cannot switch splits (the simulator and "
                             "the torch engine on CUDA can; a CPU has no SMs to split) — use sm_pool = []",
                             field="length.sm_pool")
        return cls(
            split_choice=choice,
            set_split=cast(StepSmSplit, engine).set_step_sm_split if choice is not None else None,
            draft_rounds=(cast(BatchedDraftRounds, engine).draft_rounds if offers(engine, BatchedDraftRounds)
                          else partial(draft_round_by_round, engine)),
            frontier=cast(FrontierStep, engine) if offers(engine, FrontierStep) else None,
            fixed_lengths=(cast(FixedLengthPolicy, length).fixed_lengths if offers(length, FixedLengthPolicy)
                           else None))


def check_execution(strategy: Strategy, settings: StepSettings) -> None:
    """Refuse, before a replay starts, an execution config the settings cannot run (one-line InputError)."""
    if strategy.execution.chunk_size == "auto" and settings.faser is None:
        raise InputError('execution.chunk_size = "auto" needs the fitted FASER latency models of a profile '
                         "(run `autospec fit` and pass its run directory as --profile)",
                         field="execution.chunk_size")


def auto_chunk(strategy: Strategy, settings: StepSettings, lengths: list[int],
               sm_split: float | None = None) -> int | None:
    """This step's chunk for chunk_size = "auto": s = the longest draft, b = the batch, r = `sm_split`
    (the split the step runs under), by default the strategy's (serving/frontier.py: None without a
    split to overlap in)."""
    check_execution(strategy, settings)
    r = float(strategy.execution.sm_split if sm_split is None else sm_split)
    return frontier_chunk(settings.faser, max(lengths, default=0), len(lengths), r)


# Either a table keyed by the stable req_id, or a function of the engine id (SimEngine.true_match_len).
TrueMatchLen = Mapping[int, int] | Callable[[int], "int | None"]


def sd_step(engine: Engine, strategy: Strategy, states: list[RequestState], now_s: float,
            settings: StepSettings, true_match_len: TrueMatchLen | None = None, *,
            caps: StepCapabilities | None = None) -> tuple[StepOutcome, DraftState]:
    """Draft, verify and observe once for the requests in `states` (all must be unfinished).

    `caps`: the engine's and the length policy's optional capabilities (`StepCapabilities.of(engine,
    strategy)`, which the serving loop resolves once per replay; resolved here when not given)."""
    if caps is None:
        caps = StepCapabilities.of(engine, strategy)
    views = [s.live_view() for s in states]
    if true_match_len is not None:
        _show_true_match_len(views, states, true_match_len)
    ctx = StepContext(now_s=now_s, requests=views, k_max=settings.k_max, temperature=settings.temperature,
                      sm_split=settings.sm_split, latency_model=settings.latency_model,
                      slo_tpot_s=settings.slo_tpot_s, step_clock=settings.step_clock)
    eids = [s.req_id if s.engine_id is None else s.engine_id for s in states]  # RequestState.eid
    req_ids = [s.req_id for s in states]
    strategy.length.begin_step(ctx)
    # the SM split this step runs under when the length policy chose one (module docstring; 0.0 = none),
    # None when it did not choose (the execution config's split stands)
    split: float | None = None
    if caps.split_choice is not None and caps.set_split is not None:
        chosen = caps.split_choice.step_sm_split()
        if chosen is not None:
            applied = caps.set_split(chosen)
            caps.split_choice.sm_split_applied(applied)
            split = applied or 0.0
    fixed = caps.fixed_lengths(ctx) if caps.fixed_lengths is not None else None
    # FASER frontier overlap (docs/policies.md §4): with lengths fixed up front and every draft verified, the
    # engine drafts and verifies in chunks itself (FrontierStep.frontier_step, execution.chunk_size).
    frontier = None
    if caps.frontier is not None and fixed is not None and strategy.spec.verify.policy == "all":
        frontier = _frontier_plan(caps.frontier.frontier_chunk, strategy, settings, fixed, split)
    if frontier is not None and caps.frontier is not None:
        lengths, chunk = frontier
        outcome = caps.frontier.frontier_step(dict(zip(eids, lengths)), chunk)
        drafts = DraftState.empty(req_ids)
    else:
        drafts = _draft(engine, strategy.length, ctx, caps, fixed, eids, req_ids)
        n_verify = strategy.verify.select(ctx, drafts)
        plan = {eid: n if type(n) is int and 0 <= n <= k else max(0, min(int(n), k))
                for eid, n, k in zip(eids, n_verify, drafts.lengths())}
        outcome = engine.verify(plan)
    outcome = _under_stable_ids(outcome, eids, req_ids)
    strategy.length.observe(ctx, outcome)
    strategy.verify.observe(ctx, outcome)
    strategy.schedule.observe(outcome)
    step_s = outcome.draft_time_s + outcome.verify_time_s
    record_step(states, outcome, drafts, step_s)
    return outcome, drafts


def _show_true_match_len(views: list, states: list[RequestState], true_match_len: TrueMatchLen) -> None:
    """Fill each view's true match length (the oracle's signal) from the engine or a table."""
    if callable(true_match_len):
        for v, s in zip(views, states):
            v.true_match_len = true_match_len(s.eid)
    else:
        for v in views:
            v.true_match_len = true_match_len.get(v.req_id)


def _frontier_plan(chunk: int | str | None, strategy: Strategy, settings: StepSettings,
                   fixed: list[int], split: float | None = None) -> tuple[list[int], int] | None:
    """(lengths, chunk) of a frontier step, or None for a plain one: no chunk, or chunk_size = "auto"
    and FASER's condition on the fitted models finds no chunk that pays."""
    if not chunk:
        return None
    k_max = settings.k_max
    lengths = [max(0, min(int(k), k_max)) for k in fixed]
    if chunk == "auto":
        chunk = auto_chunk(strategy, settings, lengths, split)
        if chunk is None:
            return None
    return lengths, int(chunk)


def _draft(engine: Engine, length: LengthPolicy, ctx: StepContext, caps: StepCapabilities,
           fixed: list[int] | None, eids: list[int], req_ids: list[int]) -> DraftState:
    """This step's drafts: every round in one call when the lengths were decided in begin_step, else
    one token at a time while the length policy asks for more (policies/base.py)."""
    k_max = ctx.k_max
    if fixed is not None:
        lengths = [k if type(k) is int and 0 <= k <= k_max else max(0, min(int(k), k_max)) for k in fixed]
        return DraftState.from_rows(req_ids, caps.draft_rounds(eids, lengths))
    drafts = DraftState.empty(req_ids)
    tokens, confidences, entropies = drafts.tokens, drafts.confidences, drafts.entropies
    while True:
        more = length.keep_drafting(ctx, drafts)
        chosen = [i for i, m in enumerate(more) if m and len(tokens[i]) < k_max]
        if not chosen:
            return drafts
        # Append by position: DraftState.append searches req_ids per token, O(batch) each.
        for i, tok in zip(chosen, engine.draft([eids[i] for i in chosen])):
            tokens[i].append(tok.token)
            confidences[i].append(tok.confidence)
            entropies[i].append(tok.entropy)


def _under_stable_ids(outcome: StepOutcome, eids: list[int], req_ids: list[int]) -> StepOutcome:
    """The outcome in the batch's order and under the stable req_ids policies know."""
    if outcome.req_ids != eids:
        if sorted(outcome.req_ids) != sorted(eids):
            raise RuntimeError(f"engine verified {outcome.req_ids}, asked for {eids}")
        outcome = _reorder(outcome, eids)
    if eids != req_ids:  # the engine knows some request under another id (after a preemption)
        outcome = dataclasses.replace(outcome, req_ids=req_ids)
    return outcome


def _reorder(outcome: StepOutcome, order: list[int]) -> StepOutcome:
    """The outcome's per-request lists put in `order` (engines should keep the plan's order already)."""
    pos = {rid: i for i, rid in enumerate(outcome.req_ids)}
    idx = [pos[r] for r in order]
    per_request: tuple[str, ...] = ("req_ids", "drafted", "verified", "accepted", "committed", "finished",
                                    "target_probs", "klds")
    if outcome.pruned:
        per_request += ("pruned",)
    reordered: dict[str, Any] = {f: [getattr(outcome, f)[i] for i in idx] for f in per_request}
    return dataclasses.replace(outcome, **reordered)
