"""AdaSpec (Huang et al., SoCC'25): goodput-driven drafter and confidence-prior verifier (docs/policies.md §2).

* `goodput` — Alg. 3: G(k) = Σ_i Σ_{j=0..k_i} AR_ij / T_sd(k), AR_i0 = 1, AR_ij = Π_{l<=j} c_il;
  G = −1 when an SLO TPOT is set and T_sd > TPOT.
* `AdaSpecDrafter` ("adaspec" length policy) — Alg. 1, predict-execute-correct, batch-level: every
  request drafts the same k. "AdaSpec-" is this drafter with the `all` verifier.
* `AdaSpecVerifier` ("adaspec" verify policy) — Alg. 2: drop the tail token with the smallest AR_ij
  while that raises G.

Both need the fitted AdaSpec linear time model (autospec.latency) in StepContext.latency_model.
"""

from __future__ import annotations

import heapq
from typing import Sequence

from pydantic import Field

from autospec.contract import DraftState, LatencyModel, StepContext
from autospec.latency import sd_step_time, sd_step_time_of_total
from autospec.policies.base import (
    LengthPolicyBase,
    PolicyParams,
    VerifyPolicyBase,
    batch_context_tokens,
    register_length,
    register_verify,
    require_latency_model,
)


def cumulative_acceptance(confidences: Sequence[float]) -> list[float]:
    """AR_i1..AR_ik: the running product of a request's draft confidences."""
    out, prod = [], 1.0
    for c in confidences:
        prod *= c
        out.append(prod)
    return out


def goodput(ar_rows: Sequence[Sequence[float]], ks: Sequence[int], step_time_s: float,
            slo_tpot_s: float | None = None) -> float:
    """AdaSpec Alg. 3: expected committed tokens per second if request i verifies ks[i] tokens.

    ar_rows[i] holds AR_i1.. (at least ks[i] values); AR_i0 = 1 is the token the target always adds.
    """
    return goodput_of(sum(1.0 + sum(ar[:k]) for ar, k in zip(ar_rows, ks)), step_time_s, slo_tpot_s)


def goodput_of(expected_tokens: float, step_time_s: float, slo_tpot_s: float | None = None) -> float:
    """`goodput` from its numerator, Σ_i (1 + Σ_{j<k_i} AR_ij): −1 when the step breaks the TPOT SLO."""
    if slo_tpot_s is not None and step_time_s > slo_tpot_s:
        return -1.0
    return expected_tokens / step_time_s


class AdaSpecDrafterParams(PolicyParams):
    # [chosen, from the authors' code] c̄ before any confidence has been observed.
    initial_confidence: float = Field(0.6, gt=0.0, lt=1.0)


@register_length("adaspec")
class AdaSpecDrafter(LengthPolicyBase):
    """AdaSpec Alg. 1 (predict-execute-correct), asked one token at a time by the loop:

    g = G(0); for k = 1..K_max: predict G(k) with next confidence c̄ (stop if < g); draft one token
    for every request; correct with the real confidences (stop if G(k) < g, keeping the tokens
    [chosen]); g = G(k). c̄ is the running mean of every observed draft confidence.
    """

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = AdaSpecDrafterParams
    params: AdaSpecDrafterParams

    def __init__(self, **params: object) -> None:
        super().__init__(**params)
        self._conf_sum = 0.0
        self._conf_n = 0
        self._g = 0.0
        self._k = 0
        self._stopped = False
        self.steps = 0  # steps it decided (batch > 0)
        # steps where it drafted nothing because any drafted step was predicted to exceed the TPOT SLO
        # (Alg. 3 returns −1): the paper's rule, reported as a finding (`findings`)
        self.slo_refusals = 0
        # steps where even a step without drafts was predicted to exceed the TPOT SLO: G = −1 for every
        # k, so the rule cannot choose; ties keep drafting (Alg. 1 stops only when G falls), to K_max
        self.slo_unmeetable = 0
        self._slo_tpot_s: float | None = None

    @property
    def mean_confidence(self) -> float:
        return self._conf_sum / self._conf_n if self._conf_n else self.params.initial_confidence

    def _goodput(self, ctx: StepContext, model: LatencyModel, confs: Sequence[Sequence[float]]) -> float:
        ks = [len(c) for c in confs]
        t = sd_step_time(model, ks, batch_context_tokens(ctx))
        return goodput([cumulative_acceptance(c) for c in confs], ks, t, ctx.slo_tpot_s)

    def begin_step(self, ctx: StepContext) -> None:
        model = require_latency_model(ctx, "adaspec")
        self._k = 0
        self._stopped = ctx.batch_size == 0
        self._g = self._goodput(ctx, model, [[] for _ in ctx.requests])
        self.steps += ctx.batch_size > 0
        self.slo_unmeetable += ctx.batch_size > 0 and self._g == -1.0
        self._slo_tpot_s = ctx.slo_tpot_s

    def keep_drafting(self, ctx: StepContext, drafts: DraftState) -> list[bool]:
        n = len(drafts.req_ids)
        if self._stopped:
            return [False] * n
        model = require_latency_model(ctx, "adaspec")
        k = max(drafts.lengths(), default=0)
        if k > self._k:
            # correct: the tokens just drafted replace the prediction with real confidences
            for confs in drafts.confidences:
                new = confs[self._k:k]
                self._conf_sum += sum(new)
                self._conf_n += len(new)
            self._k = k
            g_real = self._goodput(ctx, model, drafts.confidences)
            if g_real < self._g:
                return self._stop(n)
            self._g = g_real
        if k + 1 > ctx.k_max:
            return self._stop(n)
        # predict: would one more token, at the mean confidence, raise goodput?
        c_bar = self.mean_confidence
        g_pred = self._goodput(ctx, model, [list(c) + [c_bar] for c in drafts.confidences])
        if g_pred < self._g:
            if k == 0 and g_pred == -1.0:
                self.slo_refusals += 1
            return self._stop(n)
        return [True] * n

    def findings(self) -> list[str]:
        """What this run showed about the paper's rule: how often the SLO rule alone kept it from drafting,
        and how often the SLO was out of reach even without drafts (the rule then cannot choose)."""
        if self._slo_tpot_s is None:  # both need an SLO
            return []
        slo_ms = f"{self._slo_tpot_s * 1000:.0f} ms"
        out = []
        if self.slo_unmeetable:
            out.append(f"AdaSpec's SLO rule could not choose in {self.slo_unmeetable / self.steps:.0%} of its steps "
                       f"({self.slo_unmeetable} of {self.steps}): even a step without drafts was predicted to exceed "
                       f"the TPOT SLO ({slo_ms}), so its goodput estimator is −1 for every draft length, and on a tie "
                       "Alg. 1 keeps drafting (to K_max). The SLO is below what this engine serves at those batch "
                       "sizes; a finding, not a bug.")
        if not self.slo_refusals:
            return out
        share = self.slo_refusals / self.steps
        return out + [f"AdaSpec drafted nothing in {share:.0%} of its steps ({self.slo_refusals} "
                f"of {self.steps}): its goodput estimator returns −1 whenever a drafted step is predicted to "
                f"exceed the TPOT SLO ({slo_ms}) — the paper's rule (Alg. 3), so on those "
                "steps it serves as no-SD. A finding, not a bug."]

    def _stop(self, n: int) -> list[bool]:
        self._stopped = True
        return [False] * n


class AdaSpecVerifierParams(PolicyParams):
    pass


@register_verify("adaspec")
class AdaSpecVerifier(VerifyPolicyBase):
    """AdaSpec Alg. 2 (confidence-prior verifier): repeatedly remove, among all requests' tail tokens,
    the one with the smallest cumulative acceptance AR_ij while removing it raises G; removing only
    tails keeps every request's verified tokens a contiguous prefix. The draft passes already ran,
    so T_sd keeps their cost and only the verify pass shrinks."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = AdaSpecVerifierParams
    params: AdaSpecVerifierParams

    def select(self, ctx: StepContext, drafts: DraftState) -> list[int]:
        model = require_latency_model(ctx, "adaspec verifier")
        ks = list(drafts.lengths())
        if not ks:
            return []
        ars = [cumulative_acceptance(c) for c in drafts.confidences]
        n_c = batch_context_tokens(ctx)
        steps, b = max(ks), len(ks)
        # Alg. 2 removes up to Σ k_i tails, and G over the whole batch costs O(b·K): kept incrementally.
        # G's numerator is Σ_i (1 + Σ_{j<k_i} AR_ij) and T_sd depends on Σ k_i alone (the draft passes
        # already ran), so a removal changes one request's term and the total. Each term is the prefix
        # sum `goodput` takes, and the terms are summed in request order as it sums them: the same floats,
        # so the same choices as evaluating `goodput` on every trial.
        prefix = []  # prefix[i][k] = 1 + Σ_{j<k} AR_ij
        for ar in ars:
            partial: float = 0
            row = [1.0]
            for a in ar:
                partial = partial + a
                row.append(1.0 + partial)
            prefix.append(row)
        terms = [prefix[i][k] for i, k in enumerate(ks)]
        total = sum(ks)

        def g_of(drafted_total: int) -> float:
            step_s = sd_step_time_of_total(model, b, drafted_total, n_c, steps)
            return goodput_of(sum(terms), step_s, ctx.slo_tpot_s)

        g = g_of(total)
        tails = [(ars[i][k - 1], i) for i, k in enumerate(ks) if k > 0]  # each request's last kept token
        heapq.heapify(tails)  # the smallest AR_ij first; ties to the lower request index, as min() would
        while tails:
            _, i = tails[0]
            terms[i] = prefix[i][ks[i] - 1]  # the trial: request i without its tail
            g_trial = g_of(total - 1)
            if g_trial <= g:
                break
            ks[i] -= 1
            total -= 1
            g = g_trial
            if ks[i] > 0:
                heapq.heapreplace(tails, (ars[i][ks[i] - 1], i))
            else:
                heapq.heappop(tails)
        return ks
