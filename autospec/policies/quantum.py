"""Rounds each running request has run since its latest admission: the preemptive schedule policies'
minimum quantum (`min_rounds` of LAS, LAPS-SD and preemptive LP-SJF; docs/policies.md §7).

A preemption costs the request's re-prefill at re-admission (recompute, serving/loop.py), so evicting a
request before it has run a round wastes its whole prefill. `StintRounds` counts, per request the
policy admitted, the SD rounds it has run since; `protected(running)` names the running requests still
below `min_rounds`, which the policy pins (`Pick.from_order(pinned=...)`). A running request the policy
never saw admitted (a policy built mid-replay, a unit test handing it views) is not protected.
"""

from __future__ import annotations

from typing import Sequence

from autospec.contract import RequestView, StepOutcome
from autospec.policies.base import Pick

__all__ = ["StintRounds"]


class StintRounds:
    """Per request: SD rounds run since the policy last admitted it (module docstring)."""

    def __init__(self, min_rounds: int):
        self.min_rounds = min_rounds
        self._rounds: dict[int, int] = {}

    def rounds(self, req_id: int) -> int | None:
        """Rounds since its latest admission; None when it is not running under this policy's admission."""
        return self._rounds.get(req_id)

    def protected(self, running: Sequence[RequestView]) -> set[int]:
        """The running requests that have run fewer than `min_rounds` rounds since their admission."""
        rounds, need = self._rounds, self.min_rounds
        return {r.req_id for r in running if rounds.get(r.req_id, need) < need}

    def picked(self, pick: Pick, waiting: Sequence[RequestView]) -> None:
        """After a pick: the admitted start a stint at 0 rounds; the rest of the waiting have none."""
        rounds = self._rounds
        for r in waiting:
            rounds.pop(r.req_id, None)
        for rid in pick.preempt:
            rounds.pop(rid, None)
        for rid in pick.admit:
            rounds[rid] = 0

    def observe(self, outcome: StepOutcome) -> None:
        rounds = self._rounds
        for rid, done in zip(outcome.req_ids, outcome.finished):
            if done:
                rounds.pop(rid, None)
            elif rid in rounds:
                rounds[rid] += 1
