"""DSDE: dynamic speculative decoding from KL-divergence stability (Yang et al.; docs/policies.md §5).

Per request, the recent KL(p_target ‖ p_draft) values at verified positions decide the next draft
length: a stable, low divergence drafts long, a volatile or high one drafts short. A batch cap keeps
one request from stretching the step for everyone.

Equations (paper numbering, as docs/policies.md §5 cites them): SL_max calibration Eq. 1; the
per-request step Eq. 2–8 — decay-weighted mean and variance, WVIR, the scale factor
SF = exp(2·μ_KLD,last) − 1 with μ_KLD,last the mean KLD of the request's last step (Eq. 3), and SL̂;
the batch cap Eq. 9–11.
"""

from __future__ import annotations

import functools
import math
from collections import deque
from typing import Any, Sequence

import numpy as np
from pydantic import Field

from autospec.contract import LatencyModel, StepContext, StepOutcome
from autospec.policies.base import PolicyParams, TargetLengthPolicy, register_length


class DsdeParams(PolicyParams):
    decay: float = Field(0.85, gt=0.0, le=1.0)  # δ of the weights α_i = δ^(i−1) [paper]
    short_window: int = Field(10, ge=2)  # [paper]
    long_window: int = Field(30, ge=2)  # [paper]
    sl_min: int = Field(2, ge=1)  # [paper]
    warmup_tokens: int = Field(30, ge=1)  # proposed draft tokens before SL_max is calibrated [chosen]
    warmup_len: int = Field(0, ge=0)  # draft length during warm-up; 0 = K_max [chosen]
    min_long_variance: float = Field(1e-6, gt=0.0)  # below it the long window counts as flat [chosen]
    flat_wvir: float = Field(20.0, ge=0.0)  # WVIR used when the long window is flat [chosen]


@functools.lru_cache(maxsize=64)
def _decay_weights(n: int, decay: float) -> np.ndarray:
    """α_i = decay^(i−1) laid out oldest first (the last entry, the most recent value, has weight 1)."""
    return decay ** np.arange(n - 1, -1, -1, dtype=float)


def weighted_mean_var(values: Sequence[float], decay: float) -> tuple[float, float]:
    """Weighted mean and variance with α_i = decay^(i−1), i = 1 the most recent (values oldest first)."""
    x = np.asarray(values, dtype=float)
    w = _decay_weights(len(x), decay)
    total = w.sum()
    mean = float(w @ x) / total
    var = float(w @ (x - mean) ** 2) / total
    return mean, var


def wvir(klds: Sequence[float], short: int = 10, long: int = 30, decay: float = 0.85,
         min_long_variance: float = 1e-6, flat_wvir: float = 20.0) -> float:
    """Weighted variance intensity ratio Var_w(last `short`) / Var_w(last `long`) (within Eq. 2–8)."""
    if len(klds) < 2:
        return 0.0
    _, var_long = weighted_mean_var(klds[-long:], decay)
    if var_long < min_long_variance:
        return flat_wvir
    _, var_short = weighted_mean_var(klds[-short:], decay)
    return var_short / var_long


def scale_factor(mean_kld: float) -> float:
    """SF = exp(2·μ_KLD,last) − 1 (within Eq. 2–8; μ_KLD,last from Eq. 3)."""
    return math.exp(2.0 * mean_kld) - 1.0


def step_mean(klds: Sequence[float]) -> float | None:
    """μ_KLD,last (Eq. 3): the plain mean of the KLDs one step verified; None for a step with none."""
    return sum(klds) / len(klds) if len(klds) else None


def predicted_length(klds: Sequence[float], last_mean: float, sl_max: float, p: DsdeParams) -> int:
    """SL̂ (Eq. 2–8): SL_min if SF·WVIR > 1, else (1 − SF·WVIR)·(SL_max − SL_min) + SL_min, rounded up.

    `klds` is the request's KLD history (oldest first; WVIR's windows), `last_mean` μ_KLD,last, the mean
    of its last step's KLDs (Eq. 3; `step_mean`). No history → SF·WVIR = 0 → SL_max."""
    if len(klds) == 0:
        product = 0.0
    else:
        product = scale_factor(last_mean) * wvir(klds, p.short_window, p.long_window, p.decay,
                                                 p.min_long_variance, p.flat_wvir)
    if product > 1.0:
        return p.sl_min
    # The tiny tolerance keeps float noise (4.0000000001) from rounding up a whole token.
    return max(p.sl_min, math.ceil((1.0 - product) * (sl_max - p.sl_min) + p.sl_min - 1e-9))


def calibrate_sl_max(max_accepted_in_step: int, warmup_klds: Sequence[float]) -> float:
    """SL_max = SL_A,max·(1 + μ_KLD,pre / (KLD_pre,max + 1e-6)) (Eq. 1)."""
    if not warmup_klds:
        return float(max_accepted_in_step)
    mean = sum(warmup_klds) / len(warmup_klds)
    return max_accepted_in_step * (1.0 + mean / (max(warmup_klds) + 1e-6))


def batch_cap(lengths: Sequence[int]) -> int:
    """SL_cap = mean of the batch's SL̂, rounded up [chosen] (Eq. 9–11)."""
    return math.ceil(sum(lengths) / len(lengths) - 1e-9) if lengths else 0


def predicted_lengths(histories: Sequence[Sequence[float]], last_means: Sequence[float], sl_max: float,
                      p: DsdeParams) -> list[int]:
    """predicted_length for a whole batch at once (same numbers; one numpy pass instead of 2·B small
    ones, which keeps DSDE's per-step cost well under 1% of a verify step at batch 64)."""
    if not histories:
        return []
    width = p.long_window
    tails = [list(h)[-width:] for h in histories]
    n = np.fromiter((len(t) for t in tails), dtype=int, count=len(tails))
    # Right-aligned matrix (the most recent value in the last column), filled in one scatter.
    x = np.zeros((len(histories), width))
    if n.sum():
        rows = np.repeat(np.arange(len(tails)), n)
        starts = np.repeat(np.cumsum(n) - n, n)
        cols = width - np.repeat(n, n) + (np.arange(n.sum()) - starts)
        x[rows, cols] = [v for t in tails for v in t]
    cols = np.arange(width)
    age = width - 1 - cols  # 0 = most recent
    weights = p.decay ** age
    valid_long = cols[None, :] >= (width - n)[:, None]
    valid_short = valid_long & (age[None, :] < p.short_window)

    def mean_var(mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = weights[None, :] * mask
        total = np.where(w.sum(1) > 0, w.sum(1), 1.0)
        mean = (w * x).sum(1) / total
        var = (w * (x - mean[:, None]) ** 2).sum(1) / total
        return mean, var

    _, var_short = mean_var(valid_short)
    _, var_long = mean_var(valid_long)
    mean_last = np.asarray(last_means, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(var_long < p.min_long_variance, p.flat_wvir, var_short / np.maximum(var_long, 1e-300))
    wvir_v = np.where(n < 2, 0.0, ratio)
    product = np.where(n == 0, 0.0, (np.exp(2.0 * mean_last) - 1.0) * wvir_v)
    out = []
    for prod in product.tolist():
        if prod > 1.0:
            out.append(p.sl_min)
        else:
            out.append(max(p.sl_min, math.ceil((1.0 - prod) * (sl_max - p.sl_min) + p.sl_min - 1e-9)))
    return out


@register_length("dsde")
class DsdeLength(TargetLengthPolicy):
    """DSDE: s_i = min(SL̂_i, SL_cap) after a warm-up that calibrates SL_max."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = DsdeParams
    params: DsdeParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._klds: dict[int, deque[float]] = {}
        # μ_KLD,last per request: the mean of its latest step that verified a draft [chosen: a step
        # that verified none keeps the previous step's mean]
        self._last_mean: dict[int, float] = {}
        self._warmup_proposed = 0
        self._warmup_klds: list[float] = []
        self._warmup_max_accepted = 0
        self.sl_max: float | None = None  # set once the warm-up ends

    def targets(self, ctx: StepContext) -> list[int]:
        return self.request_lengths([r.req_id for r in ctx.requests], 0.0, ctx.k_max, None, None)

    def request_lengths(self, req_ids: list[int], context_tokens: float, k_max: int,
                        latency_model: LatencyModel | None, sm_split: float | None) -> list[int]:
        """`targets` from what it reads: the step's requests and K_max (`RequestLengthPolicy`)."""
        if self.sl_max is None:
            return [self.params.warmup_len or k_max] * len(req_ids)
        sl_max = min(max(self.sl_max, self.params.sl_min), k_max)
        histories = [self._klds.get(rid, ()) for rid in req_ids]
        last = [self._last_mean.get(rid, 0.0) for rid in req_ids]
        sl_hat = [min(s, k_max) for s in predicted_lengths(histories, last, sl_max, self.params)]
        cap = batch_cap(sl_hat)
        return [min(s, cap) for s in sl_hat]

    def observe(self, ctx: StepContext, outcome: StepOutcome) -> None:
        self.observe_requests(outcome.req_ids, outcome.drafted, outcome.accepted, outcome.finished, 0.0,
                              outcome.klds)

    def observe_requests(self, req_ids: Sequence[int], verified: Sequence[int], accepted: Sequence[int],
                         finished: Sequence[bool], step_s: float, klds: Sequence[Sequence[float]]) -> None:
        """`observe` from what it reads: per request its KLDs, accepted drafts and whether it finished, and
        the step's drafts (`verified`: the per-request path passes the drafted counts) (`RequestLengthPolicy`)."""
        for rid, row, done in zip(req_ids, klds, finished):
            if done:
                self._klds.pop(rid, None)
                self._last_mean.pop(rid, None)
            else:
                self._klds.setdefault(rid, deque(maxlen=self.params.long_window)).extend(row)
                mean = step_mean(row)
                if mean is not None:
                    self._last_mean[rid] = mean
        if self.sl_max is None:
            self._warmup_proposed += sum(verified)
            self._warmup_klds.extend(k for ks in klds for k in ks)
            self._warmup_max_accepted = max([self._warmup_max_accepted, *accepted])
            if self._warmup_proposed >= self.params.warmup_tokens:
                self.sl_max = calibrate_sl_max(self._warmup_max_accepted, self._warmup_klds)
