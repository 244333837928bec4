"""Sequential Temperature Scaling of draft confidences (DSpark §3.2.1; docs/policies.md §6).

For draft position k = 1..K the survival "the first k drafts are all accepted" is predicted by
Π_{i<k} σ(z_i/T_i)·σ(z_k/T_k), z the logit of the draft confidence. T_k is picked from a grid
(2^(m/8), m = −48..24: T from 1/64 to 8) to minimise the expected calibration error (ECE, equal-width
bins) on a training split, the earlier temperatures held fixed (`fit_temperatures`); `fit_sts` also
holds out a split of chains and reports ECE before and after.

A binary temperature only pushes a confidence away from or towards 1/2: σ(z/T) stays below 1/2 for a
confidence below 1/2 whatever T is. The bundled draft's tokens reported at 0.2-0.4 are accepted ~64% of
the time, those below 0.2 ~44% (its profile), which is out of STS's reach; `autospec fit` fits STS next
to the calibrators of `autospec.policies.calibrators` (isotonic, Platt), which can map 0.3 to 0.64, and
DSpark applies whichever the fit chose (`calibrators.StsCalibrator` wraps these temperatures).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

# [chosen] T = 1/64..8 (POLICIES.md §6): the bundled draft's own-token probabilities are strongly
# under-confident, and a grid floored at T = 1/4 left its ECE at 0.27
DEFAULT_GRID = tuple(2.0 ** (m / 8.0) for m in range(-48, 25))


def logit(p: np.ndarray | float) -> np.ndarray:
    q = np.clip(np.asarray(p, float), 1e-6, 1.0 - 1e-6)
    return np.log(q) - np.log1p(-q)


def sigmoid(z: np.ndarray | float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.asarray(z, float)))


def ece(probs: Sequence[float] | np.ndarray, labels: Sequence[float] | np.ndarray, bins: int = 20) -> float:
    """Expected calibration error with `bins` equal-width bins on [0, 1]: Σ_b (n_b/N)·|acc_b − conf_b|."""
    p = np.asarray(probs, float)
    y = np.asarray(labels, float)
    if p.size == 0:
        return 0.0
    idx = np.minimum((p * bins).astype(int), bins - 1)
    total = 0.0
    for b in np.unique(idx):
        mask = idx == b
        total += mask.sum() * abs(y[mask].mean() - p[mask].mean())
    return float(total / p.size)


def survival(confidences: np.ndarray, temperatures: Sequence[float]) -> np.ndarray:
    """Predicted survival per (row, position): cumulative product of σ(z_k/T_k). NaN stays NaN.

    Positions past len(temperatures) reuse the last temperature [chosen]; no temperatures = T 1."""
    conf = np.atleast_2d(np.asarray(confidences, float))
    temps = np.ones(conf.shape[1])
    if len(temperatures):
        t = np.asarray(temperatures, float)
        temps[: min(len(t), conf.shape[1])] = t[: conf.shape[1]]
        temps[len(t):] = t[-1]
    return np.cumprod(sigmoid(logit(conf) / temps), axis=1)


def _pooled(surv: np.ndarray, accepted: np.ndarray, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    positions = np.arange(1, surv.shape[1] + 1)
    labels = (accepted[:, None] >= positions[None, :]).astype(float)
    return surv[valid], labels[valid]


@dataclass(frozen=True)
class StsCalibration:
    """Per-position temperatures with the held-out ECE before (T = 1) and after calibration."""

    temperatures: list[float]
    ece_before: float
    ece_after: float
    ece_before_by_position: list[float] = field(default_factory=list)
    ece_after_by_position: list[float] = field(default_factory=list)

    def calibrate(self, confidences: Sequence[float]) -> list[float]:
        """Calibrated per-position confidences σ(z_k/T_k) of one request's draft tokens."""
        if not confidences:
            return []
        surv = survival(np.asarray([confidences], float), self.temperatures)[0]
        prev = np.concatenate([[1.0], surv[:-1]])
        return list(surv / np.maximum(prev, 1e-300))

    def to_dict(self) -> dict:
        return asdict(self)


def _ece_per_row(probs: np.ndarray, labels: np.ndarray, bins: int) -> np.ndarray:
    """`ece` of every row of probs (G, N) against the same labels (N,), in one pass (the grid search)."""
    g, n = probs.shape
    if n == 0:
        return np.zeros(g)
    idx = np.minimum((probs * bins).astype(int), bins - 1) + bins * np.arange(g)[:, None]
    gaps = np.bincount(idx.ravel(), (labels[None, :] - probs).ravel(), minlength=g * bins).reshape(g, bins)
    return np.abs(gaps).sum(axis=1) / n


def fit_temperatures(confidences: np.ndarray, accepted: np.ndarray, *, grid: Sequence[float] = DEFAULT_GRID,
                     bins: int = 20) -> list[float]:
    """STS's sequential fit on all the given chains: T_k minimises the ECE of Π_{i<k} σ(z_i/T_i)·σ(z_k/T)
    over the grid, the earlier temperatures held fixed (ties: the smaller T, the grid's first).

    confidences: (N, K) with NaN past a chain's length; accepted: (N,) accepted prefix lengths."""
    conf = np.atleast_2d(np.asarray(confidences, float))
    acc = np.asarray(accepted, float)
    valid = ~np.isnan(conf)
    z = logit(np.nan_to_num(conf, nan=0.5))
    temps: list[float] = []
    temps_col = np.asarray(grid, float)[:, None]
    prefix = np.ones(conf.shape[0])
    for k in range(conf.shape[1]):
        rows = valid[:, k]
        labels = (acc >= k + 1).astype(float)[rows]
        if not rows.any():
            temps.append(temps[-1] if temps else 1.0)
            continue
        best = float(grid[int(np.argmin(_ece_per_row(prefix[rows] * sigmoid(z[rows, k][None, :] / temps_col),
                                                     labels, bins)))])
        temps.append(best)
        prefix = prefix * sigmoid(z[:, k] / best)
    return temps


def fit_sts(confidences: np.ndarray, accepted: np.ndarray, *, grid: Sequence[float] = DEFAULT_GRID,
            bins: int = 20, holdout: float = 0.2, seed: int = 0) -> StsCalibration:
    """Fit STS temperatures.

    confidences: (N, K) draft confidences of N recorded draft chains, NaN past a chain's length;
    accepted: (N,) accepted prefix length of each chain. Position k of a chain is a sample when the
    chain drafted at least k tokens; its label is accepted >= k.
    """
    conf = np.atleast_2d(np.asarray(confidences, float))
    acc = np.asarray(accepted, float)
    if conf.shape[0] != acc.shape[0]:
        raise ValueError("confidences and accepted need the same number of rows")
    n, k_max = conf.shape
    order = np.random.default_rng(seed).permutation(n)
    n_test = int(round(holdout * n))
    test, train = order[:n_test], order[n_test:]
    valid = ~np.isnan(conf)
    temps = fit_temperatures(conf[train], acc[train], grid=grid, bins=bins)

    def held_out(temperatures: Sequence[float]) -> tuple[float, list[float]]:
        surv = survival(np.nan_to_num(conf[test], nan=0.5), temperatures)
        p, y = _pooled(surv, acc[test], valid[test])
        positions = np.arange(1, k_max + 1)
        labels = acc[test][:, None] >= positions[None, :]
        per = [ece(surv[valid[test][:, k], k], labels[valid[test][:, k], k], bins) for k in range(k_max)]
        return ece(p, y, bins), per

    before, before_pos = held_out([1.0] * k_max)
    after, after_pos = held_out(temps)
    return StsCalibration(temps, before, after, before_pos, after_pos)
