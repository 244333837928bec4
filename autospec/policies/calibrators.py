"""Calibrators of draft confidences: the survival a_j = P(the first j drafts are all accepted) of one
draft chain from its confidences c_1..c_K (DSpark §3.2.1; docs/policies.md §6).

DSpark ranks every request's draft tokens by a_j and prices the throughput of verifying them with
τ = Σ a_j; raw confidences "distort the throughput estimation" (the paper), so `autospec fit` fits
these calibrators on the profile's acceptance traces (the chain confidences against the match length
m: the label of position j is m ≥ j), picks one by held-out ECE (`autospec.fit.fit_calibration`),
stores it in fit/models.json, and DSpark applies it (`DsparkParams.calibration`). Both call
`Calibrator.survival`, so what the fit evaluated is exactly what the policy computes.

Kinds (each a pydantic model, JSON- and TOML-serialisable; `kind` tells them apart):

* `identity` — a_j = Π_{i≤j} c_i, the raw confidences (what DSpark uses uncalibrated).
* `sts` — Sequential Temperature Scaling, DSpark's own method: a_j = Π_{i≤j} σ(z_i/T_i), z = logit c
  (`autospec.policies.sts`).
* `isotonic` — per position j an isotonic (non-decreasing, piecewise-linear) map of the raw survival
  s_j = Π_{i≤j} c_i to P(m ≥ j), fitted by scikit-learn's `IsotonicRegression` and stored as its
  knots (x_j, y_j); applied with `np.interp`, which is the regression's own `predict` (clipped at the
  ends). Unlike a temperature it can move a confidence across 1/2 (0.3 → 0.8), which this signal needs.
* `platt` — per position j, a_j = σ(A_j·logit(s_j) + B_j) (Platt scaling: a two-parameter logistic
  regression, `logistic_1d`).

Per-position maps are fitted separately, so a_{j+1} could exceed a_j; the true survival cannot (the
event "first j+1 accepted" is inside "first j accepted"), and DSpark's ranking needs every request's
admitted tokens to form a prefix, so `isotonic` and `platt` return the running minimum over positions
[chosen: a running minimum, not a pooled average over the chain (the L2 projection), because a_j must
depend on c_1..c_j only — the synchronous form is lossless only then (DSpark App. A); it costs some
bias (on the bundled pair's quick profile held-out ECE 0.015 with it, 0.011 without)]. Positions past
the fitted ones reuse the last position's map [chosen] (STS: its last temperature). NaN confidences
(past a chain's end) give NaN survivals.
"""

from __future__ import annotations

from typing import Annotated, Literal, Sequence, Union

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from autospec.policies.sts import DEFAULT_GRID, ece, fit_temperatures, logit, sigmoid, survival

# how ECE is binned everywhere in this project (sts.ece): 20 equal-width bins [chosen, docs/policies.md §6]
ECE_BINS = 20


class _CalibratorBase(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    def survival(self, confidences: np.ndarray | Sequence[Sequence[float]]) -> np.ndarray:
        """(N, K) survivals a_j of N chains from their (N, K) confidences (NaN past a chain's end)."""
        raise NotImplementedError

    def describe(self) -> str:
        return self.kind  # type: ignore[attr-defined]


class IdentityCalibrator(_CalibratorBase):
    """The raw confidences: a_j = Π_{i≤j} c_i."""

    kind: Literal["identity"] = "identity"

    def survival(self, confidences):
        return np.cumprod(_matrix(confidences), axis=1)


class StsCalibrator(_CalibratorBase):
    """Sequential Temperature Scaling (DSpark §3.2.1): a_j = Π_{i≤j} σ(logit(c_i)/T_i)."""

    kind: Literal["sts"] = "sts"
    temperatures: list[float] = Field(min_length=1)

    @model_validator(mode="after")
    def _positive(self) -> "StsCalibrator":
        if any(not t > 0 for t in self.temperatures):
            raise ValueError("temperatures must be positive")
        return self

    def survival(self, confidences):
        return survival(_matrix(confidences), self.temperatures)


class IsotonicCalibrator(_CalibratorBase):
    """Per position j, a_j = interp(s_j; x_j, y_j) with s_j = Π_{i≤j} c_i (knots of an isotonic fit)."""

    kind: Literal["isotonic"] = "isotonic"
    x: list[list[float]] = Field(min_length=1)  # per position: increasing raw-survival knots
    y: list[list[float]] = Field(min_length=1)  # per position: non-decreasing P(m ≥ j) at the knots, in [0, 1]

    @model_validator(mode="after")
    def _knots(self) -> "IsotonicCalibrator":
        if len(self.x) != len(self.y):
            raise ValueError("x and y need one knot list per position")
        for j, (xs, ys) in enumerate(zip(self.x, self.y)):
            if not xs or len(xs) != len(ys):
                raise ValueError(f"position {j + 1}: x and y need the same, non-zero number of knots")
            if any(b < a for a, b in zip(xs, xs[1:])) or any(b < a for a, b in zip(ys, ys[1:])):
                raise ValueError(f"position {j + 1}: knots must be non-decreasing")
            if any(not 0.0 <= v <= 1.0 for v in ys):
                raise ValueError(f"position {j + 1}: y must lie in [0, 1]")
        return self

    def survival(self, confidences):
        raw = np.cumprod(_matrix(confidences), axis=1)
        out = np.empty_like(raw)
        last = len(self.x) - 1
        for j in range(raw.shape[1]):
            xs, ys = self.x[min(j, last)], self.y[min(j, last)]
            out[:, j] = np.interp(raw[:, j], xs, ys)  # NaN in, NaN out
        return _monotone(out)


class PlattCalibrator(_CalibratorBase):
    """Per position j, a_j = σ(A_j·logit(s_j) + B_j) with s_j = Π_{i≤j} c_i."""

    kind: Literal["platt"] = "platt"
    coef: list[list[float]] = Field(min_length=1)  # per position [A_j, B_j]

    @model_validator(mode="after")
    def _pairs(self) -> "PlattCalibrator":
        if any(len(c) != 2 for c in self.coef):
            raise ValueError("coef needs one [A, B] pair per position")
        return self

    def survival(self, confidences):
        raw = np.cumprod(_matrix(confidences), axis=1)
        coef = np.asarray(self.coef, float)
        idx = np.minimum(np.arange(raw.shape[1]), len(coef) - 1)
        return _monotone(sigmoid(coef[idx, 0] * logit(raw) + coef[idx, 1]))


Calibrator = Annotated[Union[IdentityCalibrator, StsCalibrator, IsotonicCalibrator, PlattCalibrator],
                       Field(discriminator="kind")]
CALIBRATOR = TypeAdapter(Calibrator)
KINDS = ("identity", "sts", "isotonic", "platt")


def _matrix(confidences) -> np.ndarray:
    return np.atleast_2d(np.asarray(confidences, float))


def _monotone(surv: np.ndarray) -> np.ndarray:
    """Running minimum over positions (NaN stays NaN: it only trails a chain)."""
    if surv.shape[1] == 0:
        return surv
    return np.minimum.accumulate(surv, axis=1)


def survival_labels(accepted: np.ndarray, k: int) -> np.ndarray:
    """(N, K) 0/1 labels "the first j drafts are all accepted" (m ≥ j) from accepted prefix lengths m."""
    return (np.asarray(accepted, float)[:, None] >= np.arange(1, k + 1)[None, :]).astype(float)


# --- fitting ------------------------------------------------------------------------------------------


def _columns(conf: np.ndarray, accepted: np.ndarray):
    """Per position j: the raw survivals and labels of the chains that drafted position j."""
    raw = np.cumprod(conf, axis=1)
    labels = survival_labels(accepted, conf.shape[1])
    valid = ~np.isnan(conf)
    for j in range(conf.shape[1]):
        rows = valid[:, j]
        yield j, raw[rows, j], labels[rows, j]


def fit_sts_calibrator(conf: np.ndarray, accepted: np.ndarray, *, grid: Sequence[float] = DEFAULT_GRID,
                       bins: int = ECE_BINS) -> StsCalibrator:
    return StsCalibrator(temperatures=fit_temperatures(conf, accepted, grid=grid, bins=bins))


def fit_isotonic(conf: np.ndarray, accepted: np.ndarray) -> IsotonicCalibrator:
    """Isotonic regression of P(m ≥ j) on the raw survival s_j, per position. A position no chain
    drafted reuses the previous position's knots (the identity map before any)."""
    from sklearn.isotonic import IsotonicRegression

    xs: list[list[float]] = []
    ys: list[list[float]] = []
    for _, s, y in _columns(_matrix(conf), np.asarray(accepted, float)):
        if s.size == 0:
            xs.append(xs[-1] if xs else [0.0, 1.0])
            ys.append(ys[-1] if ys else [0.0, 1.0])
            continue
        reg = IsotonicRegression(y_min=0.0, y_max=1.0, increasing=True, out_of_bounds="clip").fit(s, y)
        xs.append([float(v) for v in reg.X_thresholds_])
        ys.append([float(v) for v in reg.y_thresholds_])
    return IsotonicCalibrator(x=xs, y=ys)


def logistic_1d(x: np.ndarray, y: np.ndarray, ridge: float = 1e-4, iterations: int = 100) -> tuple[float, float]:
    """(A, B) maximising the likelihood of P(y = 1) = σ(A·x + B), by Newton's method (two parameters:
    scikit-learn's LogisticRegression gives the same, ~100x slower). `ridge` (an L2 penalty per
    sample [chosen]) keeps separable data finite."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    theta = np.zeros(2)
    design = np.column_stack([x, np.ones_like(x)])
    n = len(x)
    for _ in range(iterations):
        p = sigmoid(design @ theta)
        grad = design.T @ (p - y) / n + ridge * theta
        hess = (design * (p * (1 - p))[:, None]).T @ design / n + ridge * np.eye(2)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.max(np.abs(step)) < 1e-10:
            break
    return float(theta[0]), float(theta[1])


def fit_platt(conf: np.ndarray, accepted: np.ndarray) -> PlattCalibrator:
    """Logistic regression of m ≥ j on logit(s_j), per position (`logistic_1d`). A position with one
    class only (or none) keeps the previous position's map (the identity σ(logit s) before any)."""
    coef: list[list[float]] = []
    for _, s, y in _columns(_matrix(conf), np.asarray(accepted, float)):
        if s.size == 0 or y.min() == y.max():
            coef.append(coef[-1] if coef else [1.0, 0.0])
            continue
        coef.append(list(logistic_1d(logit(s), y)))
    return PlattCalibrator(coef=coef)


FITTERS = {"sts": fit_sts_calibrator, "isotonic": fit_isotonic, "platt": fit_platt}


# --- metrics (what `autospec fit` reports) ----------------------------------------------------------------


def pooled(surv: np.ndarray, accepted: np.ndarray, valid: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Predictions and labels of every drafted (chain, position), flattened."""
    labels = survival_labels(accepted, surv.shape[1])
    mask = ~np.isnan(surv) if valid is None else valid
    return surv[mask], labels[mask]


def brier(probs: np.ndarray, labels: np.ndarray) -> float:
    p, y = np.asarray(probs, float), np.asarray(labels, float)
    return float(np.mean((p - y) ** 2)) if p.size else 0.0


def bin_index(probs: np.ndarray, bins: int = ECE_BINS) -> np.ndarray:
    """The equal-width bin of each probability, as `sts.ece` bins them."""
    return np.minimum((np.asarray(probs, float) * bins).astype(int), bins - 1)


def reliability(probs: np.ndarray, labels: np.ndarray, bins: int = ECE_BINS) -> list[dict[str, float]]:
    """The reliability diagram's points: per non-empty bin its count, mean prediction and observed rate."""
    p, y = np.asarray(probs, float), np.asarray(labels, float)
    idx = bin_index(p, bins)
    out = []
    for b in np.unique(idx):
        m = idx == b
        out.append({"count": int(m.sum()), "predicted": float(p[m].mean()), "observed": float(y[m].mean())})
    return out


__all__ = ["Calibrator", "CALIBRATOR", "IdentityCalibrator", "StsCalibrator", "IsotonicCalibrator",
           "PlattCalibrator", "FITTERS", "KINDS", "ECE_BINS", "fit_isotonic", "fit_platt", "fit_sts_calibrator",
           "survival_labels", "pooled", "brier", "reliability", "bin_index", "ece"]
