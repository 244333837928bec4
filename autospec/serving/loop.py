"""The continuous-batching serving loop: arrivals → schedule → (preempt, admit) → one SD step → records.

Engine-agnostic: it drives any `autospec.engines.base.Engine` (torch, sim) and is, with `sd_step`, the
only code that calls both an engine and a strategy (docs/architecture.md, "Where data flows"). Before
the first step it resolves, once, which optional capabilities the engine offers (`engines.base.offers`:
draft sampling, the speculative switch, the execution config, fused prefill, the true match length, a
swap cost; `serving.step.StepCapabilities` for the step's) and calls no member of one it does not.
The requests it takes and the records it writes are in `autospec.serving.records`.

Each iteration:

1. requests whose arrival time has come (on the engine's clock, relative to the start of `serve`)
   join the waiting queue; if nothing is running or waiting, the loop idles until the next arrival
   (`engine.idle_until(t)`: a clock jump in the simulator, a sleep on a real engine). With
   `max_concurrency = N` (as `vllm bench serve --max-concurrency`; a closed loop when every request
   arrives at 0) at most N requests are in the system — waiting or running, not finished — at once:
   the client holds N slots, and a request is sent, in trace order, once its arrival has come and a
   slot is free; it is sent at the later of its arrival and the finish that freed its slot (its
   record's `sent_s`, what its latencies count from; open loop `sent_s = arrival_s`);
2. the strategy's schedule policy picks who runs (`Pick.run`, at most `max_batch` = batch slots);
3. the KV budget is applied in the policy's priority order: each request needs its context
   (prompt + generated) plus the tokens it may commit this step (≤ K_max + 1); a running request
   that does not fit is preempted, and admission stops at the first waiting request that does not
   fit (no bypassing the policy's order);
4. preempted requests leave the engine (`engine.remove`) and go back to waiting with their state —
   attained service, generated tokens, round history — intact; on re-admission they are re-added with
   prompt + generated tokens and their remaining max_tokens (recompute): the engine's prefill of that
   context is the price of the preemption, and each resumed request's token share of its admission's
   prefill seconds is added to its record's `preempt_cost_s`. An engine that offers `SwapCost` is also
   charged `swap_cost_s(context_tokens)` at preemption by advancing its clock — a cost on top of the
   recompute, so an engine that offers it must not price the KV rebuild in both (the simulator models
   recompute only and does not offer it; docs/policies.md §7);
5. admitted requests are prefilled together (`engine.add`), whose first token is the request's first
   token (or the next token of a resumed one); they join this iteration's step — except on an engine
   with `FusedPrefill.fused_prefill` set (the simulator calibrated from a vLLM profile), where, as in vLLM, the
   prefills run inside the step of the running requests, the first tokens come at that step's end
   and the new requests are drafted for and verified from the next step on (the engine prices the
   proposal vLLM makes for them inside the admitting step: `SimEngine._admitted`);
6. `sd_step` drafts, verifies and lets every policy observe, for the whole batch; the engine's
   `true_match_len` (the simulator's oracle signal) is passed along when the engine offers
   `TrueMatchLength` and some policy reads it, and its step clock (`StepClock.step_time_s`, in
   `StepContext.step_clock`) when the engine offers it and some policy reads "step_clock".

Records are columnar lists appended once per step/request (no per-step copies), so a 20,000-request
simulated replay spends its time in the policies and the engine, not here.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import deque
from itertools import chain
from typing import Callable, Iterator, Sequence, cast

from autospec.contract import RequestView
from autospec.engines.base import (
    DraftSampling,
    Engine,
    ExecutionConfig,
    FusedPrefill,
    GenRequest,
    SpeculativeSwitch,
    StepClock,
    SwapCost,
    TrueMatchLength,
    offers,
)
from autospec.engines.sim import SimEngine
from autospec.errors import InputError
from autospec.serving.batch import batch_path_problem, serve_batched
from autospec.serving.records import RequestRecord, ServeRecords, ServeRequest, StepLog
from autospec.serving.state import RequestState
from autospec.serving.step import StepCapabilities, StepSettings, check_execution, sd_step
from autospec.strategy import Strategy

__all__ = ["HISTORY_ROUNDS", "serve"]

HISTORY_ROUNDS = 64  # recent rounds a policy can see in RequestView.rounds; the records keep all


class ConcatTokens(Sequence[int]):
    """A prompt followed by the tokens generated before a preemption, without copying either."""

    def __init__(self, head: Sequence[int], tail: Sequence[int]):
        self.head, self.tail = head, tail

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def __iter__(self) -> Iterator[int]:
        return chain(self.head, self.tail)

    def __getitem__(self, index):
        return list(self)[index]


def _validate(requests: Sequence[ServeRequest], max_batch: int, kv_budget_tokens: int | None,
              max_concurrency: int | None) -> None:
    if max_batch < 1:
        raise InputError(f"max batch must be >= 1, got {max_batch}", field="max_batch")
    if max_concurrency is not None and max_concurrency < 1:
        raise InputError(f"max concurrency must be >= 1 request, got {max_concurrency}", field="max_concurrency")
    if kv_budget_tokens is not None and kv_budget_tokens < 1:
        raise InputError(f"KV budget must be >= 1 token, got {kv_budget_tokens}", field="kv_budget_tokens")
    seen: set[int] = set()
    for r in requests:
        if r.req_id in seen:
            raise InputError(f"request id {r.req_id} appears twice", field="requests")
        seen.add(r.req_id)
        if r.max_tokens < 1:
            raise InputError(f"request {r.req_id}: max_tokens must be >= 1", field="max_tokens")
        if not math.isfinite(r.arrival_s) or r.arrival_s < 0:
            raise InputError(f"request {r.req_id}: arrival must be a finite time >= 0", field="arrival_s")
        # A request that cannot fit alone would wait forever: refuse it up front.
        if kv_budget_tokens is not None and len(r.prompt) + r.max_tokens > kv_budget_tokens:
            raise InputError(f"request {r.req_id} needs {len(r.prompt) + r.max_tokens} KV tokens "
                             f"(prompt + max_tokens), more than the budget of {kv_budget_tokens}",
                             field="kv_budget_tokens")


def serve(engine: Engine, strategy: Strategy, requests: Sequence[ServeRequest], *, max_batch: int,
          settings: StepSettings, kv_budget_tokens: int | None = None, ignore_eos: bool = True,
          keep_outputs: bool = False, history_rounds: int = HISTORY_ROUNDS,
          on_finish: Callable[[RequestRecord], None] | None = None,
          max_concurrency: int | None = None, batch_path: bool | None = None) -> ServeRecords:
    """Replay `requests` through `engine` under `strategy` with continuous batching (module docstring).

    `max_batch` is the number of batch slots; `kv_budget_tokens` (None = unlimited) bounds the summed
    context of the running requests. `max_concurrency` (None = open loop) bounds the requests sent and
    not yet finished (step 1 of the module docstring). `ignore_eos` (default) makes every request
    generate exactly its max_tokens, as a trace replay wants. `keep_outputs` stores each request's
    token ids in its record. `on_finish(record)` is called with each request's RequestRecord as it
    finishes.

    `batch_path`: None (default) replays on the simulator's batch path (`serving.batch`: the same
    records, a few array operations per step) whenever the strategy and settings allow it; False never
    does (the per-request path, e.g. to time one against the other); True insists, a ValueError saying
    why when it cannot.
    """
    _validate(requests, max_batch, kv_budget_tokens, max_concurrency)
    _configure(engine, strategy, settings)
    if batch_path is not False:
        problem = batch_path_problem(engine, strategy, kv_budget_tokens=kv_budget_tokens,
                                     max_concurrency=max_concurrency, keep_outputs=keep_outputs)
        if problem is None:
            return serve_batched(cast(SimEngine, engine), strategy, requests, max_batch=max_batch,
                                 k_max=settings.k_max, latency_model=settings.latency_model,
                                 sm_split=settings.sm_split, on_finish=on_finish)
        if batch_path:
            raise ValueError(f"this replay cannot take the batch path: {problem}")
    return _Serving(engine, strategy, requests, max_batch=max_batch, settings=settings,
                    kv_budget_tokens=kv_budget_tokens, ignore_eos=ignore_eos, keep_outputs=keep_outputs,
                    history_rounds=history_rounds, on_finish=on_finish, max_concurrency=max_concurrency).run()


def _configure(engine: Engine, strategy: Strategy, settings: StepSettings) -> None:
    """Tell the engine what the strategy asks of it, through the capabilities it offers."""
    if offers(engine, DraftSampling):
        cast(DraftSampling, engine).set_draft_sampling(strategy.execution.draft_sampling)
    check_execution(strategy, settings)
    if offers(engine, SpeculativeSwitch):  # the simulator prices a plain (no-SD) engine's passes apart
        cast(SpeculativeSwitch, engine).set_speculative(strategy.spec.length.policy != "none")
    if offers(engine, ExecutionConfig):  # FASER: early exit, frontier chunk, SM split (torch, sim)
        cast(ExecutionConfig, engine).configure_execution(strategy.execution, faser=settings.faser)


class _Serving:
    """One `serve` call: its queues and records, and an iteration's phases (module docstring) as methods.

    The methods run once per iteration; the work per request stays in plain loops over local names, as
    it was when this was one function — a long simulated replay's time is the policies' and the engine's."""

    def __init__(self, engine: Engine, strategy: Strategy, requests: Sequence[ServeRequest], *, max_batch: int,
                 settings: StepSettings, kv_budget_tokens: int | None, ignore_eos: bool, keep_outputs: bool,
                 history_rounds: int, on_finish: Callable[[RequestRecord], None] | None,
                 max_concurrency: int | None = None):
        self.engine, self.strategy, self.settings = engine, strategy, settings
        self.max_batch, self.kv_budget_tokens = max_batch, kv_budget_tokens
        self.ignore_eos, self.keep_outputs, self.history_rounds = ignore_eos, keep_outputs, history_rounds
        self.on_finish = on_finish  # progress bars, and tune's pruning (it reads the finished record)
        # The engine's optional capabilities, resolved once (engines/base.py: what the loop does without each).
        # a vLLM profile's simulator
        self.fused_prefill = offers(engine, FusedPrefill) and bool(cast(FusedPrefill, engine).fused_prefill)
        self.signals = strategy.view_signals  # keep only the request signals some policy reads (Policy.reads)
        self.true_match_len = (cast(TrueMatchLength, engine).true_match_len if "true_match_len" in self.signals
                               and offers(engine, TrueMatchLength) else None)
        if "step_clock" in self.signals and offers(engine, StepClock):
            self.settings = dataclasses.replace(settings, step_clock=cast(StepClock, engine).step_time_s)
        self.swap_cost_s = cast(SwapCost, engine).swap_cost_s if offers(engine, SwapCost) else None
        self.step_caps = StepCapabilities.of(engine, strategy)

        self.order = sorted(requests, key=lambda r: (r.arrival_s, r.req_id))
        self.by_id = {r.req_id: r for r in self.order}
        self.records = {r.req_id: RequestRecord(r.req_id, r.arrival_s, len(r.prompt), r.max_tokens, r.domain)
                        for r in self.order}
        self.pending = deque(self.order)
        # The client's free slots under max_concurrency, as the times they were freed, earliest first
        # (0 = never used yet); None = open loop. A send takes the earliest, a finish gives one back —
        # finishes come in time order, so the deque stays sorted.
        self.free_slots = (None if max_concurrency is None
                           else deque([0.0] * min(max_concurrency, len(self.order))))
        self.waiting: dict[int, RequestState] = {}
        self.running: dict[int, RequestState] = {}
        # Views handed to the schedule policy, kept alongside so a step does not rebuild one per request
        # (each state's view is updated in place as it changes).
        self.waiting_views: dict[int, RequestView] = {}
        self.running_views: dict[int, RequestView] = {}
        self.produced: dict[int, list[int]] = {}  # tokens of preempted requests, for their re-add (and outputs)
        self.log = StepLog()
        self.wall0 = time.perf_counter()
        self.t0 = engine.now()

    def run(self) -> ServeRecords:
        engine, t0, fused_prefill = self.engine, self.t0, self.fused_prefill
        while self.pending or self.waiting or self.running:
            now = engine.now() - t0
            self._arrive(now)
            if not self.running and not self.waiting:
                engine.idle_until(t0 + self.pending[0].arrival_s)
                continue
            keep, admit = self._pick(now)
            evicted, swap_s = self._preempt(keep)
            prefill_s, admitted, t_admit, t_first = self._admit(admit)
            # A fused-prefill engine (vLLM's structure) runs the prefills inside this step, with the running
            # requests: their first token comes at its end (at once if nothing runs: a prefill-only step)
            # and they join the batch from the next step on (the engine prices the proposal vLLM makes for
            # them in this one: SimEngine._admitted).
            batch = [s for s in (keep if fused_prefill else chain(keep, admit)) if not s.finished]
            if admitted and not (fused_prefill and batch):
                self._first_tokens(admitted, t_admit, t_first)
            if not batch:
                if not self.running and not admit and not evicted:
                    raise RuntimeError(f"schedule policy {self.strategy.spec.schedule.policy!r} chose no request "
                                       f"to run with {len(self.waiting)} waiting and none running")
                continue
            t_end = self._step(batch, now, prefill_s, len(admit), len(evicted), swap_s)
            if admitted and fused_prefill:
                self._first_tokens(admitted, t_admit, t_end)
        return ServeRecords(self.strategy.name, [self.records[r.req_id] for r in self.order], self.log,
                            time.perf_counter() - self.wall0, self.strategy.findings())

    def _arrive(self, now: float) -> None:
        """Requests whose arrival time has come join the waiting queue (in arrival order) — under
        max_concurrency only while a slot is free, the rest wait for one on the client side."""
        pending, waiting, waiting_views, free_slots = self.pending, self.waiting, self.waiting_views, self.free_slots
        while pending and pending[0].arrival_s <= now:
            if free_slots is None:
                sent = pending[0].arrival_s
            elif free_slots:
                sent = max(pending[0].arrival_s, free_slots.popleft())
            else:
                break  # every slot holds an unfinished request: the rest wait on the client side
            r = pending.popleft()
            self.records[r.req_id].sent_s = sent
            # To the server (and its schedule policy) a request arrives when it is sent.
            state = RequestState(r.req_id, len(r.prompt), r.max_tokens, arrival_s=sent, domain=r.domain,
                                 predicted_output_len=r.predicted_output_len, history_rounds=self.history_rounds,
                                 signals=self.signals)
            waiting[r.req_id] = state
            waiting_views[r.req_id] = state.live_view()

    def _pick(self, now: float) -> tuple[list[RequestState], list[RequestState]]:
        """Who runs: the schedule policy's order, then the KV budget in that order; (keep, admit)."""
        running, waiting, max_batch = self.running, self.waiting, self.max_batch
        kv_budget_tokens, k_max = self.kv_budget_tokens, self.settings.k_max
        pick = self.strategy.schedule.pick(now, list(self.waiting_views.values()),
                                           list(self.running_views.values()), max_batch)
        keep: list[RequestState] = []
        admit: list[RequestState] = []
        used = 0
        blocked = False
        for rid in pick.run[:max_batch]:
            state = running.get(rid)
            is_running = state is not None
            if state is None:
                state = waiting.get(rid)
            if state is None:
                raise RuntimeError(f"schedule policy {self.strategy.spec.schedule.policy!r} picked unknown "
                                   f"request {rid}")
            if kv_budget_tokens is None:
                need, fits = 0, True
            else:
                need = state.context_len + min(k_max + 1, state.max_tokens - state.generated)
                fits = used + need <= kv_budget_tokens
            if is_running and fits:
                keep.append(state)
                used += need
            elif not is_running and fits and not blocked:
                admit.append(state)
                used += need
            elif not is_running:
                blocked = True  # admissions keep the policy's order: nobody jumps a request that waits
        return keep, admit

    def _preempt(self, keep: list[RequestState]) -> tuple[list[RequestState], float]:
        """Every running request not kept (by the policy or the KV budget) leaves the engine and waits
        again; (the evicted, the KV switch cost charged to the clock)."""
        kept_ids = {s.req_id for s in keep}
        evicted = [s for rid, s in self.running.items() if rid not in kept_ids]
        swap_s = 0.0
        if not evicted:
            return evicted, swap_s
        engine, records, swap_cost_s = self.engine, self.records, self.swap_cost_s
        running, running_views = self.running, self.running_views
        waiting, waiting_views = self.waiting, self.waiting_views
        for s in evicted:
            self.produced[s.req_id] = self._collect_output(s)
            rec = records[s.req_id]
            rec.preemptions += 1
            if swap_cost_s is not None:
                cost = float(swap_cost_s(s.context_len))
                rec.preempt_cost_s += cost
                swap_s += cost
            del running[s.req_id]
            del running_views[s.req_id]
        engine.remove([s.eid for s in evicted])
        for s in evicted:
            s.engine_id = None
            waiting[s.req_id] = s
            waiting_views[s.req_id] = s.live_view()
        # Keep the queue in arrival order (the SchedulePolicy contract); arrivals append in order,
        # only a preempted request comes back out of place. O(queue), but only on preemption.
        by_id = self.by_id
        self.waiting = {rid: waiting[rid] for rid in sorted(waiting, key=lambda rid: (by_id[rid].arrival_s, rid))}
        self.waiting_views = {rid: waiting_views[rid] for rid in self.waiting}
        if swap_s > 0:
            engine.idle_until(engine.now() + swap_s)
        return evicted, swap_s

    def _admit(self, admit: list[RequestState]) -> tuple[float, list[tuple[RequestState, bool]], float, float]:
        """Prefill the admitted requests together (a resumed one with its prompt + the tokens it had);
        the prefill's token is the (next) output token. (prefill seconds, [(state, finished at its
        prefill)], admission time, time of the first tokens)."""
        admitted: list[tuple[RequestState, bool]] = []
        if not admit:
            return 0.0, admitted, 0.0, 0.0
        engine, t0, by_id, produced = self.engine, self.t0, self.by_id, self.produced
        t_admit = engine.now() - t0
        gen = []
        for s in admit:
            src = by_id[s.req_id]
            done = produced.get(s.req_id)
            prompt = src.prompt if not done else ConcatTokens(src.prompt, done)
            gen.append(GenRequest(prompt, s.max_tokens - s.generated, self.ignore_eos, domain=s.domain,
                                  trace_id=s.req_id, resumed_tokens=len(done or ()), prompt_key=src.prompt_key))
        res = engine.add(gen)
        t_first = engine.now() - t0
        if produced and any(g.resumed_tokens for g in gen):
            # recompute is what a preemption costs: each resumed request's token share of this prefill
            total = sum(len(g.prompt) for g in gen)
            records = self.records
            for s, g in zip(admit, gen):
                if g.resumed_tokens:
                    records[s.req_id].preempt_cost_s += res.time_s * len(g.prompt) / total
        waiting, waiting_views = self.waiting, self.waiting_views
        running, running_views = self.running, self.running_views
        for s, eid, fin in zip(admit, res.req_ids, res.finished):
            del waiting[s.req_id]
            running_views[s.req_id] = waiting_views.pop(s.req_id)
            s.engine_id = eid
            s.commit(1)
            running[s.req_id] = s
            if fin:
                s.finished = True
            admitted.append((s, fin))
        return res.time_s, admitted, t_admit, t_first

    def _step(self, batch: list[RequestState], step_start: float, prefill_s: float, admitted: int, preempted: int,
              swap_s: float) -> float:
        """One SD step over the batch, logged; finishes the requests it completed. Returns its end time."""
        engine, t0 = self.engine, self.t0
        outcome, _ = sd_step(engine, self.strategy, batch, engine.now() - t0, self.settings, self.true_match_len,
                             caps=self.step_caps)
        t_end = engine.now() - t0
        done_now = [s for s, fin in zip(batch, outcome.finished) if fin]
        log = self.log
        log.start_s.append(step_start)
        log.end_s.append(t_end)
        log.batch.append(len(batch))
        log.req_ids.append([s.req_id for s in batch])
        log.k.append(outcome.drafted)
        log.l.append(outcome.verified)
        log.accepted.append(outcome.accepted)
        log.c.append(list(map(len, outcome.committed)))
        log.committed.append(outcome.committed_tokens())
        log.draft_s.append(outcome.draft_time_s)
        log.verify_s.append(outcome.verify_time_s)
        log.early_exit.append(outcome.early_exit_fraction)
        log.prefill_s.append(prefill_s)
        log.admitted.append(admitted)
        log.preempted.append(preempted)
        log.swap_s.append(swap_s)
        log.kv_tokens.append(sum([s.prompt_len + s.generated for s in batch]))
        self._finish(done_now, t_end)
        return t_end

    def _collect_output(self, state: RequestState) -> list[int]:
        return self.produced.pop(state.req_id, []) + list(self.engine.output(state.eid))

    def _finish(self, states: list[RequestState], t: float) -> None:
        if not states:
            return
        records, produced, running, running_views = self.records, self.produced, self.running, self.running_views
        for s in states:
            rec = records[s.req_id]
            rec.finish_s = t
            if self.keep_outputs:
                rec.output = self._collect_output(s)
            else:
                produced.pop(s.req_id, None)
            running.pop(s.req_id, None)
            running_views.pop(s.req_id, None)
            if self.free_slots is not None:
                self.free_slots.append(t)
        self.engine.remove([s.eid for s in states])
        if self.on_finish is not None:
            for s in states:
                self.on_finish(records[s.req_id])

    def _first_tokens(self, admitted: list[tuple[RequestState, bool]], t_admit: float, t: float) -> None:
        """Record the admitted requests' prefill tokens (emitted at `t`); finish those it completed."""
        records, log = self.records, self.log
        for s, _ in admitted:
            rec = records[s.req_id]
            if math.isnan(rec.admitted_s):
                rec.admitted_s = t_admit
                rec.first_token_s = t
            log.prefill_req.append(s.req_id)
            log.prefill_t.append(t)
            log.prefill_before.append(len(log.end_s))
        self._finish([s for s, fin in admitted if fin], t)
