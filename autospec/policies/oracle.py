"""The cost-aware oracle `oracle` (docs/policies.md §8): the bound on length policies.

It knows what no deployable policy can: each request's true match length m_i at its position (at T>0
the simulator's realised acceptance run under the strategy's proposal rule, drawn from common random
numbers per (request, position) — `SimEngine.true_match_len`) and the engine's own step clock
(`StepContext.step_clock`, the `StepClock` capability: the simulator's fitted clock). Each step it
drafts the lengths that maximise this step's committed tokens per second,

    max over k   Σ_i (k_i + 1) / T_step(contexts, k)

where every draft is accepted (k_i ≤ m_i) and T_step is the time of the draft rounds plus one verify
pass. Drafting beyond m_i never helps (the extra drafts are rejected but paid for), so k_i ≤ m_i.

Search [chosen]: over the number of draft rounds L = 0..K_max, each request drafting k_i = min(m_i, L).
The rounds are where drafting stops paying — each costs a fixed δ_d (and λ·log2 of its batch) however
few requests reach it, which is why `oracle-m` (k_i = m_i always) loses to it on large batches and
expensive drafts; L = 0 is "do not draft". Within a round every request's extra token costs nearly the
same (α_d per context token is second order), so per-request caps below L are not searched. Ties go to
fewer rounds. The step clock is called K_max + 1 times per step.

Myopic [chosen]: the step's tokens per second, not the replay's — the issue's definition of the bound.
A length policy never changes which requests run (FCFS), so the per-step rate is what it controls.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from autospec.contract import StepContext
from autospec.errors import InputError
from autospec.policies.base import PolicyParams, TargetLengthPolicy, register_length
from autospec.policies.oracle_m import true_match_lengths


class CostAwareOracleParams(PolicyParams):
    pass


@register_length("oracle")
class CostAwareOracleLength(TargetLengthPolicy):
    """Draft the lengths that maximise the step's committed tokens per second (sim engine only)."""

    reads = frozenset({"true_match_len", "step_clock"})  # the simulator's m and clock (Policy.reads)

    Params = CostAwareOracleParams
    params: CostAwareOracleParams

    def targets(self, ctx: StepContext) -> list[int]:
        clock = ctx.step_clock
        if clock is None:
            raise InputError("the oracle length policy needs an engine that knows its own step clock (the sim "
                             "engine)", field="length.policy")
        matches = np.asarray(true_match_lengths(ctx, "oracle"), np.int64)
        contexts = np.asarray([r.context_len for r in ctx.requests], np.int64)
        return self.match_lengths(matches, contexts, clock).tolist()

    def match_lengths(self, matches: np.ndarray, contexts: np.ndarray,
                      clock: Callable[[Any, Any], float]) -> np.ndarray:  # MatchLengthPolicy
        n = len(matches)
        best = np.zeros(n, np.int64)
        best_rate = n / clock(contexts, best)
        for rounds in range(1, int(matches.max(initial=0)) + 1):
            lengths = np.minimum(matches, rounds)
            rate = (n + int(lengths.sum())) / clock(contexts, lengths)
            if rate > best_rate:
                best, best_rate = lengths, rate
        return best
