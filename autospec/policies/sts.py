"""Sequential Temperature Scaling of draft confidences (DSpark §3.2.1; docs/policies.md §6).

For draft position k = 1..K the survival "the first k drafts are all accepted" is predicted by
Π_{i<k} σ(z_i/T_i)·σ(z_k/T_k), z the logit of the draft confidence. T_k is picked from a grid
(2^(m/8), m = −16..24) to minimise the expected calibration error (ECE, equal-width bins) on a
training split, the earlier temperatures held fixed; a held-out split reports ECE before and after.
`autospec fit` calls `fit_sts`; DSpark applies the temperatures through `StsCalibration`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

DEFAULT_GRID = tuple(2.0 ** (m / 8.0) for m in range(-16, 25))  # [chosen]


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
    z = logit(np.nan_to_num(conf, nan=0.5))

    temps: list[float] = []
    prefix = np.ones(len(train))
    for k in range(k_max):
        rows = valid[train, k]
        labels = (acc[train] >= k + 1).astype(float)[rows]
        if not rows.any():
            temps.append(temps[-1] if temps else 1.0)
            continue
        errors = [ece(prefix[rows] * sigmoid(z[train, k][rows] / t), labels, bins) for t in grid]
        best = float(grid[int(np.argmin(errors))])
        temps.append(best)
        prefix = prefix * sigmoid(z[train, k] / best)

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
