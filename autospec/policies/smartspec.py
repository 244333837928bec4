"""SmartSpec (Liu et al. 2024, "Optimizing speculative decoding for serving LLMs using goodput";
docs/policies.md §8).

One draft length for the whole batch: k* = argmax_{k=0..K} b·(1 − α^(k+1))/(1 − α) / (T_draft(k) +
T_target(k)), the expected committed tokens of b requests over the step time, with α the running
token acceptance rate (start 0.7; reset to 0.65 when it falls below 0.3 [authors' code]).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from autospec.contract import LatencyModel, StepContext, StepOutcome
from autospec.errors import InputError
from autospec.policies.base import PolicyParams, TargetLengthPolicy, batch_context_tokens, register_length


class SmartSpecParams(PolicyParams):
    initial_acceptance: float = Field(0.7, gt=0.0, le=1.0)  # [authors' code]
    reset_below: float = Field(0.3, ge=0.0, le=1.0)  # [authors' code]
    reset_to: float = Field(0.65, gt=0.0, le=1.0)  # [authors' code]
    ewma_weight: float = Field(0.5, gt=0.0, le=1.0)  # weight of the newest step in α [chosen]


def expected_tokens(alpha: float, k: int, batch: int) -> float:
    """b·(1 − α^(k+1))/(1 − α): expected committed tokens with k drafts (the limit b·(k+1) at α = 1)."""
    if alpha >= 1.0:
        return batch * (k + 1.0)
    return batch * (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def smartspec_goodput(model: LatencyModel, alpha: float, k: int, batch: int, context_tokens: float) -> float:
    step = model.draft_time(batch, context_tokens, k) + model.verify_time(batch, context_tokens, k + 1)
    return expected_tokens(alpha, k, batch) / step


@register_length("smartspec")
class SmartSpecLength(TargetLengthPolicy):
    """SmartSpec's goodput-maximising batch draft length."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = SmartSpecParams
    params: SmartSpecParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.alpha = self.params.initial_acceptance

    def best_k(self, ctx: StepContext) -> int:
        return self.step_length(ctx.batch_size, batch_context_tokens(ctx), ctx.k_max, ctx.latency_model)

    def step_length(self, batch_size: int, context_tokens: float, k_max: int,
                    latency_model: LatencyModel | None) -> int:  # TotalsLengthPolicy
        if latency_model is None:
            raise InputError("the smartspec policy needs a fitted latency model (run `autospec fit`)",
                             field="latency_model")
        scores = [smartspec_goodput(latency_model, self.alpha, k, batch_size, context_tokens)
                  for k in range(k_max + 1)]
        return max(range(len(scores)), key=lambda k: (scores[k], -k))  # ties go to the shorter draft

    def targets(self, ctx: StepContext) -> list[int]:
        if ctx.batch_size == 0:
            return []
        return [self.best_k(ctx)] * ctx.batch_size

    def observe(self, ctx: StepContext, outcome: StepOutcome) -> None:
        self.observe_totals(sum(outcome.verified), sum(outcome.accepted))

    def observe_totals(self, verified: int, accepted: int) -> None:  # TotalsLengthPolicy
        if verified == 0:
            return
        w = self.params.ewma_weight
        self.alpha = w * accepted / verified + (1.0 - w) * self.alpha
        if self.alpha < self.params.reset_below:
            self.alpha = self.params.reset_to
