"""A minimal clocked engine for serving-loop tests: deterministic acceptance, a virtual clock.

It implements the Engine contract plus the simulator extras the loop looks for (`idle_until`,
`true_match_len`, `swap_cost_s`), so the loop's simulator path is tested without the real simulator
and the loop's own overhead can be measured on a cheap engine. Request r at output position p has a
true match length m = (r + p) % (k_max + 1); drafting k accepts min(k, m). Each draft pass costs
`draft_s`, each verify `verify_s`, each prefill `prefill_s`, all on the virtual clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from autospec.contract import DraftToken, StepOutcome
from autospec.engines.base import GenRequest, PrefillResult


@dataclass
class _Req:
    trace_id: int
    max_tokens: int
    context: int
    out: int = 0  # tokens generated in this incarnation
    done_before: int = 0  # tokens generated before a preemption (GenRequest.resumed_tokens)
    drafts: int = 0
    finished: bool = False


class ClockedFakeEngine:
    def __init__(self, k_max: int = 4, draft_s: float = 0.001, verify_s: float = 0.01, prefill_s: float = 0.005,
                 swap_s_per_token: float = 1e-5):
        self.k_max = k_max
        self.temperature = 0.0
        self.draft_s, self.verify_s, self.prefill_s = draft_s, verify_s, prefill_s
        self.swap_s_per_token = swap_s_per_token
        self.clock = 0.0
        self.reqs: dict[int, _Req] = {}
        self.next_id = 0
        self.draft_time = 0.0
        self.idle_calls: list[float] = []
        self.max_active = 0

    def now(self) -> float:
        return self.clock

    def idle_until(self, t: float) -> None:
        self.idle_calls.append(t)
        self.clock = max(self.clock, t)

    def swap_cost_s(self, context_tokens: int) -> float:
        return self.swap_s_per_token * context_tokens

    def _m(self, r: _Req) -> int:
        return (r.trace_id + r.done_before + r.out) % (self.k_max + 1)

    def true_match_len(self, req_id: int) -> int:
        return self._m(self.reqs[req_id])

    def add(self, requests: Sequence[GenRequest]) -> PrefillResult:
        ids, first, fin = [], [], []
        for g in requests:
            r = _Req(g.trace_id, g.max_tokens, len(g.prompt), done_before=g.resumed_tokens)
            rid = self.next_id
            self.next_id += 1
            self.reqs[rid] = r
            r.out = 1
            r.finished = r.out >= r.max_tokens
            ids.append(rid)
            first.append(1)
            fin.append(r.finished)
        self.max_active = max(self.max_active, len(self.reqs))
        self.clock += self.prefill_s
        return PrefillResult(ids, first, fin, self.prefill_s)

    def draft(self, req_ids: Sequence[int]) -> list[DraftToken]:
        for rid in req_ids:
            self.reqs[rid].drafts += 1
        self.clock += self.draft_s
        self.draft_time += self.draft_s
        return [DraftToken(2, 0.5, 1.0)] * len(req_ids)

    def verify(self, plan: Mapping[int, int]) -> StepOutcome:
        ids = list(plan)
        drafted, verified, accepted, committed, finished, probs, klds = [], [], [], [], [], [], []
        for rid in ids:
            r = self.reqs[rid]
            n = plan[rid]
            a = min(n, self._m(r))
            room = r.max_tokens - r.out
            c = min(a + 1, room)
            r.out += c
            r.finished = r.out >= r.max_tokens
            drafted.append(r.drafts)
            r.drafts = 0
            verified.append(n)
            accepted.append(a)
            committed.append([3] * c)
            finished.append(r.finished)
            probs.append([0.5] * n)
            klds.append([0.1] * n)
        self.clock += self.verify_s
        d, self.draft_time = self.draft_time, 0.0
        return StepOutcome(ids, drafted, verified, accepted, committed, finished, probs, klds, d, self.verify_s)

    def remove(self, req_ids: Sequence[int]) -> None:
        for rid in req_ids:
            del self.reqs[rid]

    def output(self, req_id: int) -> list[int]:
        return [3] * self.reqs[req_id].out

    def is_finished(self, req_id: int) -> bool:
        return self.reqs[req_id].finished
