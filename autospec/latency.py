"""Latency models that model-based policies consult, and the least-squares fits that produce them.

Two families, both from the papers the policies come from (docs/policies.md §2 and §4):

* AdaSpec's linear forward-pass model T_fwd(N_c, N_b) = α·N_c + γ·N_b + δ, one coefficient set per
  model (draft, target). `LinearLatencyModel` implements the contract's `LatencyModel` protocol.
* FASER's piecewise models in the SM split (Eq. 11–14): T = (a_k − γ_k·x)·load(b, s), with a knee R
  on x splitting two segments. x is the model's own SM share (r for draft and pruning, 1 − r for the
  target and the early-exit check).

Convention for `context_tokens` (the contract's LatencyModel): the total context tokens of the batch,
summed over requests (AdaSpec's N_c).

AdaSpec's Eq. 3–4 sum the context over positions: a pass (or a verified position) at position i
attends to N_c(i) = N_c + b·(i − 1), the context plus the b·(i − 1) tokens appended before it. So k
draft passes cost α_d·Σ_{i=1..k} N_c(i) + γ_d·k·b + k·δ_d (Eq. 3), and one verify pass over t = k + 1
positions per request costs α_v·Σ_{i=1..t} N_c(i) + γ_v·b·t + δ_v (Eq. 4): each extra verified
position pays for the whole context again. `positions_context` is that sum; `autospec fit` fits α on
it (`linear_features`), so the coefficients mean the same thing where they are fitted and where they
are used.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Literal, Sequence

import numpy as np

from autospec.contract import LatencyModel

__all__ = ["FaserKind", "FaserModels", "LinearCoeffs", "LinearLatencyModel", "PiecewiseLatency", "faser_chunk_size",
           "faser_eval", "faser_features", "faser_x", "fit_linear", "fit_piecewise", "mape", "sd_step_time"]

# --- AdaSpec linear model ------------------------------------------------------------------------


@dataclass(frozen=True)
class LinearCoeffs:
    """T_fwd(N_c, N_b) = alpha·N_c + gamma·N_b + delta, seconds (AdaSpec §4, time model), plus
    lam·log2(N_b) + multi·[N_b ≥ 2] in the simulator's clock model only, where also a pass whose rows
    each feed one token (a decode pass) attends at `alpha_decode` per context token, or at `alpha_ragged`
    when those rows differ in length on the padded torch engine (`lam` = `multi` = 0, `alpha_decode` =
    `alpha_ragged` = None is AdaSpec's model exactly).

    Why the log term: on a CPU (and on a GPU below saturation) a pass over few tokens leaves cores idle,
    so its cost grows sublinearly in N_b at small batches — the bundled pair's draft pass costs 2.1 ms
    at batch 1, 3.6 ms at 2 and 4.2 ms at 8. AdaSpec's line misses that by 16% held-out on our CPU
    profile; the clock adds one bounded (>= 0) term for it. Policies keep the paper's model.

    Why the step at N_b = 2 and the decode pass's own α: no-SD runs decode passes, SD verifies two or
    more tokens per row, and the two are different kernels. A pass over one token is a matrix-vector
    product, over two or more a matrix-matrix product, and on a CPU the first is much cheaper — the
    bundled target's pass costs 3.6 ms over one token and 5.8–6.0 ms over two (batch 2 × 1 token or
    batch 1 × 2 tokens alike); and a pass needs no attention mask when every row feeds one token and
    the rows have one length (the torch engine, engines/llama.py; vLLM's decode kernel needs only the
    first) — 0.6 µs per context token in the CI profile's fit against 1.4 µs with the mask. The
    profile's `decode` rows have one length per shape, so its one-token rows are maskless; in a torch
    replay rows differ in length beyond batch 1 (the simulator decides per pass). Without them the clock
    priced a no-SD step 23–28% too high at batch 1 and a two-token pass 10–14% too low (two CPU
    profiles): the simulator favoured SD exactly where SD is decided.

    Why a third α for one-token rows of unequal length (`alpha_ragged`): such a pass pays the mask
    but still runs one query per row, far cheaper per context token than a multi-token pass's
    masked attention — on the bundled target at batch 8, rows spread over 192..576 tokens cost 1.9 ms
    more than rows of 384, where the multi-token α added 4.1 ms (and the no-SD replays at batch 2–8,
    whose rows differ in length, came out 6–11% slow on the simulator). The profile times such rows
    (phase `decode_ragged`); the CI profile fits 0.83 µs. None (older profiles, vLLM): α."""

    alpha: float  # seconds per context token attended
    gamma: float  # seconds per token processed in the pass
    delta: float  # fixed cost of one forward pass
    lam: float = 0.0  # seconds per doubling of the tokens in the pass (clock model only)
    multi: float = 0.0  # seconds a pass over two or more tokens costs on top (clock model only)
    alpha_decode: float | None = None  # alpha of a pass whose rows feed one token each (clock only; None: alpha)
    alpha_ragged: float | None = None  # ... and differ in length: the mask (clock only; None: alpha)

    def forward(self, n_context: float, n_batch: float, rows: float | None = None, ragged: float = 0.0) -> float:
        """One pass over `n_batch` tokens attending to `n_context`; `rows` (the requests in the pass)
        tells a decode pass (n_batch == rows) from one whose rows feed several tokens, and `ragged`
        (true: the rows differ in length, so the padded engine masks) a masked decode pass."""
        alpha = self.alpha
        if rows is not None and n_batch <= rows:
            alpha = self.pass_alpha(ragged=bool(ragged))
        t = alpha * n_context + self.gamma * n_batch + self.delta
        if self.multi and n_batch >= 2:
            t += self.multi
        return t + self.lam * math.log2(n_batch) if self.lam and n_batch >= 1 else t

    def pass_alpha(self, *, ragged: bool) -> float:
        """α of a pass whose rows feed one token each: without a mask, or (`ragged`) with one."""
        alpha = self.alpha_ragged if ragged else self.alpha_decode
        return self.alpha if alpha is None else alpha


@dataclass(frozen=True)
class LinearLatencyModel:
    """AdaSpec's time model for a draft/target pair; implements contract.LatencyModel."""

    draft: LinearCoeffs
    target: LinearCoeffs

    def draft_time(self, batch: int, context_tokens: float, steps: int) -> float:
        """Eq. 3: `steps` sequential draft passes of one token per request; pass i attends to the
        context plus the b·(i − 1) draft tokens already appended."""
        if steps <= 0 or batch <= 0:
            return 0.0
        d = self.draft
        alpha = d.pass_alpha(ragged=False)  # draft passes feed one token a row
        t = alpha * positions_context(batch, context_tokens, steps) + d.gamma * batch * steps + steps * d.delta
        if d.multi and batch >= 2:
            t += steps * d.multi
        return t + steps * d.lam * math.log2(batch) if d.lam and batch >= 1 else t

    def verify_time(self, batch: int, context_tokens: float, tokens_per_request: float) -> float:
        """Eq. 4: one target pass over `tokens_per_request` positions of each request, the context
        summed over those positions: α_v·Σ_{i=1..t} N_c(i) + γ_v·b·t + δ_v. Requests verifying unequal
        numbers pass their mean t, in the same closed form [chosen: the contract gives the batch's
        total context, not each request's]; exact when every request verifies the same number."""
        if batch <= 0:
            return 0.0
        c, n_b = self.target, batch * tokens_per_request
        alpha = c.pass_alpha(ragged=False) if tokens_per_request <= 1 else c.alpha
        t = alpha * positions_context(batch, context_tokens, tokens_per_request) + c.gamma * n_b + c.delta
        if c.multi and n_b >= 2:
            t += c.multi
        return t + c.lam * math.log2(n_b) if c.lam and n_b >= 1 else t

    def sd_time(self, ks: Sequence[int], context_tokens: float, draft_steps: int | None = None) -> float:
        return sd_step_time(self, ks, context_tokens, draft_steps)

    def to_dict(self) -> dict:
        return {"kind": "linear", "draft": asdict(self.draft), "target": asdict(self.target)}

    @classmethod
    def from_dict(cls, data: dict) -> "LinearLatencyModel":
        return cls(LinearCoeffs(**data["draft"]), LinearCoeffs(**data["target"]))


def positions_context(batch: float, context_tokens: float, positions: float) -> float:
    """Σ_{i=1..t} N_c(i) with N_c(i) = N_c + b·(i − 1): the context summed over t positions of each of
    b requests (AdaSpec Eq. 3–4); N_c is the batch's context before the first of them."""
    if positions <= 0:
        return 0.0
    return positions * context_tokens + batch * positions * (positions - 1) / 2.0


def linear_features(batch: np.ndarray | float, tokens: np.ndarray | float,
                    context: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """(Σ N_c(i), N_b) of a profiled pass — `batch` requests, `tokens` positions each, `context` tokens
    per request before them — for fitting AdaSpec's (α, γ, δ) as Eq. 3–4 use them. A draft pass
    (one position) gives (b·c, b); a verify pass over t positions (b·(t·c + t(t − 1)/2), b·t)."""
    b, s, c = (np.asarray(v, float) for v in (batch, tokens, context))
    return s * b * c + b * s * (s - 1) / 2.0, b * s


def sd_step_time(model: LatencyModel, ks: Sequence[int], context_tokens: float,
                 draft_steps: int | None = None) -> float:
    """T_sd for one SD step (Eq. 5): `draft_steps` draft passes (default max(ks)) plus one target pass
    that verifies k_i + 1 positions of request i (AdaSpec Alg. 3's denominator). Works for any
    LatencyModel; the verify cost takes the mean positions per request (see
    `LinearLatencyModel.verify_time`)."""
    b = len(ks)
    if b == 0:
        return 0.0
    steps = max(ks) if draft_steps is None else draft_steps
    return sd_step_time_of_total(model, b, sum(ks), context_tokens, steps)


def sd_step_time_of_total(model: LatencyModel, batch: int, drafted_total: int, context_tokens: float,
                          draft_steps: int) -> float:
    """`sd_step_time` from what it depends on: the batch size and Σ k_i (the verify pass takes the mean
    positions per request, (Σ k_i + b) / b), for a caller that changes one k_i at a time."""
    mean_tokens = (drafted_total + batch) / batch
    return model.draft_time(batch, context_tokens, draft_steps) + model.verify_time(batch, context_tokens, mean_tokens)


def fit_linear(rows: np.ndarray | Sequence[Sequence[float]]) -> LinearCoeffs:
    """Least-squares (alpha, gamma, delta) from profile rows [N_c, N_b, seconds] (AdaSpec §4)."""
    data = np.asarray(rows, dtype=float)
    if data.ndim != 2 or data.shape[1] != 3 or data.shape[0] < 3:
        raise ValueError("fit_linear needs an (n >= 3, 3) array of [N_c, N_b, seconds]")
    design = np.column_stack([data[:, 0], data[:, 1], np.ones(len(data))])
    coef, *_ = np.linalg.lstsq(design, data[:, 2], rcond=None)
    return LinearCoeffs(float(coef[0]), float(coef[1]), float(coef[2]))


def mape(predicted: np.ndarray | Sequence[float], actual: np.ndarray | Sequence[float]) -> float:
    """Mean absolute percentage error, as a fraction (0.07 = 7%)."""
    p, a = np.asarray(predicted, float), np.asarray(actual, float)
    return float(np.mean(np.abs(p - a) / np.abs(a)))


# --- FASER piecewise models (§4, Eq. 11–14) ------------------------------------------------------

FaserKind = Literal["draft", "target", "early_exit", "prune"]

# For each model: whether x is r or 1 − r, and the load term's features (coefficients are fitted).
#   draft T_q:  x = r,     load α_q·b + β_q·s + c_q
#   target T_p: x = 1 − r, load (α_p·b + λ_p)·s + c_p = α_p·b·s + λ_p·s + c_p
#   T_ee:       x = 1 − r, load α_ee·b·s + β_ee
#   T_pr:       x = r,     load α_pr·b·s + β_pr
_X_IS_COMPLEMENT = {"draft": False, "target": True, "early_exit": True, "prune": False}


def faser_features(kind: FaserKind, b: np.ndarray, s: np.ndarray) -> np.ndarray:
    b, s = np.asarray(b, float), np.asarray(s, float)
    one = np.ones_like(b * s)
    if kind == "draft":
        return np.column_stack([b * one, s * one, one])
    if kind == "target":
        return np.column_stack([b * s, s * one, one])
    if kind in ("early_exit", "prune"):
        return np.column_stack([b * s, one])
    raise ValueError(f"unknown FASER latency kind {kind!r}")


def faser_x(kind: FaserKind, r: np.ndarray | float) -> np.ndarray:
    r = np.asarray(r, float)
    return 1.0 - r if _X_IS_COMPLEMENT[kind] else r


@dataclass(frozen=True)
class PiecewiseLatency:
    """T(b, s, r) = (a_k − γ_k·x)·load(b, s), segment k = 1 for x < knee, 2 for x >= knee.

    a_1 is fixed at 1: the product is invariant to scaling (a, γ) up and the load down, so one
    coefficient must be pinned for the fit to be identifiable. knee = None: a single segment."""

    kind: FaserKind
    load: tuple[float, ...]
    seg1: tuple[float, float]  # (a_1, γ_1)
    seg2: tuple[float, float]  # (a_2, γ_2)
    knee: float | None = None

    def __call__(self, b: np.ndarray | float, s: np.ndarray | float, r: np.ndarray | float) -> np.ndarray:
        return faser_eval(self, b, s, r)

    def to_dict(self) -> dict:
        return {"kind": self.kind, "load": list(self.load), "seg1": list(self.seg1),
                "seg2": list(self.seg2), "knee": self.knee}

    @classmethod
    def from_dict(cls, data: dict) -> "PiecewiseLatency":
        return cls(data["kind"], tuple(data["load"]), tuple(data["seg1"]), tuple(data["seg2"]),
                   data.get("knee"))


def faser_eval(model: PiecewiseLatency, b: np.ndarray | float, s: np.ndarray | float,
               r: np.ndarray | float) -> np.ndarray:
    """Evaluate a FASER piecewise model (Eq. 11–14); scalars in, 0-d array out."""
    b_arr, s_arr, r_arr = np.broadcast_arrays(np.asarray(b, float), np.asarray(s, float),
                                              np.asarray(r, float))
    x = faser_x(model.kind, r_arr)
    load = faser_features(model.kind, b_arr.ravel(), s_arr.ravel()) @ np.asarray(model.load)
    second = np.zeros_like(x.ravel(), dtype=bool) if model.knee is None else x.ravel() >= model.knee
    a = np.where(second, model.seg2[0], model.seg1[0])
    g = np.where(second, model.seg2[1], model.seg1[1])
    return ((a - g * x.ravel()) * load).reshape(x.shape)


def fit_piecewise(kind: FaserKind, b: Sequence[float], s: Sequence[float], r: Sequence[float],
                  seconds: Sequence[float]) -> tuple[PiecewiseLatency, float]:
    """Fit a FASER model: grid-search the knee over the profiled x values, least squares (scipy) on
    relative residuals for each knee, keep the best. Returns (model, in-sample MAPE).

    With a single profiled r the SM term is a constant absorbed by the load, so the fit is one
    linear segment (γ = 0, knee None)."""
    from scipy.optimize import least_squares  # lazy: only `autospec fit` needs scipy.optimize

    b_a, s_a, r_a, t = (np.asarray(v, float) for v in (b, s, r, seconds))
    feats = faser_features(kind, b_a, s_a)
    x = faser_x(kind, r_a)
    load0, *_ = np.linalg.lstsq(feats / t[:, None], np.ones_like(t), rcond=None)
    xs = np.unique(x)
    if len(xs) == 1:
        model = PiecewiseLatency(kind, tuple(map(float, load0)), (1.0, 0.0), (1.0, 0.0), None)
        return model, mape(faser_eval(model, b_a, s_a, r_a), t)

    n_load = feats.shape[1]
    best: tuple[float, PiecewiseLatency] | None = None
    # Each knee must leave points on both sides; the lowest x can never be a knee.
    for knee in xs[1:]:
        second = x >= knee

        # `second` is bound as a default: least_squares calls back only within this iteration, and the
        # binding keeps the closure correct even if that changes.
        def residuals(theta: np.ndarray, second: np.ndarray = second) -> np.ndarray:
            load = feats @ theta[:n_load]
            a = np.where(second, theta[n_load + 1], 1.0)
            g = np.where(second, theta[n_load + 2], theta[n_load])
            return (a - g * x) * load / t - 1.0

        theta0 = np.concatenate([load0, [0.0, 1.0, 0.0]])
        sol = least_squares(residuals, theta0, method="trf")
        th = sol.x
        model = PiecewiseLatency(kind, tuple(map(float, th[:n_load])), (1.0, float(th[n_load])),
                                 (float(th[n_load + 1]), float(th[n_load + 2])), float(knee))
        cost = float(np.sum(sol.fun ** 2))
        if best is None or cost < best[0] - 1e-15:
            best = (cost, model)
    assert best is not None
    return best[1], mape(faser_eval(best[1], b_a, s_a, r_a), t)


def faser_chunk_size(s: int, b: int, r: float, t_draft: PiecewiseLatency, t_target: PiecewiseLatency,
                     t_hat: float) -> int | None:
    """Frontier overlap (FASER §4.3): the largest chunk s_c in 1..s with
    T_q(s_c; b, r) + (s/s_c)·T_p(s_c; b, 1 − r) < T̂(s; b, r); None when no chunk beats sequential."""
    for s_c in range(s, 0, -1):
        overlapped = float(t_draft(b, s_c, r)) + (s / s_c) * float(t_target(b, s_c, r))
        if overlapped < t_hat:
            return s_c
    return None



@dataclass(frozen=True)
class FaserModels:
    """One profile's fitted FASER models (fit/models.json "piecewise"), in the units engines run.

    The profile times a draft *pass* (one token for each of b requests: its draft rows have s = 1) and
    a verify pass that feeds n drafts + 1 positions per request (its target rows have s = n + 1). So
    drafting n tokens is n draft passes, T_q(b, 1, r)·n, and verifying n drafts is T_p(b, n + 1, r).
    `early_exit` (T_ee) and `prune` (T_pr) are present when the profile timed them."""

    draft: PiecewiseLatency
    target: PiecewiseLatency
    early_exit: PiecewiseLatency | None = None
    prune: PiecewiseLatency | None = None

    @classmethod
    def from_dict(cls, piecewise: dict[str, dict]) -> "FaserModels | None":
        """From fit/models.json's "piecewise" table; None when it lacks the draft or target model."""
        if "draft" not in piecewise or "target" not in piecewise:
            return None
        get = lambda k: PiecewiseLatency.from_dict(piecewise[k]) if k in piecewise else None  # noqa: E731
        return cls(get("draft"), get("target"), get("early_exit"), get("prune"))

    @property
    def has_r_axis(self) -> bool:
        """Fitted over several SM splits (a knee was found), so the models tell splits apart; a profile
        without an r axis gives one segment (latency.fit_piecewise) that ignores r."""
        return self.draft.knee is not None and self.target.knee is not None

    def draft_time(self, b: float, n: float, r: float) -> float:
        """Seconds to draft n tokens for each of b requests (n passes) with the draft on r of the SMs."""
        return n * float(self.draft(b, 1, r)) if n > 0 else 0.0

    def verify_time(self, b: float, n: float, r: float) -> float:
        """Seconds of one verify pass over n drafts (+ 1 position) for each of b requests, target on 1 − r."""
        return float(self.target(b, n + 1, r))

    def sequential_time(self, s: int, b: int, r: float) -> float:
        """T̂(s; b, r): draft s tokens, then verify them, without overlap."""
        return self.draft_time(b, s, r) + self.verify_time(b, s, r)

    def early_exit_times(self, r: float):
        """Eq. 10's times for the torch engine's `early_exit_times` hook: (batch, fed positions per
        request, k̂_rej) -> (T_t, T_ee, T_pr); None unless the profile timed T_ee and T_pr.
        T_t is the target's time for the k̂_rej tokens expected to be rejected — the work pruning
        saves, at which Eq. 6–9 evaluate T_save — and T_pr the cost of pruning them, both at
        b·s = k̂_rej (s = k̂_rej/b per request) [chosen: the paper prices both at k̂_rej and does not
        split it over requests]; T_ee is one rank check over the fed draft positions (load α_ee·b·s).
        With k̂_rej = 0 nothing is expected to be saved: T_t = 0."""
        if self.early_exit is None or self.prune is None:
            return None
        target, check, prune = self.target, self.early_exit, self.prune

        def times(batch: int, positions: int, k_rej: float) -> tuple[float, float, float]:
            b = max(int(batch), 1)
            t_t = float(target(b, k_rej / b, r)) if k_rej > 0 else 0.0
            return t_t, float(check(b, max(positions - 1, 1), r)), float(prune(b, k_rej / b, r))

        return times
