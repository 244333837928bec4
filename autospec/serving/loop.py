"""The continuous-batching serving loop: arrivals → schedule → (preempt, admit) → one SD step → records.

Engine-agnostic: it drives any `autospec.engines.base.Engine` (torch, sim) and is, with `sd_step`, the
only code that calls both an engine and a strategy (docs/architecture.md, "Where data flows").

Each iteration:

1. requests whose arrival time has come (on the engine's clock, relative to the start of `serve`)
   join the waiting queue; if nothing is running or waiting, the loop idles until the next arrival
   (`engine.idle_until(t)`: a clock jump in the simulator, a sleep on a real engine; engines without
   it are wall-clock engines and the loop sleeps itself);
2. the strategy's schedule policy picks who runs (`Pick.run`, at most `max_batch` = batch slots);
3. the KV budget is applied in the policy's priority order: each request needs its context
   (prompt + generated) plus the tokens it may commit this step (≤ K_max + 1); a running request
   that does not fit is preempted, and admission stops at the first waiting request that does not
   fit (no bypassing the policy's order);
4. preempted requests leave the engine (`engine.remove`) and go back to waiting; on re-admission
   they are re-added with prompt + generated tokens and their remaining max_tokens (recompute). An
   engine that models a KV switch cost (`swap_cost_s(context_tokens)`, the simulator) is charged it
   by advancing its clock (docs/policies.md §7);
5. admitted requests are prefilled together (`engine.add`), whose first token is the request's first
   token (or the next token of a resumed one); they join this iteration's step — except on an engine
   with `fused_prefill` (the simulator calibrated from a vLLM profile), where, as in vLLM, the
   prefills run inside the step of the running requests, the first tokens come at that step's end
   and the new requests draft from the next step on;
6. `sd_step` drafts, verifies and lets every policy observe, for the whole batch; the engine's
   `true_match_len` (the simulator's oracle signal) is passed along when the engine has one.

Records are columnar lists appended once per step/request (no per-step copies), so a 20,000-request
simulated replay spends its time in the policies and the engine, not here.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field
from itertools import chain
from typing import Callable, Iterator, Sequence

import numpy as np
import pandas as pd

from autospec.contract import RequestView
from autospec.engines.base import Engine, GenRequest
from autospec.errors import InputError
from autospec.serving.state import RequestState
from autospec.serving.step import StepSettings, check_execution, sd_step
from autospec.strategy import Strategy

HISTORY_ROUNDS = 64  # recent rounds a policy can see in RequestView.rounds; the records keep all


class SyntheticPrompt(Sequence[int]):
    """`length` reproducible pseudo-random token ids in [0, vocab), materialised only when iterated.

    Trace replays without prompt text (and every simulated replay) need prompts of a given length;
    20,000 requests × thousands of tokens as Python lists would cost gigabytes, while the simulator
    only asks for `len(prompt)`.
    """

    def __init__(self, length: int, vocab: int, seed: int):
        if length < 1:
            raise InputError(f"a prompt needs at least one token, got {length}", field="prompt_len")
        self.length, self.vocab, self.seed = int(length), max(int(vocab), 1), int(seed)

    def tokens(self) -> list[int]:
        return np.random.default_rng([self.seed, self.length]).integers(0, self.vocab, self.length).tolist()

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        return iter(self.tokens())

    def __getitem__(self, index):  # type: ignore[override]
        return self.tokens()[index]


class ConcatTokens(Sequence[int]):
    """A prompt followed by the tokens generated before a preemption, without copying either."""

    def __init__(self, head: Sequence[int], tail: Sequence[int]):
        self.head, self.tail = head, tail

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def __iter__(self) -> Iterator[int]:
        return chain(self.head, self.tail)

    def __getitem__(self, index):  # type: ignore[override]
        return list(self)[index]


@dataclass(frozen=True)
class ServeRequest:
    """One request of a replay: when it arrives (seconds from the start), its prompt and token budget."""

    req_id: int
    arrival_s: float
    prompt: Sequence[int]
    max_tokens: int
    domain: str = ""
    predicted_output_len: float | None = None


@dataclass
class RequestRecord:
    """What happened to one request; times are seconds since the start of `serve`. Its per-token
    times and per-round counts are derived from the step log (`ServeRecords.requests_frame`)."""

    req_id: int
    arrival_s: float
    prompt_len: int
    max_tokens: int
    domain: str
    admitted_s: float = math.nan  # first admission (prefill start)
    first_token_s: float = math.nan
    finish_s: float = math.nan
    preemptions: int = 0
    preempt_cost_s: float = 0.0  # KV switch cost charged for its preemptions (simulator)
    output: list[int] | None = None  # token ids, when serve(keep_outputs=True)


@dataclass
class StepLog:
    """Per-step columns (one entry per SD step). k = drafted, l = verified per request, in batch order."""

    start_s: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)
    req_ids: list[list[int]] = field(default_factory=list)
    k: list[list[int]] = field(default_factory=list)
    l: list[list[int]] = field(default_factory=list)  # noqa: E741 — ℓ, the verified count, as in the papers
    accepted: list[list[int]] = field(default_factory=list)
    c: list[list[int]] = field(default_factory=list)  # tokens committed per request (accepted + 1, clipped)
    committed: list[int] = field(default_factory=list)
    draft_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    early_exit: list[float] = field(default_factory=list)  # pruned / verified draft tokens (FASER early exit)
    prefill_s: list[float] = field(default_factory=list)  # prefill of requests admitted before this step
    admitted: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    swap_s: list[float] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)  # Σ context of the batch after the step
    # Prefill events (a request's first token, or the next token of a resumed one); `prefill_before`
    # is the number of steps logged before it, which orders it among the request's step tokens.
    prefill_req: list[int] = field(default_factory=list)
    prefill_t: list[float] = field(default_factory=list)
    prefill_before: list[int] = field(default_factory=list)


@dataclass
class ServeRecords:
    strategy: str
    requests: list[RequestRecord]
    steps: StepLog
    wall_s: float  # host time the replay took (not the engine's clock)

    def _per_request(self) -> dict[str, list[np.ndarray]]:
        """Token times and per-round counts of each request (in `self.requests` order), from the step
        log: one vectorised pass instead of per-token appends inside the loop."""
        s = self.steps
        ids = pd.Index([r.req_id for r in self.requests])
        n = len(ids)
        sizes = np.asarray(s.batch, dtype=np.int64)
        total = int(sizes.sum())

        def flat(column: list[list[int]]) -> np.ndarray:
            return np.fromiter(chain.from_iterable(column), dtype=np.int64, count=total)

        step_owner = ids.get_indexer(flat(s.req_ids))
        step_no = np.repeat(np.arange(len(sizes), dtype=np.float64), sizes)
        by_owner = np.argsort(step_owner, kind="stable")  # keeps step order within a request
        bounds = np.searchsorted(step_owner[by_owner], np.arange(n + 1))
        rounds = {name: np.split(flat(col)[by_owner], bounds[1:-1])
                  for name, col in (("rounds_drafted", s.k), ("rounds_verified", s.l),
                                    ("rounds_accepted", s.accepted))}
        # Token events: prefills (1 token, just before the step that followed them) and steps.
        owner = np.concatenate([ids.get_indexer(np.asarray(s.prefill_req, dtype=np.int64)), step_owner])
        when = np.concatenate([np.asarray(s.prefill_before, dtype=np.float64) - 0.5, step_no])
        times = np.concatenate([np.asarray(s.prefill_t, dtype=np.float64),
                                np.repeat(np.asarray(s.end_s, dtype=np.float64), sizes)])
        counts = np.concatenate([np.ones(len(s.prefill_req), dtype=np.int64), flat(s.c)])
        order = np.lexsort((when, owner))
        token_owner = np.repeat(owner[order], counts[order])
        token_times = np.repeat(times[order], counts[order])
        token_bounds = np.searchsorted(token_owner, np.arange(n + 1))
        return {"token_times": np.split(token_times, token_bounds[1:-1]), **rounds}

    def requests_frame(self) -> pd.DataFrame:
        """One row per request; list columns hold its token times and per-round counts."""
        rows = self.requests
        derived = self._per_request()
        frame = pd.DataFrame({
            "req_id": [r.req_id for r in rows],
            "domain": [r.domain for r in rows],
            "arrival_s": [r.arrival_s for r in rows],
            "prompt_len": [r.prompt_len for r in rows],
            "max_tokens": [r.max_tokens for r in rows],
            "output_len": [len(t) for t in derived["token_times"]],
            "admitted_s": [r.admitted_s for r in rows],
            "first_token_s": [r.first_token_s for r in rows],
            "finish_s": [r.finish_s for r in rows],
            "preemptions": [r.preemptions for r in rows],
            "preempt_cost_s": [r.preempt_cost_s for r in rows],
            **derived,
        })
        if rows and rows[0].output is not None:
            frame["output"] = [r.output for r in rows]
        return frame

    def steps_frame(self) -> pd.DataFrame:
        s = self.steps
        return pd.DataFrame({
            "step": np.arange(len(s.start_s)), "start_s": s.start_s, "end_s": s.end_s, "batch": s.batch,
            "req_ids": s.req_ids, "k": s.k, "l": s.l, "accepted": s.accepted, "c": s.c, "committed": s.committed,
            "draft_s": s.draft_s, "verify_s": s.verify_s, "early_exit_fraction": s.early_exit,
            "prefill_s": s.prefill_s, "admitted": s.admitted,
            "preempted": s.preempted, "swap_s": s.swap_s, "kv_tokens": s.kv_tokens,
        })


def _validate(requests: Sequence[ServeRequest], max_batch: int, kv_budget_tokens: int | None) -> None:
    if max_batch < 1:
        raise InputError(f"max batch must be >= 1, got {max_batch}", field="max_batch")
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


def _idle(engine: Engine, until: float) -> None:
    """Advance the engine's clock to `until` (absolute, on the engine's clock)."""
    idle_until = getattr(engine, "idle_until", None)
    if idle_until is not None:
        idle_until(until)
    else:  # an engine without idle_until runs on wall-clock time (perf_counter)
        gap = until - engine.now()
        if gap > 0:
            time.sleep(gap)


def serve(engine: Engine, strategy: Strategy, requests: Sequence[ServeRequest], *, max_batch: int,
          settings: StepSettings, kv_budget_tokens: int | None = None, ignore_eos: bool = True,
          keep_outputs: bool = False, history_rounds: int = HISTORY_ROUNDS,
          on_finish: Callable[[RequestRecord], None] | None = None) -> ServeRecords:
    """Replay `requests` through `engine` under `strategy` with continuous batching (module docstring).

    `max_batch` is the number of batch slots; `kv_budget_tokens` (None = unlimited) bounds the summed
    context of the running requests. `ignore_eos` (default) makes every request generate exactly its
    max_tokens, as a trace replay wants. `keep_outputs` stores each request's token ids in its record.
    `on_finish(record)` is called with each request's RequestRecord as it finishes.
    """
    _validate(requests, max_batch, kv_budget_tokens)
    if hasattr(engine, "set_draft_sampling"):
        engine.set_draft_sampling(strategy.execution.draft_sampling)  # type: ignore[attr-defined]
    check_execution(strategy, settings)
    if hasattr(engine, "set_speculative"):  # the simulator prices a plain (no-SD) engine's passes apart
        engine.set_speculative(strategy.spec.length.policy != "none")  # type: ignore[attr-defined]
    if hasattr(engine, "configure_execution"):  # FASER: early exit, frontier chunk, SM split (torch, sim)
        engine.configure_execution(strategy.execution, faser=settings.faser)  # type: ignore[attr-defined]
    fused_prefill = bool(getattr(engine, "fused_prefill", False))  # the simulator of a vLLM profile
    signals = strategy.view_signals  # keep only the request signals some policy reads (Policy.reads)
    true_match_len = getattr(engine, "true_match_len", None) if "true_match_len" in signals else None
    swap_cost_s = getattr(engine, "swap_cost_s", None)
    k_max = settings.k_max
    schedule = strategy.schedule

    order = sorted(requests, key=lambda r: (r.arrival_s, r.req_id))
    by_id = {r.req_id: r for r in order}
    records = {r.req_id: RequestRecord(r.req_id, r.arrival_s, len(r.prompt), r.max_tokens, r.domain)
               for r in order}
    pending = deque(order)
    waiting: dict[int, RequestState] = {}
    running: dict[int, RequestState] = {}
    # Views handed to the schedule policy, kept alongside so a step does not rebuild one per request
    # (each state's view is updated in place as it changes).
    waiting_views: dict[int, RequestView] = {}
    running_views: dict[int, RequestView] = {}
    produced: dict[int, list[int]] = {}  # tokens of preempted requests, for their re-add (and outputs)
    log = StepLog()
    wall0 = time.perf_counter()
    t0 = engine.now()

    def collect_output(state: RequestState) -> list[int]:
        return produced.pop(state.req_id, []) + list(engine.output(state.eid))

    def finish(states: list[RequestState], t: float) -> None:
        if not states:
            return
        for s in states:
            rec = records[s.req_id]
            rec.finish_s = t
            if keep_outputs:
                rec.output = collect_output(s)
            else:
                produced.pop(s.req_id, None)
            running.pop(s.req_id, None)
            running_views.pop(s.req_id, None)
        engine.remove([s.eid for s in states])
        if on_finish is not None:  # progress bars, and tune's pruning (it reads the finished record)
            for s in states:
                on_finish(records[s.req_id])

    def first_tokens(admitted: list[tuple[RequestState, bool]], t_admit: float, t: float) -> None:
        """Record the admitted requests' prefill tokens (emitted at `t`); finish those it completed."""
        for s, _ in admitted:
            rec = records[s.req_id]
            if math.isnan(rec.admitted_s):
                rec.admitted_s = t_admit
                rec.first_token_s = t
            log.prefill_req.append(s.req_id)
            log.prefill_t.append(t)
            log.prefill_before.append(len(log.end_s))
        finish([s for s, fin in admitted if fin], t)

    while pending or waiting or running:
        now = engine.now() - t0
        while pending and pending[0].arrival_s <= now:
            r = pending.popleft()
            state = RequestState(r.req_id, len(r.prompt), r.max_tokens, arrival_s=r.arrival_s, domain=r.domain,
                                 predicted_output_len=r.predicted_output_len, history_rounds=history_rounds,
                                 signals=signals)
            waiting[r.req_id] = state
            waiting_views[r.req_id] = state.live_view()
        if not running and not waiting:
            _idle(engine, t0 + pending[0].arrival_s)
            continue
        step_start = now

        # --- who runs: the policy's order, then the KV budget in that order
        pick = schedule.pick(now, list(waiting_views.values()), list(running_views.values()), max_batch)
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
                raise RuntimeError(f"schedule policy {strategy.spec.schedule.policy!r} picked unknown "
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
        kept_ids = {s.req_id for s in keep}

        # --- preempt: every running request not kept (by the policy or the KV budget)
        evicted = [s for rid, s in running.items() if rid not in kept_ids]
        swap_s = 0.0
        if evicted:
            for s in evicted:
                produced[s.req_id] = collect_output(s)
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
            waiting = {rid: waiting[rid] for rid in sorted(waiting, key=lambda rid: (by_id[rid].arrival_s, rid))}
            waiting_views = {rid: waiting_views[rid] for rid in waiting}
            if swap_s > 0:
                _idle(engine, engine.now() + swap_s)

        # --- admit: prefill together; the prefill's token is the (next) output token
        prefill_s = 0.0
        admitted: list[tuple[RequestState, bool]] = []  # (state, finished at its prefill)
        t_admit = t_first = 0.0
        if admit:
            t_admit = engine.now() - t0
            gen = []
            for s in admit:
                src = by_id[s.req_id]
                done = produced.get(s.req_id)
                prompt = src.prompt if not done else ConcatTokens(src.prompt, done)
                gen.append(GenRequest(prompt, s.max_tokens - s.generated, ignore_eos, domain=s.domain,
                                      trace_id=s.req_id, resumed_tokens=len(done or ())))
            res = engine.add(gen)
            prefill_s = res.time_s
            t_first = engine.now() - t0
            for s, eid, fin in zip(admit, res.req_ids, res.finished):
                del waiting[s.req_id]
                running_views[s.req_id] = waiting_views.pop(s.req_id)
                s.engine_id = eid
                s.commit(1)
                running[s.req_id] = s
                if fin:
                    s.finished = True
                admitted.append((s, fin))
        # A fused-prefill engine (vLLM's structure) runs the prefills inside this step, with the running
        # requests: their first token comes at its end (at once if nothing runs: a prefill-only step)
        # and they draft from the next step on.
        batch = [s for s in (keep if fused_prefill else chain(keep, admit)) if not s.finished]
        if admitted and not (fused_prefill and batch):
            first_tokens(admitted, t_admit, t_first)
        if not batch:
            if not running and not admit and not evicted:
                raise RuntimeError(f"schedule policy {strategy.spec.schedule.policy!r} chose no request to "
                                   f"run with {len(waiting)} waiting and none running")
            continue

        # --- one SD step over the batch
        outcome, _ = sd_step(engine, strategy, batch, engine.now() - t0, settings, true_match_len)
        t_end = engine.now() - t0
        done_now = [s for s, fin in zip(batch, outcome.finished) if fin]
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
        log.admitted.append(len(admit))
        log.preempted.append(len(evicted))
        log.swap_s.append(swap_s)
        log.kv_tokens.append(sum([s.prompt_len + s.generated for s in batch]))
        finish(done_now, t_end)
        if admitted and fused_prefill:
            first_tokens(admitted, t_admit, t_end)

    return ServeRecords(strategy.name, [records[r.req_id] for r in order], log, time.perf_counter() - wall0)
