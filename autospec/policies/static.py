"""Static draft length and plain decoding (docs/policies.md §1).

Every request drafts exactly K tokens each step, verify all (with the `all` verify policy). K = 0 is
plain autoregressive decoding, the speedup denominator; `none` is the same thing without a knob.
"""

from __future__ import annotations

from pydantic import Field

from autospec.contract import StepContext
from autospec.policies.base import PolicyParams, TargetLengthPolicy, register_length


class StaticParams(PolicyParams):
    # [chosen] default; presets static-k1..k8 set it; above the replay's K_max it is refused
    # (strategy.check_k_max), and the policy clips only as a last guard
    k: int = Field(4, ge=0)


@register_length("static")
class StaticLength(TargetLengthPolicy):
    """Draft min(k, K_max) tokens for every request (static baseline)."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = StaticParams
    params: StaticParams

    def targets(self, ctx: StepContext) -> list[int]:
        return [self.uniform_length(ctx.batch_size)] * ctx.batch_size

    def uniform_length(self, batch_size: int) -> int:  # UniformLengthPolicy
        return self.params.k


class NoDraftParams(PolicyParams):
    pass


@register_length("none")
class NoDraft(TargetLengthPolicy):
    """Plain autoregressive decoding: never draft (the no-SD baseline)."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = NoDraftParams
    params: NoDraftParams

    def targets(self, ctx: StepContext) -> list[int]:
        return [0] * ctx.batch_size

    def uniform_length(self, batch_size: int) -> int:  # UniformLengthPolicy
        return 0
