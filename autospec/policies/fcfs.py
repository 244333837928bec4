"""First come, first served (the serving default; POLICIES.md §7 baseline).

Running requests keep their slots; free slots go to waiting requests in arrival order. Never preempts.
"""

from __future__ import annotations

from typing import Sequence

from autospec.contract import RequestView
from autospec.policies.base import Pick, PolicyParams, SchedulePolicyBase, register_schedule


class FcfsParams(PolicyParams):
    pass


def arrival_order(requests: Sequence[RequestView]) -> list[int]:
    return [r.req_id for r in sorted(requests, key=lambda r: (r.arrival_s, r.req_id))]


@register_schedule("fcfs")
class FcfsSchedule(SchedulePolicyBase):
    """FCFS, non-preemptive."""

    Params = FcfsParams
    params: FcfsParams

    def pick(self, now: float, waiting: Sequence[RequestView], running: Sequence[RequestView],
             slots: int) -> Pick:
        return Pick.from_order(arrival_order(list(running) + list(waiting)), waiting, running, slots,
                               pinned=arrival_order(running))
