"""Least attained service (LAS), preemptive (docs/policies.md §7 baseline).

Every step the slots go to the requests with the least attained service (RequestView.attained_service_s,
kept by the serving loop and kept across preemptions), ties by arrival. Running requests that lose their
slot are preempted; on re-admission the loop re-prefills their context (recompute). Needs no
output-length prediction.

This is the classic discipline at round granularity, and under load it round-robins: a request that
ran one round has more attained service than every request still waiting, so each round the batch is
swapped for the least-served waiting requests, and each swap costs a re-prefill of the evicted
request's context. That thrash is LAS's, not the loop's (benchmarks/scheduling_thrash.py measures it).
`min_rounds` [chosen] lets a (re-)admitted request run that many rounds before it may be preempted —
a quantum the classic discipline does not have; the default, 1, only guarantees the round a prefill
was paid for (it matters when the engine runs admissions' prefills inside a step, where a request
admitted this iteration has not yet run a round).
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic import Field

from autospec.contract import RequestView, StepOutcome
from autospec.policies.base import Pick, PolicyParams, SchedulePolicyBase, register_schedule
from autospec.policies.quantum import StintRounds


class LasParams(PolicyParams):
    # rounds a (re-)admitted request runs before it may be preempted [chosen; 1 = preempt at any
    # round boundary after the first, as the classic discipline at round granularity]
    min_rounds: int = Field(1, ge=1)


@register_schedule("las")
class LasSchedule(SchedulePolicyBase):
    """LAS: least attained service first, preemptive."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = LasParams
    params: LasParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.stints = StintRounds(self.params.min_rounds)

    def pick(self, now: float, waiting: Sequence[RequestView], running: Sequence[RequestView],
             slots: int) -> Pick:
        everyone = sorted([*running, *waiting], key=lambda r: (r.attained_service_s, r.arrival_s, r.req_id))
        order = [r.req_id for r in everyone]
        protected = self.stints.protected(running)
        pick = Pick.from_order(order, waiting, running, slots, pinned=[r for r in order if r in protected])
        self.stints.picked(pick, waiting)
        return pick

    def observe(self, outcome: StepOutcome) -> None:
        self.stints.observe(outcome)
