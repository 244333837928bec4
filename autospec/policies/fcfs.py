"""First come, first served (the serving default; docs/policies.md §7 baseline).

Running requests keep their slots; free slots go to waiting requests in arrival order. Never preempts.
"""

from __future__ import annotations

from itertools import islice
from operator import attrgetter
from typing import Sequence

from autospec.contract import RequestView
from autospec.policies.base import Pick, PolicyParams, SchedulePolicyBase, register_schedule


class FcfsParams(PolicyParams):
    pass


_ARRIVAL = attrgetter("arrival_s", "req_id")


def arrival_order(requests: Sequence[RequestView]) -> list[int]:
    return [r.req_id for r in sorted(requests, key=_ARRIVAL)]


@register_schedule("fcfs")
class FcfsSchedule(SchedulePolicyBase):
    """FCFS, non-preemptive."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = FcfsParams
    params: FcfsParams

    def pick(self, now: float, waiting: Sequence[RequestView], running: Sequence[RequestView],
             slots: int) -> Pick:
        # Same decision as Pick.from_order(arrival order, pinned=running), but O(free slots) in the
        # queue: `waiting` arrives in arrival order (SchedulePolicy contract), so the next requests
        # to admit are its head. A replay whose queue holds thousands stays O(batch) per step.
        run = arrival_order(running)
        free = slots - len(run)
        if free <= 0:
            return Pick(run=tuple(run[:slots]), preempt=tuple(run[slots:]))
        admit = tuple(r.req_id for r in islice(waiting, free))
        return Pick(run=tuple(run) + admit, admit=admit)
