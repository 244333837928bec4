"""DSpark prefix scheduler (Cheng et al., DeepSeek; docs/policies.md §6) — verify policies.

The verify budget is spent on the draft tokens most likely to survive: a_rj, the chance that request
r's first j tokens are all accepted, from the draft's confidences through a calibrator
(`autospec.policies.calibrators`: the one `autospec fit` chose — isotonic, Platt or DSpark's STS —
when a fit is given; Π_{i<=j} c_ri, the raw confidences, without). Throughput of verifying B tokens in
total is Θ = τ·SPS(B), τ the expected committed tokens, SPS(B) engine steps per second: the profiled
table from the fit, else from the fitted latency model.

Defaults from the fit: `calibration`, `sps_tokens` and `sps_values` left empty in a preset are filled
from the run's fit/models.json wherever a strategy is built for a replay with a fit
(`autospec.strategy.apply_fit`, `DsparkParams.with_fit`); a run without one says it is uncalibrated
(`autospec.strategy.uncalibrated_warnings`).

* "dspark" — the lossless synchronous form (Alg. 1): admit tokens in survival order while Θ rises
  and stop at the first one that does not help. The early stop is what keeps the output distribution
  the target's: the decision to verify token j then depends only on tokens the target will judge
  (App. A).
* "dspark-async" — the production form (§5.2): the budget K is the global argmax of Θ (no early
  stop) computed from confidences `lag` steps old (two in the paper), then the top-K current
  survivals are verified.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable, ClassVar, Mapping, Sequence, cast

import numpy as np
from pydantic import Field, model_validator

from autospec.contract import DraftState, StepContext
from autospec.errors import InputError
from autospec.policies.base import PolicyParams, VerifyPolicyBase, batch_context_tokens, register_verify
from autospec.policies.calibrators import Calibrator, IdentityCalibrator, StsCalibrator

Sps = Callable[[int], float]


class DsparkParams(PolicyParams):
    # SPS(B) from the profile: steps per second at B verification tokens (interpolated in B).
    sps_tokens: list[int] = Field(default_factory=list)
    sps_values: list[float] = Field(default_factory=list)
    # The calibrator of the draft confidences (autospec.policies.calibrators: {kind = "isotonic", x, y},
    # {kind = "platt", coef}, {kind = "sts", temperatures}, {kind = "identity"}); unset = the fit's chosen
    # one when the run has a fit (apply_fit), else the raw confidences.
    calibration: Calibrator | None = None
    # STS temperatures per draft position given by hand (the same as calibration = {kind = "sts", ...});
    # [] = the calibration above.
    temperatures: list[float] = Field(default_factory=list)

    # Parameters a fit supplies when a preset leaves them empty (autospec.strategy.apply_fit).
    fitted: ClassVar[tuple[str, ...]] = ("calibration", "sps_tokens", "sps_values")

    @model_validator(mode="after")
    def _table(self) -> "DsparkParams":
        if len(self.sps_tokens) != len(self.sps_values):
            raise ValueError("sps_tokens and sps_values need the same length")
        if any(b < 1 for b in self.sps_tokens) or any(
                b2 <= b1 for b1, b2 in zip(self.sps_tokens, self.sps_tokens[1:])):
            raise ValueError("sps_tokens must be increasing and >= 1")
        if any(v <= 0 for v in self.sps_values):
            raise ValueError("sps_values must be positive")
        if any(t <= 0 for t in self.temperatures):
            raise ValueError("temperatures must be positive")
        if self.temperatures and self.calibration is not None:
            raise ValueError("give calibration or temperatures, not both")
        return self

    @classmethod
    def with_fit(cls, params: Mapping[str, Any], fit: Mapping[str, Any]) -> dict[str, Any]:
        """`params` with the fit's values (FitResult.policy_inputs) where the preset left them empty: the
        calibrator unless the preset gives one (or STS temperatures), the SPS table unless it gives one."""
        out = dict(params)
        if not out.get("calibration") and not out.get("temperatures") and fit.get("calibration"):
            out["calibration"] = fit["calibration"]
        if not out.get("sps_tokens") and not out.get("sps_values") and fit.get("sps_tokens"):
            out["sps_tokens"], out["sps_values"] = list(fit["sps_tokens"]), list(fit["sps_values"])
        return out

    @property
    def calibrator(self) -> Calibrator:
        """What turns confidences into survivals: `calibration`, else STS of `temperatures`, else raw."""
        if self.calibration is not None:
            return self.calibration
        return StsCalibrator(temperatures=self.temperatures) if self.temperatures else IdentityCalibrator()

    @property
    def calibrated(self) -> bool:
        """False when the survivals are the raw confidences (no fit's and no preset's calibrator)."""
        return self.calibrator.kind != "identity"


class DsparkAsyncParams(DsparkParams):
    lag: int = Field(2, ge=0)  # age in steps of the confidences that size the budget [paper §5.2]


def table_sps(tokens: Sequence[int], values: Sequence[float]) -> Sps:
    """SPS(B) by linear interpolation of the profiled table. Past its end SPS falls as 1/B (the engine
    is assumed saturated: tokens per second stay flat) [chosen]; before its start SPS is flat."""
    xs, ys = np.asarray(tokens, float), np.asarray(values, float)

    def sps(b):
        # works on one B or an array of them (global_argmax_budget evaluates all budgets at once)
        b_arr = np.asarray(b, float)
        out = np.where(b_arr > xs[-1], ys[-1] * xs[-1] / np.maximum(b_arr, 1e-12), np.interp(b_arr, xs, ys))
        return float(out) if out.ndim == 0 else out
    return sps


def survivals(drafts: DraftState, calibrator: Calibrator) -> list[list[float]]:
    """a_rj for every request r and drafted position j, by `calibrator` — the function `autospec fit`
    scored (Calibrator.survival).

    One vectorised call over the batch padded with NaN (NaN stays NaN and is cut off again)."""
    lengths = drafts.lengths()
    width = max(lengths, default=0)
    if width == 0:
        return [[] for _ in lengths]
    conf = np.full((len(lengths), width), np.nan)
    for i, confs in enumerate(drafts.confidences):
        conf[i, : len(confs)] = confs
    surv = calibrator.survival(conf).tolist()
    return [row[:n] for row, n in zip(surv, lengths)]


def ranked_entries(surv: Sequence[Sequence[float]]) -> list[tuple[float, int, int]]:
    """E: (a_rj, j, r) with a_rj > 0, by a descending, ties by ascending j (then r) — so every request's
    admitted tokens form a prefix."""
    entries = [(a, j + 1, r) for r, row in enumerate(surv) for j, a in enumerate(row) if a > 0]
    entries.sort(key=lambda e: (-e[0], e[1], e[2]))
    return entries


def schedule_sync(surv: Sequence[Sequence[float]], sps: Sps) -> list[int]:
    """DSpark Alg. 1 (lossless, with early stop): verified length ℓ*_r per request."""
    n_req = len(surv)
    lengths = [0] * n_req
    if n_req == 0:
        return lengths
    b, tau = n_req, float(n_req)
    best = tau * sps(b)
    for a, j, r in ranked_entries(surv):
        b += 1
        tau += a
        theta = tau * sps(b)
        if theta > best:
            best = theta
            lengths[r] = j
        else:
            break  # the early stop: never look past a token that does not pay for itself
    return lengths


def global_argmax_budget(surv: Sequence[Sequence[float]], sps: Sps) -> int:
    """The production form's budget: argmax over n of (R + Σ top-n a)·SPS(R + n), no early stop.

    Evaluated for every n at once; ties keep the smaller budget, as a left-to-right scan would."""
    n_req = len(surv)
    if n_req == 0:
        return 0
    top = np.sort(np.array([a for row in surv for a in row if a > 0], float))[::-1]
    budgets = np.arange(0, top.size + 1)
    tau = n_req + np.concatenate([[0.0], np.cumsum(top)])
    theta = tau * _sps_values(sps, n_req + budgets)
    return int(np.argmax(theta))


def _sps_values(sps: Sps, tokens: np.ndarray) -> np.ndarray:
    """SPS at many token counts: one vectorised call when `sps` accepts arrays, else one call each."""
    # Sps is typed for one B; table_sps (and any numpy-only formula) also takes an array of them. The
    # cast only names that duck-typed fast path: a scalar-only callable raises or returns the wrong
    # shape, and falls through to the per-count loop.
    vectorised = cast(Callable[[np.ndarray], object], sps)
    try:
        out = np.asarray(vectorised(tokens), dtype=np.float64)
        if out.shape == tokens.shape:
            return out
    except (TypeError, ValueError):
        pass
    return np.array([sps(int(t)) for t in tokens], float)


def admit_top(surv: Sequence[Sequence[float]], budget: int) -> list[int]:
    """Verified lengths when the `budget` highest survivals are admitted."""
    lengths = [0] * len(surv)
    for _, j, r in ranked_entries(surv)[:budget]:
        lengths[r] = max(lengths[r], j)
    return lengths


def sps_function(params: DsparkParams, ctx: StepContext, drafts: DraftState) -> Sps:
    if params.sps_tokens:
        return table_sps(params.sps_tokens, params.sps_values)
    if ctx.latency_model is None:
        raise InputError("dspark needs an SPS table (sps_tokens/sps_values) or a fitted latency model",
                         field="verify.sps_tokens")
    model, b, n_c = ctx.latency_model, max(ctx.batch_size, 1), batch_context_tokens(ctx)
    draft_s = model.draft_time(b, n_c, max(drafts.lengths(), default=0))
    # B tokens in total = the R bonus positions plus the admitted drafts, spread over b requests.
    return lambda tokens: 1.0 / (draft_s + model.verify_time(b, n_c, tokens / b))


@register_verify("dspark")
class DsparkVerifier(VerifyPolicyBase):
    """DSpark's lossless synchronous prefix scheduler (Alg. 1)."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = DsparkParams
    params: DsparkParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._calibrator = self.params.calibrator

    def select(self, ctx: StepContext, drafts: DraftState) -> list[int]:
        return schedule_sync(survivals(drafts, self._calibrator), sps_function(self.params, ctx, drafts))


@register_verify("dspark-async")
class DsparkAsyncVerifier(VerifyPolicyBase):
    """DSpark's production form (§5.2): budget from `lag`-step-old confidences by global argmax, then
    the top-K current survivals. Until `lag` steps have been seen the current confidences size the
    budget [chosen]."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = DsparkAsyncParams
    params: DsparkAsyncParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._calibrator = self.params.calibrator
        self._history: deque[list[list[float]]] = deque(maxlen=self.params.lag + 1)

    def select(self, ctx: StepContext, drafts: DraftState) -> list[int]:
        surv = survivals(drafts, self._calibrator)
        self._history.append(surv)
        stale = self._history[0]
        budget = global_argmax_budget(stale, sps_function(self.params, ctx, drafts))
        return admit_top(surv, budget)
