"""Confidence-threshold drafter, the baseline of AdaSpec's evaluation (docs/policies.md §2, authors' code).

Keep drafting while the batch's mean confidence of the latest draft token is at least the threshold,
up to `max_len` tokens. Batch-level, like the AdaSpec drafter it is compared with.
"""

from __future__ import annotations

from pydantic import Field

from autospec.contract import DraftState, StepContext
from autospec.policies.base import LengthPolicyBase, PolicyParams, register_length


class ThresholdParams(PolicyParams):
    threshold: float = Field(0.6, ge=0.0, le=1.0)  # [authors' code]
    max_len: int = Field(8, ge=1)  # [authors' code]; also clipped to K_max


@register_length("threshold")
class ThresholdLength(LengthPolicyBase):
    """Draft while mean(last-token confidence over the batch) >= threshold, at most max_len."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = ThresholdParams
    params: ThresholdParams

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        self._stopped = False

    def begin_step(self, ctx: StepContext) -> None:
        self._stopped = False

    def keep_drafting(self, ctx: StepContext, drafts: DraftState) -> list[bool]:
        n = len(drafts.req_ids)
        k = max(drafts.lengths(), default=0)
        if self._stopped or n == 0 or k >= min(self.params.max_len, ctx.k_max):
            self._stopped = True
            return [False] * n
        if k > 0:
            last = [c[-1] for c in drafts.confidences if c]
            if sum(last) / len(last) < self.params.threshold:
                self._stopped = True
                return [False] * n
        return [True] * n
