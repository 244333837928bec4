"""The match-length oracle `oracle-m` (docs/policies.md §8; docs/architecture.md, "sim").

Drafts exactly min(m, K_max) tokens, m the true match length at the request's position (at T>0 the
simulator's realised acceptance run, `SimEngine.true_match_len`) — every draft is accepted and none is
wasted. Only the simulator knows m (RequestView.true_match_len). It is not a bound on length policies:
it drafts m even when a draft round costs more than it saves (large batches, expensive drafts), where
drafting less is faster. The cost-aware oracle (`oracle`, policies/oracle.py) is the bound.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from autospec.contract import StepContext
from autospec.errors import InputError
from autospec.policies.base import PolicyParams, TargetLengthPolicy, register_length


class MatchOracleParams(PolicyParams):
    pass


@register_length("oracle-m")
class MatchOracleLength(TargetLengthPolicy):
    """Draft the true match length (sim engine only)."""

    reads = frozenset({"true_match_len"})  # the simulator's m (Policy.reads)

    Params = MatchOracleParams
    params: MatchOracleParams

    def targets(self, ctx: StepContext) -> list[int]:
        return true_match_lengths(ctx, "oracle-m")

    def match_lengths(self, matches: np.ndarray, contexts: np.ndarray,
                      clock: Callable[[Any, Any], float]) -> np.ndarray:  # MatchLengthPolicy
        return matches


def true_match_lengths(ctx: StepContext, policy: str) -> list[int]:
    """Each request's true match length capped at K_max (both oracles' signal); an InputError naming
    `policy` when the engine does not know it."""
    out = []
    for r in ctx.requests:
        if r.true_match_len is None:
            raise InputError(f"the {policy} length policy needs an engine that knows the true match length "
                             "(the sim engine)", field="length.policy")
        out.append(min(r.true_match_len, ctx.k_max))
    return out
