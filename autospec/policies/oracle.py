"""Oracle length policy (docs/policies.md §8; docs/architecture.md, "sim").

Drafts exactly min(m, K_max) tokens, m the true match length at the request's position — every draft
is accepted and none is wasted. Only the simulator knows m (RequestView.true_match_len); the oracle
bounds what any length policy can achieve on a workload.
"""

from __future__ import annotations

from autospec.contract import StepContext
from autospec.errors import InputError
from autospec.policies.base import PolicyParams, TargetLengthPolicy, register_length


class OracleParams(PolicyParams):
    pass


@register_length("oracle")
class OracleLength(TargetLengthPolicy):
    """Draft the true match length (sim engine only)."""

    reads = frozenset({"true_match_len"})  # the simulator's m (Policy.reads)

    Params = OracleParams
    params: OracleParams

    def targets(self, ctx: StepContext) -> list[int]:
        out = []
        for r in ctx.requests:
            if r.true_match_len is None:
                raise InputError("the oracle length policy needs an engine that knows the true match "
                                 "length (the sim engine)", field="length.policy")
            out.append(min(r.true_match_len, ctx.k_max))
        return out
