"""Least attained service (LAS), preemptive (docs/policies.md §7 baseline).

Every step the slots go to the requests with the least attained service (RequestView.attained_service_s,
kept by the serving loop), ties by arrival. Running requests that lose their slot are preempted; the
loop charges the KV switch cost. Needs no output-length prediction.
"""

from __future__ import annotations

from typing import Sequence

from autospec.contract import RequestView
from autospec.policies.base import Pick, PolicyParams, SchedulePolicyBase, register_schedule


class LasParams(PolicyParams):
    pass


@register_schedule("las")
class LasSchedule(SchedulePolicyBase):
    """LAS: least attained service first, preemptive."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = LasParams
    params: LasParams

    def pick(self, now: float, waiting: Sequence[RequestView], running: Sequence[RequestView],
             slots: int) -> Pick:
        everyone = sorted([*running, *waiting], key=lambda r: (r.attained_service_s, r.arrival_s, r.req_id))
        return Pick.from_order([r.req_id for r in everyone], waiting, running, slots)
