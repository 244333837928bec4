"""GP-LCB adaptive drafter (FASER §4.1; docs/policies.md §3).

The cost per committed token J(s; b, r) = T̂(s; b, r) / (s·â(s; b, r) + ε) (Eq. 1) is learned online
as a black box: one Gaussian process over s per context (batch-size bucket, SM split r), fitted to a
sliding window of observed costs J̃ = T_obs / (s_n·a_obs + ε) (Eq. 4). Each step picks
s_n = argmin_s μ(s) − sqrt(β_n)·σ(s) over S = {1..K_max} (Eq. 3), then refines per request over
{s_n − 1, s_n, s_n + 1} with the observed step time T̂(s; b, r) of its context and the request's own
acceptance (Eq. 2).

SM split. With an `sm_pool` the policy chooses (r, s) each step and offers `policies.base.SmSplitChoice`:
the serving step has the engine apply r before drafting (`engines.base.StepSmSplit`; an engine that
cannot is refused before the replay) and reports the split applied, under which the step's cost is
recorded — so each r's GP learns from steps that ran at r. Without a pool the context's r is the
execution config's split (`StepContext.sm_split`) and nothing is chosen.

T̂(s; b, r) [chosen: FASER's Eq. 2 uses the step time at (s; b, r), which the paper measures]: a
least-squares line T̂(s) = c_0 + c_1·s (c_1 ≥ 0) through the (s_n, T_obs) pairs of the context's
window (the last W steps of this batch bucket and split), once the window holds at least two distinct
s; before that the fitted AdaSpec time model (`StepContext.latency_model`, which knows no r), and
without one no refinement.

Note on ε: with ε = 1e-6 (the spec's default) a step whose batch accepted nothing yields a huge J̃
that dominates the standardized window; ε = 1 makes J exactly the time per committed token
(accepted + bonus) and is the robust choice for small batches.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
from pydantic import Field

from autospec.contract import LatencyModel, StepContext, StepOutcome
from autospec.latency import sd_step_time
from autospec.policies.base import PolicyParams, TargetLengthPolicy, batch_context_tokens, register_length

ContextKey = tuple[int, float | None]


class GpLcbParams(PolicyParams):
    window: int = Field(64, ge=2)  # W [chosen]
    lengthscale: float = Field(2.0, gt=0.0)  # Matérn-5/2 on s [chosen]
    signal_variance: float = Field(1.0, gt=0.0)  # [chosen]
    noise_variance: float = Field(0.05, gt=0.0)  # on standardized J [chosen]
    delta: float = Field(0.1, gt=0.0, lt=1.0)  # confidence in β_n (Srinivas et al.) [chosen]
    eps: float = Field(1e-6, ge=0.0)  # ε of Eq. 1/4 [chosen]
    ewma_weight: float = Field(0.3, gt=0.0, le=1.0)  # weight of the newest round in â_i [chosen]
    refine: bool = True  # per-request refinement (Eq. 2); needs a latency model
    sm_pool: list[float] = Field(default_factory=list)  # r values to choose from; [] = ctx.sm_split


class SlidingWindow:
    """The last `size` (s, value) pairs of one context, oldest first, read as numpy arrays without a copy.

    The drafter reads its windows every step, so they are kept as arrays rather than rebuilt from a
    deque of tuples each time. Each pair is written twice, at i and i + size of a 2·size buffer, so the
    window is always one contiguous slice, oldest first (the order matters: sums over the window then
    add the same floats in the same order as a list of the pairs would)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.count = 0  # pairs appended so far (the window holds the last min(count, size))
        self._s = np.zeros(2 * size, np.int64)
        self._v = np.zeros(2 * size, float)

    def append(self, s: int, value: float) -> None:
        i = self.count % self.size
        self._s[i] = self._s[i + self.size] = s
        self._v[i] = self._v[i + self.size] = value
        self.count += 1

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(s, value) of the window, oldest first: views into the buffer (not to be written), valid until the
        next append."""
        if self.count <= self.size:
            return self._s[:self.count], self._v[:self.count]
        start = self.count % self.size
        return self._s[start:start + self.size], self._v[start:start + self.size]

    def pairs(self) -> list[tuple[int, float]]:
        s, v = self.arrays()
        return list(zip(s.tolist(), v.tolist()))


def batch_bucket(batch_size: int) -> int:
    """Batch-size bucket: the smallest power of two >= b [chosen]."""
    return 1 << max(0, math.ceil(math.log2(max(batch_size, 1))))


def beta_n(n: int, n_arms: int, delta: float = 0.1) -> float:
    """β_n = 2·ln(|S|·n²·π² / (6·δ)) (Srinivas et al. 2010, finite arm set)."""
    return 2.0 * math.log(n_arms * n * n * math.pi ** 2 / (6.0 * delta))


def per_request_gain(p, s: int):
    """s·â_i(s): expected accepted tokens of s drafts when each position is accepted with p given its
    prefix was (Σ_{j<=s} p^j). â_i is s-dependent through this geometric model [chosen]; a constant
    â_i would make Eq. 2 always pick the longest candidate. `p` may be an array (one per request)."""
    out = per_request_gains(p, [s])[..., 0]
    return float(out) if out.ndim == 0 else out


def per_request_gains(p, lengths: Sequence[int]) -> np.ndarray:
    """`per_request_gain` at each of `lengths` (ascending), stacked on a last axis: one pass of partial
    sums Σ_{j<=s} p^j for all of them."""
    p = np.asarray(p, float)
    wanted = set(lengths)
    columns, partial = [], 0
    for j in range(1, max(lengths, default=0) + 1):
        partial = partial + p ** j
        if j in wanted:
            columns.append(partial)
    return np.stack([np.asarray(c, float) for c in columns], axis=-1) if columns else np.zeros(p.shape + (0,))


@register_length("gp-lcb")
class GpLcbLength(TargetLengthPolicy):
    """FASER §4.1 GP-LCB drafter with per-context sliding windows and per-request refinement."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = GpLcbParams
    params: GpLcbParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._windows: dict[ContextKey, SlidingWindow] = {}  # (s_n, J̃) per context (Eq. 4)
        self._accept: dict[int, float] = {}  # req_id -> EWMA of per-position acceptance
        self._times: dict[ContextKey, SlidingWindow] = {}  # (s_n, T_obs) per context: T̂(s; b, r)
        self._last: tuple[ContextKey, int] | None = None  # (context, s_n) of the step in flight
        self._step_split: float | None = None  # the r chosen for the step in flight (a pool), else None
        self._gp_kernel: Any = None

    # --- the GP -----------------------------------------------------------------------------------

    def observations(self, key: ContextKey) -> list[tuple[int, float]]:
        window = self._windows.get(key)
        return window.pairs() if window is not None else []

    def record(self, key: ContextKey, s: int, cost: float) -> None:
        """Add one (s, J̃) observation to a context's window (Eq. 4)."""
        self._window(self._windows, key).append(int(s), float(cost))

    def record_time(self, key: ContextKey, s: int, t_obs: float) -> None:
        """Add one observed step time at s_n to a context's window of times (T̂ of Eq. 2)."""
        self._window(self._times, key).append(int(s), float(t_obs))

    def _window(self, windows: dict[ContextKey, SlidingWindow], key: ContextKey) -> SlidingWindow:
        window = windows.get(key)
        if window is None:
            window = windows[key] = SlidingWindow(self.params.window)
        return window

    def observed_step_time(self, key: ContextKey, s_values: Any) -> np.ndarray | None:
        """T̂(s; b, r) at s_values from the context's observed step times (module docstring): the
        least-squares line through its (s_n, T_obs) pairs, slope clamped at ≥ 0 [chosen: a step cannot
        get faster by drafting more]; None while the window holds fewer than two distinct s."""
        window = self._times.get(key)
        if window is None:
            return None
        drafted, ys = window.arrays()
        if not drafted.size or (drafted == drafted[0]).all():
            return None
        xs = drafted.astype(float)
        # ordinary least squares in closed form (np.polyfit's answer, without its per-step overhead);
        # means as np.mean computes them (the same sum), without its wrapper
        x_mean, y_mean = np.add.reduce(xs) / xs.size, np.add.reduce(ys) / ys.size
        dx = xs - x_mean
        slope = float(dx @ (ys - y_mean) / (dx @ dx))
        if slope < 0:
            slope = 0.0
        intercept = float(y_mean) - slope * float(x_mean)
        return intercept + slope * np.asarray(s_values, float)

    # --- the SM split (policies.base.SmSplitChoice) -------------------------------------------------

    @property
    def chooses_sm_split(self) -> bool:
        return bool(self.params.sm_pool)

    def step_sm_split(self) -> float | None:
        """The r chosen by the last `begin_step` (None without a pool)."""
        return self._step_split

    def sm_split_applied(self, r: float | None) -> None:
        """The split the engine ran this step under: the step's cost is recorded in that context
        [chosen: None, an engine's "no split", is the pool's r = 0.0]."""
        if self._last is not None:
            key, s_n = self._last
            self._last = ((key[0], float(r or 0.0)), s_n)

    def posterior(self, key: ContextKey, s_values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """GP posterior mean and std of J at s_values, in J units (J standardized per context)."""
        window = self._windows.get(key)
        raw = np.asarray(s_values)
        s_values = raw.astype(float)
        p = self.params
        if window is None or not window.count:
            return np.zeros_like(s_values), np.full_like(s_values, math.sqrt(p.signal_variance))
        drafted, ys = window.arrays()
        # mean and population std as np.mean / np.std compute them (the same sums, so the same floats),
        # without their per-call wrapper overhead
        n_obs = ys.size
        mean = float(np.add.reduce(ys) / n_obs)
        centred = ys - mean
        sd = math.sqrt(np.add.reduce(centred * centred) / n_obs)
        if not sd > 1e-12:
            sd = 1.0  # one point, or all equal: keep J's scale, no standardization to divide by zero
        # Exact GP regression with fixed hyperparameters: scikit-learn's kernel, numpy's solve.
        # (GaussianProcessRegressor gives the same numbers but costs ~8x more per step in input
        # validation; the drafter runs every step and FASER budgets it at <1% of inference time.)
        # The window's W observations sit at no more than K_max distinct s, and n observations at one s
        # with independent noise σ² tell the GP exactly what their mean does with noise σ²/n: so the
        # regression is over the distinct s (a K_max-square system, not W-square;
        # tests/policies/test_policies_gp_lcb.py checks it against the W-point regression), solved by
        # numpy directly (scipy's checked Cholesky wrappers cost more than the solve at this size). The
        # kernel is evaluated once per value pair and looked up.
        per_s = np.bincount(drafted)
        arms = np.flatnonzero(per_s)
        arm_means = np.bincount(drafted, weights=centred / sd)[arms] / per_s[arms]
        table = self._kernel_table(int(max(arms[-1], s_values.max())))
        integral = raw.dtype.kind in "iu" or np.array_equal(s_values, np.round(s_values))
        if integral and s_values.min() >= 0:
            query_idx = s_values.astype(int)
            cross = table[query_idx[:, None], arms]
            prior = table[query_idx, query_idx]
        else:  # non-integer query points: evaluate the kernel directly
            kernel = self._kernel()
            cross = kernel(s_values[:, None], arms[:, None].astype(float))
            prior = kernel.diag(s_values[:, None])
        gram = table[arms[:, None], arms]
        diagonal = np.arange(arms.size)
        gram[diagonal, diagonal] += p.noise_variance / per_s[arms]
        solved = np.linalg.solve(gram, np.concatenate((arm_means[:, None], cross.T), axis=1))  # K⁻¹[ȳ, k*]
        mu = cross @ solved[:, 0]
        var = prior - np.einsum("ij,ji->i", cross, solved[:, 1:])
        return mean + sd * mu, sd * np.sqrt(np.maximum(var, 0.0))

    def _kernel_table(self, s_max: int) -> np.ndarray:
        """k(s, s') for s, s' in 0..s_max (grown on demand)."""
        table = getattr(self, "_table", None)
        if table is None or table.shape[0] <= s_max:
            grid = np.arange(0, max(s_max, 16) + 1, dtype=float)[:, None]
            table = self._table = self._kernel()(grid)
        return table

    def _kernel(self) -> Any:
        if self._gp_kernel is None:
            # Imported lazily: scikit-learn takes a second to import and most strategies never need it.
            from sklearn.gaussian_process.kernels import ConstantKernel, Matern

            p = self.params
            self._gp_kernel = ConstantKernel(p.signal_variance, constant_value_bounds="fixed") * Matern(
                length_scale=p.lengthscale, length_scale_bounds="fixed", nu=2.5)
        return self._gp_kernel

    def select(self, key: ContextKey, k_max: int) -> tuple[int, float]:
        """s_n = argmin_s μ(s) − sqrt(β_n)·σ(s) over {1..k_max} (Eq. 3); returns (s_n, μ(s_n))."""
        s_values = np.arange(1, k_max + 1)
        mu, sigma = self.posterior(key, s_values)
        window = self._windows.get(key)
        n = (window.count if window is not None else 0) + 1
        lcb = mu - math.sqrt(beta_n(n, k_max, self.params.delta)) * sigma
        i = int(np.argmin(lcb))  # ties go to the shorter draft
        return int(s_values[i]), float(mu[i])

    # --- the length policy ------------------------------------------------------------------------

    def targets(self, ctx: StepContext) -> list[int]:
        return self.request_lengths([r.req_id for r in ctx.requests], batch_context_tokens(ctx), ctx.k_max,
                                    ctx.latency_model, ctx.sm_split)

    def request_lengths(self, req_ids: list[int], context_tokens: float, k_max: int,
                        latency_model: LatencyModel | None, sm_split: float | None) -> list[int]:
        """`targets` from what it reads: the step's requests, Σ context, K_max, the latency model and the
        step's SM split (`RequestLengthPolicy`)."""
        b = len(req_ids)
        if b == 0 or k_max < 1:
            self._last = None
            return [0] * b
        bucket = batch_bucket(b)
        pool: list[float | None] = list(self.params.sm_pool) or [sm_split]
        self._step_split = None
        # One GP per r; take the (r, s) with the lowest posterior mean.
        best: tuple[float, ContextKey, int] | None = None
        for r in pool:
            key = (bucket, r)
            s_n, mu = self.select(key, k_max)
            if best is None or mu < best[0]:
                best = (mu, key, s_n)
        assert best is not None
        _, key, s_n = best
        self._last = (key, s_n)
        if self.params.sm_pool:
            self._step_split = key[1]
        if not self.params.refine:
            return [s_n] * b
        # T̂(s) depends on the batch, not on the request: compute it once per candidate s, then take
        # Eq. 2's argmin for all requests at once.
        candidates = [s for s in (s_n - 1, s_n, s_n + 1) if 1 <= s <= k_max]
        t_hat = self.observed_step_time(key, candidates)
        if t_hat is None:  # fewer than two distinct s observed in this context: the fitted line
            if latency_model is None:
                return [s_n] * b
            t_hat = np.array([sd_step_time(latency_model, [s] * b, context_tokens) for s in candidates])
        p = np.array([self._accept.get(rid, np.nan) for rid in req_ids])
        known = ~np.isnan(p)
        gains = per_request_gains(np.where(known, p, 0.0), candidates)
        costs = t_hat[None, :] / (gains + self.params.eps)
        refined = np.asarray(candidates)[np.argmin(costs, axis=1)]  # ties keep the shorter draft
        return np.where(known, refined, s_n).tolist()

    def observe(self, ctx: StepContext, outcome: StepOutcome) -> None:
        self.observe_requests(outcome.req_ids, outcome.verified, outcome.accepted, outcome.finished,
                              outcome.draft_time_s + outcome.verify_time_s + outcome.early_exit_time_s, ())

    def observe_requests(self, req_ids: Sequence[int], verified: Sequence[int], accepted: Sequence[int],
                         finished: Sequence[bool], step_s: float, klds: Sequence[Sequence[float]]) -> None:
        """`observe` from what it reads: per request its verified and accepted drafts and whether it
        finished, and the step's seconds (draft + verify + early exit) (`RequestLengthPolicy`; no KLDs)."""
        w = self.params.ewma_weight
        for rid, v, m, done in zip(req_ids, verified, accepted, finished):
            if done:
                self._accept.pop(rid, None)
                continue
            if v <= 0:
                continue
            # per-position acceptance of this round: m successes in m (+1 if a rejection ended it) trials
            p_hat = m / (m + (1 if m < v else 0)) if m > 0 else 0.0
            old = self._accept.get(rid)
            self._accept[rid] = p_hat if old is None else w * p_hat + (1.0 - w) * old
        if self._last is None or not len(req_ids):
            return
        key, s_n = self._last
        t_obs = step_s
        # a_obs per Eq. 4, so that s_n·a_obs = mean accepted tokens per request (requests may have
        # drafted s_n ± 1 after refinement)
        a_obs = sum(accepted) / (len(req_ids) * s_n)
        self.record(key, s_n, t_obs / (s_n * a_obs + self.params.eps))
        self.record_time(key, s_n, t_obs)
        self._last = None
