"""AdaEDL: early draft stopping from an entropy lower bound on acceptance (Agrawal et al. 2024;
docs/policies.md §8).

1 − sqrt(γ·H(q_j)) lower-bounds the acceptance probability of the token drafted from q_j; drafting
stops when it drops below λ. λ adapts each round toward a target acceptance:
AR = β1·AR + (1 − β1)·accepted/drafted; λ' = λ + ε if AR < target else λ − ε; λ = β2·λ + (1 − β2)·λ'.

The engine reports a token's entropy with the token, so the stop lands after the token whose
distribution failed the bound; that token is still verified (its draft pass is already spent and
verifying it cannot lose tokens), one more than the paper's drafter would send.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from autospec.contract import DraftState, StepContext, StepOutcome
from autospec.policies.base import LengthPolicyBase, PolicyParams, register_length


class AdaEdlParams(PolicyParams):
    gamma: float = Field(0.2, gt=0.0)  # entropy factor of the bound [paper]
    initial_lambda: float = Field(0.5, ge=0.0, le=1.0)  # [chosen]
    initial_ar: float = Field(0.9, ge=0.0, le=1.0)  # [chosen: start at the target, no initial drift]
    target_ar: float = Field(0.9, gt=0.0, le=1.0)  # [chosen]
    ar_smoothing: float = Field(0.5, ge=0.0, lt=1.0)  # β1 [chosen]
    lambda_smoothing: float = Field(0.9, ge=0.0, lt=1.0)  # β2 [chosen]
    lambda_step: float = Field(0.01, gt=0.0)  # ε [chosen]


def acceptance_bound(entropy: float, gamma: float = 0.2) -> float:
    """1 − sqrt(γ·H): AdaEDL's lower bound on the token's acceptance probability."""
    return 1.0 - math.sqrt(gamma * max(entropy, 0.0))


@register_length("adaedl")
class AdaEdlLength(LengthPolicyBase):
    """Per request: keep drafting while the latest token's bound is >= λ, up to K_max."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = AdaEdlParams
    params: AdaEdlParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.lam = self.params.initial_lambda
        self.ar = self.params.initial_ar
        self._stopped: set[int] = set()

    def begin_step(self, ctx: StepContext) -> None:
        self._stopped = set()

    def keep_drafting(self, ctx: StepContext, drafts: DraftState) -> list[bool]:
        out = []
        for rid, ents in zip(drafts.req_ids, drafts.entropies):
            if rid not in self._stopped and (len(ents) >= ctx.k_max or (
                    ents and acceptance_bound(ents[-1], self.params.gamma) < self.lam)):
                self._stopped.add(rid)
            out.append(rid not in self._stopped)
        return out

    def observe(self, ctx: StepContext, outcome: StepOutcome) -> None:
        drafted = sum(outcome.drafted)
        if drafted == 0:
            return
        p = self.params
        self.ar = p.ar_smoothing * self.ar + (1.0 - p.ar_smoothing) * sum(outcome.accepted) / drafted
        proposal = self.lam + p.lambda_step if self.ar < p.target_ar else self.lam - p.lambda_step
        self.lam = p.lambda_smoothing * self.lam + (1.0 - p.lambda_smoothing) * proposal
