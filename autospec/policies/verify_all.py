"""The default verify policy: send every drafted token to the target (docs/policies.md §1)."""

from __future__ import annotations

from autospec.contract import DraftState, StepContext
from autospec.policies.base import PolicyParams, VerifyPolicyBase, register_verify


class VerifyAllParams(PolicyParams):
    pass


@register_verify("all")
class VerifyAll(VerifyPolicyBase):
    """Verify all drafted tokens of every request."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = VerifyAllParams
    params: VerifyAllParams

    def select(self, ctx: StepContext, drafts: DraftState) -> list[int]:
        return drafts.lengths()
