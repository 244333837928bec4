"""The serving loop's batch path on the simulator: `serve` for strategies whose step is a few array
operations (issue 18).

`serving.loop.serve` runs a replay through `_Serving` — a `RequestState` per request, the schedule
policy asked every step, `sd_step` calling the length, verify and schedule policies — which is what
any strategy needs and costs Python per request per step. A strategy whose length policy gives every
request of a step the same draft length from the batch size alone (`policies.base.UniformLengthPolicy`:
static K, no-SD, a per-batch-size K schedule) or from the step's totals, learning from its totals
(`TotalsLengthPolicy`: SmartSpec), or each request its own length from its true match length and the
step clock (`MatchLengthPolicy`: the oracles) or from state kept per request (`RequestLengthPolicy`:
GP-LCB, DSDE), that verifies every draft and schedules FCFS, needs none
of that per request: FCFS without a KV budget never preempts, so the running requests are always the
earliest admitted, in arrival order, and the waiting ones a contiguous run of the arrival order. Here
the loop keeps only those two counts, and the simulator steps the running requests as arrays
(`engines.sim_batch.SimBatch`).

It replays exactly what `_Serving` replays — the same iterations (arrivals, admission, prefill, one
step, finishes, fused prefill included), the same records and step log, the same clock to the bit —
and `tests/serving/test_batch_path.py` holds it to that on several strategies, workloads and engines,
at T = 0 and T > 0. `batch_path_problem` says why a replay cannot take it (then `serve` runs
`_Serving`): a KV budget (preemption), a concurrency limit, kept output tokens, FASER's execution (SM
split, frontier chunks), another engine, or a policy without the uniform form.
"""

from __future__ import annotations

import time
from typing import Callable, Sequence, cast

import numpy as np

from autospec.contract import LatencyModel
from autospec.engines.base import Engine, offers
from autospec.engines.sim import SimEngine
from autospec.engines.sim_batch import SimBatch
from autospec.policies.base import (
    MatchLengthPolicy,
    RequestLengthPolicy,
    SmSplitChoice,
    TotalsLengthPolicy,
    UniformLengthPolicy,
)
from autospec.serving.records import RequestRecord, ServeRecords, ServeRequest, StepLog, StepRow
from autospec.strategy import Strategy

__all__ = ["batch_path_problem", "serve_batched"]


def batch_path_problem(engine: Engine, strategy: Strategy, *, kv_budget_tokens: int | None,
                       max_concurrency: int | None, keep_outputs: bool) -> str | None:
    """Why this replay cannot take the batch path, or None when it can (module docstring)."""
    spec = strategy.spec
    if not isinstance(engine, SimEngine):
        return f"the batch path is the simulator's ({type(engine).__name__} is not)"
    forms = (UniformLengthPolicy, TotalsLengthPolicy, MatchLengthPolicy, RequestLengthPolicy)
    if not any(offers(strategy.length, form) for form in forms):
        return f"length policy {spec.length.policy!r} decides token by token"
    if offers(strategy.length, SmSplitChoice) and cast(SmSplitChoice, strategy.length).chooses_sm_split:
        return f"length policy {spec.length.policy!r} chooses an SM split per step"
    if spec.verify.policy != "all":
        return f"verify policy {spec.verify.policy!r} is not verify-all"
    if spec.schedule.policy != "fcfs":
        return f"schedule policy {spec.schedule.policy!r} is not FCFS"
    if kv_budget_tokens is not None:
        return "a KV budget (preemption)"
    if max_concurrency is not None:
        return "a concurrency limit"
    if keep_outputs:
        return "output token ids are kept"
    if engine.sm_split or engine.frontier_chunk:
        return "FASER's execution (an SM split or frontier chunks)"
    if engine.active_ids():
        return "the engine already serves requests"
    return None


def serve_batched(engine: SimEngine, strategy: Strategy, requests: Sequence[ServeRequest], *, max_batch: int,
                  k_max: int, latency_model: LatencyModel | None = None, sm_split: float | None = None,
                  on_finish: Callable[[RequestRecord], None] | None = None) -> ServeRecords:
    """`serve` on the batch path (the caller checked `batch_path_problem`); the same ServeRecords.
    `latency_model`, `sm_split`: the step settings' (what the policies' step context would carry)."""
    wall0 = time.perf_counter()
    # a length per batch size (cached), or per step from the step's totals, learning from its outcome
    policy = strategy.length
    uniform = cast(UniformLengthPolicy, policy) if offers(policy, UniformLengthPolicy) else None
    totals = cast(TotalsLengthPolicy, policy) if offers(policy, TotalsLengthPolicy) else None
    match = cast(MatchLengthPolicy, policy) if offers(policy, MatchLengthPolicy) else None
    request = cast(RequestLengthPolicy, policy) if offers(policy, RequestLengthPolicy) else None
    order = sorted(requests, key=lambda r: (r.arrival_s, r.req_id))
    req_id_of = np.asarray([r.req_id for r in order], np.int64)
    arrivals = [r.arrival_s for r in order]
    records = [RequestRecord(r.req_id, r.arrival_s, len(r.prompt), r.max_tokens, r.domain) for r in order]
    # rows: never more than the batch or the replay holds (a max_batch of 1e9 must not size the columns)
    batch = SimBatch(engine, min(max_batch, len(order)), [len(r.prompt) for r in order], [r.max_tokens for r in order],
                     [r.req_id for r in order], [r.domain for r in order], [r.prompt_key for r in order])
    fused = engine.fused_prefill
    # request-steps: each step commits at least one token per request, so Σ max_tokens bounds them
    journal = _StepJournal(max(1, min(sum(r.max_tokens for r in order), 1 << 23)))
    lengths: dict[int, int] = {}  # batch size -> the step's draft length, clipped to K_max
    t0 = engine.now()
    total = len(order)
    arrived = admitted = 0  # order[admitted:arrived] wait, in arrival order; the running are batch's rows

    def finish(rows: np.ndarray, t: float) -> None:
        """The rows (a boolean mask over the batch's rows) finished at t: recorded, then out of the engine."""
        done = batch.drop(rows).tolist()
        for i in done:
            records[i].finish_s = t
        if on_finish is not None:
            for i in done:
                on_finish(records[i])

    while arrived < total or admitted < arrived or batch.n:
        now = engine.now() - t0
        while arrived < total and arrivals[arrived] <= now:
            arrived += 1
        if not batch.n and admitted == arrived:
            engine.idle_until(t0 + arrivals[arrived])
            continue
        running = batch.n
        joining = max(0, min(arrived - admitted, max_batch - running))  # FCFS: the queue's head, in order
        prefill_s = 0.0
        at_prefill = None
        if joining:
            t_admit = engine.now() - t0
            new = range(admitted, admitted + joining)
            prefill_s, finished_now = batch.add(admitted, admitted + joining)
            t_first = engine.now() - t0
            admitted += joining
            for i in new:
                records[i].admitted_s = t_admit
            if finished_now.any():  # max_tokens = 1: done at the prefill
                at_prefill = np.zeros(batch.n, bool)
                at_prefill[running:] = finished_now
        # fused prefill (vLLM's step): the new requests' prefill runs inside this step, their first token
        # comes at its end and they join the batch from the next step on (the engine prices the proposal
        # vLLM makes for them in this one: SimEngine._admitted)
        steps = running if fused else batch.n - (0 if at_prefill is None else int(at_prefill.sum()))
        if joining and not (fused and steps):
            journal.first_tokens(records, new, t_first)
            if at_prefill is not None:
                finish(at_prefill, t_first)
        if not steps:
            continue
        drafts: int | np.ndarray
        if match is not None:  # a length per row: the oracles
            ks = match.match_lengths(np.minimum(batch.true_match(steps), k_max), batch.context[:steps],
                                     engine.step_time_rows)
            drafts = np.clip(np.asarray(ks, np.int64), 0, k_max)
            accepted1, committed, finished, tokens, draft_s, verify_s = batch.step_rows(steps, drafts)
        elif request is not None:  # a length per row from per-request state: GP-LCB
            ids = req_id_of[batch.owner[:steps]].tolist()
            context = batch.total_context if steps == batch.n else int(batch.context[:steps].sum())
            drafts = np.clip(np.asarray(request.request_lengths(ids, float(context), k_max, latency_model, sm_split),
                                        np.int64), 0, k_max)
            positions = batch.position[:steps].tolist()  # before the step moves them
            accepted1, committed, finished, tokens, draft_s, verify_s = batch.step_rows(steps, drafts)
            counts = drafts.tolist()
            request.observe_requests(ids, counts, (accepted1 - 1).tolist(),
                                     [False] * steps if finished is None else finished.tolist(),
                                     draft_s + verify_s + 0.0,  # + early exit: none on the simulator
                                     batch.klds(positions, counts))
        else:
            if totals is not None:
                context = batch.total_context if steps == batch.n else int(batch.context[:steps].sum())
                k = max(0, min(int(totals.step_length(steps, float(context), k_max, latency_model)), k_max))
            else:
                cached = lengths.get(steps)
                if cached is None:
                    assert uniform is not None
                    cached = lengths[steps] = max(0, min(int(uniform.uniform_length(steps)), k_max))
                k = cached
            drafts = k
            accepted1, committed, finished, tokens, draft_s, verify_s = batch.step(steps, k)
            if totals is not None:  # the step's outcome: every draft verified
                totals.observe_totals(steps * k, int(accepted1.sum()) - steps)
        t_end = engine.now() - t0
        journal.step(now, t_end, steps, drafts, tokens, draft_s, verify_s, prefill_s, joining,
                     batch.total_context if steps == batch.n else int(batch.context[:steps].sum()),
                     batch.owner[:steps], accepted1, committed)
        if finished is not None:
            rows = np.zeros(batch.n, bool)
            rows[:steps] = finished
            finish(rows, t_end)
        if joining and fused:
            journal.first_tokens(records, new, t_end)
            if at_prefill is not None:  # the new rows are the last ones still (the step's finished are gone)
                finish(at_prefill[-batch.n:], t_end)
    return ServeRecords(strategy.name, records, journal.log([r.req_id for r in order]),
                        time.perf_counter() - wall0, strategy.findings())


class _StepJournal:
    """The step log while the replay runs: a list per scalar column, and each per-request column's values
    copied into one growing int64 array (a copy per step costs less than joining one small array per step
    at the end), turned into `StepLog`'s columns once at the end (per-step entries are views of that one
    array, not a list per request per step)."""

    def __init__(self, room: int) -> None:
        self.start_s: list[float] = []
        self.end_s: list[float] = []
        self.batch: list[int] = []
        self.committed: list[int] = []
        self.draft_s: list[float] = []
        self.verify_s: list[float] = []
        self.prefill_s: list[float] = []
        self.admitted: list[int] = []
        self.kv_tokens: list[int] = []
        # per request of each step: its owner, drafts, accepted + 1 and tokens committed; np.empty leaves
        # pages untouched until written, so the room costs only what the replay fills
        self.owners, self.drafted, self.accepted1, self.c = (np.empty(room, np.int64) for _ in range(4))
        self.filled = 0
        self.prefill_req: list[int] = []  # owners until `log` maps them to request ids
        self.prefill_t: list[float] = []
        self.prefill_before: list[int] = []

    def step(self, start_s: float, end_s: float, batch: int, k: int | np.ndarray, committed: int, draft_s: float,
             verify_s: float, prefill_s: float, admitted: int, kv_tokens: int, owners: np.ndarray,
             accepted1: np.ndarray, c: np.ndarray) -> None:
        """One step's entries (`StepLog`'s columns; `k` the drafts of every request or of each, `accepted1`
        accepted + 1 per request)."""
        self.start_s.append(start_s)
        self.end_s.append(end_s)
        self.batch.append(batch)
        self.committed.append(committed)
        self.draft_s.append(draft_s)
        self.verify_s.append(verify_s)
        self.prefill_s.append(prefill_s)
        self.admitted.append(admitted)
        self.kv_tokens.append(kv_tokens)
        start, stop = self.filled, self.filled + batch
        if stop > len(self.c):
            self.owners, self.drafted, self.accepted1, self.c = (
                np.concatenate([a, np.empty_like(a)]) for a in (self.owners, self.drafted, self.accepted1, self.c))
        self.owners[start:stop] = owners
        self.drafted[start:stop] = k
        self.accepted1[start:stop] = accepted1
        self.c[start:stop] = c
        self.filled = stop

    def first_tokens(self, records: list[RequestRecord], owners: range, t: float) -> None:
        """Prefill events of the admitted requests, their first token at t (`_Serving._first_tokens`)."""
        before = len(self.start_s)
        for i in owners:
            records[i].first_token_s = t
            self.prefill_req.append(i)
            self.prefill_t.append(t)
            self.prefill_before.append(before)

    def log(self, req_ids: list[int]) -> StepLog:
        n = len(self.start_s)
        sizes = self.batch
        bounds = np.cumsum([0, *sizes]).tolist()
        spans = list(zip(bounds, bounds[1:]))

        def per_step(flat: np.ndarray) -> list[StepRow]:  # one view per step of one array
            return [flat[a:b] for a, b in spans]  # np.split does more per piece

        n_values = self.filled
        owners, accepted1, committed = self.owners[:n_values], self.accepted1[:n_values], self.c[:n_values]
        drafted = per_step(self.drafted[:n_values])
        return StepLog(
            start_s=self.start_s, end_s=self.end_s, batch=sizes,
            req_ids=per_step(np.asarray(req_ids, np.int64)[owners]),
            k=drafted, l=drafted, accepted=per_step(accepted1 - 1), c=per_step(committed),
            committed=self.committed, draft_s=self.draft_s, verify_s=self.verify_s, early_exit=[0.0] * n,
            prefill_s=self.prefill_s, admitted=self.admitted, preempted=[0] * n, swap_s=[0.0] * n,
            kv_tokens=self.kv_tokens,
            prefill_req=[req_ids[i] for i in self.prefill_req], prefill_t=self.prefill_t,
            prefill_before=self.prefill_before)
