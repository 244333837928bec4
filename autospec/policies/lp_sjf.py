"""Length-predicted shortest job first (LP-SJF; docs/policies.md §7 baseline).

Requests are ordered by predicted remaining output tokens (prediction − generated), ties by arrival.
Non-preemptive by default [chosen]: running requests keep their slots and free slots go to the
shortest waiting jobs; `preemptive = true` makes it shortest-remaining-first over everyone, except that
a (re-)admitted request runs `min_rounds` rounds before it may be preempted [chosen; 1: the round its
prefill was paid for] (policies/quantum.py).
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic import Field

from autospec.contract import RequestView, StepOutcome
from autospec.policies.base import Pick, PolicyParams, SchedulePolicyBase, register_schedule
from autospec.policies.output_length import OracleNoisePredictor, PredictedLengths
from autospec.policies.quantum import StintRounds


class LpSjfParams(PolicyParams):
    preemptive: bool = False  # [chosen]
    predictor_sigma: float = Field(0.07, ge=0.0)  # lognormal error of the oracle predictor [chosen]
    predictor_seed: int = 0
    min_rounds: int = Field(1, ge=1)  # preemptive only: rounds before a (re-)admitted request may be preempted [chosen]


@register_schedule("lp-sjf")
class LpSjfSchedule(SchedulePolicyBase):
    """SJF on predicted remaining length."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = LpSjfParams
    params: LpSjfParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.lengths = PredictedLengths(OracleNoisePredictor(self.params.predictor_sigma,
                                                             self.params.predictor_seed))
        self.stints = StintRounds(self.params.min_rounds)

    def pick(self, now: float, waiting: Sequence[RequestView], running: Sequence[RequestView],
             slots: int) -> Pick:
        def key(r: RequestView) -> tuple[float, float, int]:
            return (self.lengths.remaining(r), r.arrival_s, r.req_id)

        order = [r.req_id for r in sorted([*running, *waiting], key=key)]
        if self.params.preemptive:
            protected = self.stints.protected(running)
            pinned = [r for r in order if r in protected]
        else:
            pinned = [r.req_id for r in sorted(running, key=key)]
        pick = Pick.from_order(order, waiting, running, slots, pinned=pinned)
        self.stints.picked(pick, waiting)
        return pick

    def observe(self, outcome: StepOutcome) -> None:
        self.stints.observe(outcome)
        for rid, done in zip(outcome.req_ids, outcome.finished):
            if done:
                self.lengths.forget(rid)
