"""`autospec fit`: turn a profile into the models policies and the simulator consume (docs/architecture.md, "Stages").

From `DIR/profile/` it fits, each with a held-out error so a user can see how far to trust it:

* AdaSpec's linear forward model T = α·N_c + γ·N_b + δ per model (N_c = the context summed over
  the pass's positions, Eq. 3–4: batch·(tokens·context + tokens·(tokens − 1)/2); N_b = batch·tokens)
  on the decode rows, robust relative least squares (`fit_linear_relative`), with a
  seeded 5-fold cross-validated MAPE (each fold holds out 20% of the rows; `fit_latency`); policies
  use it;
* the simulator's clock: the same with the context counted once per pass (N_c = batch·context) plus
  λ·log2(N_b) + μ·[N_b ≥ 2] (latency.LinearCoeffs says why), same MAPE; and,
  when the profile has `decode_plain` rows (vLLM's plain engine, which serves no-SD), the target's
  clock in that engine; when it has `decode_drafting` rows (vLLM's draft_model engine, which serves
  SD), the target's clock in that engine, which prices every SD step's multi-token target pass
  (`clock_drafting`); on a vLLM profile also the draft round's clock and, reported only, the clocks'
  signed error per K on the whole draft steps and on the draft_model engine's target side
  (`draft_step_bias`, `drafting_target_bias`), and what a round's i-th draft pass costs relative to the
  clock's pass (`draft_pass_weights`: vLLM's draft step is not linear in K);
* FASER's piecewise model per model (latency.fit_piecewise: one segment when the profile has no SM
  split), same MAPE;
* a prefill line per model, T = per_token·(batch·tokens) + fixed, from the prefill rows by the same
  robust relative fit (`fit_line_relative`; it prices admission in the simulator and the KV swap cost
  on preemption), with a term per prompt in its length squared when the line misses the rows by more
  than PREFILL_LINE_MAPE on average (attention over a long prompt; `_prefill_line`);
* DSpark's SPS(B) table: target steps per second at B = batch·tokens verification tokens, measured at
  the profile's typical (median) context;
* per-position acceptance per domain: P(m ≥ j), j = 1..K_max, from the acceptance traces;
* the acceptance calibration DSpark applies (`fit_calibration`): calibrators of P(the first j drafts
  are all accepted) from the chain's confidences — STS (DSpark's own), isotonic and Platt
  (autospec.policies.calibrators) — scored held out by prompt (k-fold, no prompt on both sides) with
  ECE and its bias-corrected bootstrap CI (`ece_interval`) and the Brier skill score against the
  per-position base rate; the lowest held-out ECE is chosen, refitted on every chain and stored
  (`calibration`; `sts` keeps STS's own temperatures and ECE before/after).

Everything lands in `DIR/fit/models.json`; `load_fit` reads it back as a `FitResult`.
`FittedSimEngine.from_dirs` builds the simulator of a run directory from its profile and fit (fitting
in memory when fit/ is absent); the engine itself takes only the fitted data.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from autospec.artifacts import write_json

# fit/models.json's schema (re-exported: callers import it from here)
from autospec.calibration import (
    CalibrationFit,
    CalibrationScore,
    FitModels,
    PrefillLine,
    read_acceptance_table,
    read_fit_models,
    read_latency_table,
    read_profile_meta,
)
from autospec.config import SCHEMA_VERSION
from autospec.engines.sim import AcceptanceTraces, SimCosts, SimEngine
from autospec.errors import InputError
from autospec.latency import (
    FaserModels,
    LinearCoeffs,
    LinearLatencyModel,
    PiecewiseLatency,
    fit_piecewise,
    linear_features,
    mape,
)
from autospec.policies.calibrators import (
    ECE_BINS,
    FITTERS,
    Calibrator,
    IdentityCalibrator,
    StsCalibrator,
    bin_index,
    reliability,
    survival_labels,
)
from autospec.policies.sts import StsCalibration, ece
from autospec.serving.coverage import ProfiledGrid

HOLDOUT = 0.2  # fraction of profile points held out for MAPE / ECE
# [chosen] a prefill line is kept while its in-sample MAPE over the profile's prefill rows is at most 5%
# (inside the decode clocks' held-out MAPE on the CI VM, 1.9-11.3%); past it the fit adds a term in L²
# (_prefill_line). The CI profile's and the vLLM fidelity runs' prefill lines are within it (docs/architecture.md).
PREFILL_LINE_MAPE = 0.05
NOMINAL_SPLIT = 0.5  # r used for rows without an SM split: any constant r gives a one-segment fit


@dataclass(frozen=True)
class FitResult:
    """A loaded fit: the latency model policies consult and the tables the simulator uses."""

    models: FitModels

    @property
    def latency_model(self) -> LinearLatencyModel:
        return self.models.linear.latency_model()

    @property
    def clock_model(self) -> LinearLatencyModel:
        """The simulator's clock (FitModels.clock), or the linear model for an older fit."""
        return (self.models.clock or self.models.linear).latency_model()

    @property
    def plain_target_clock(self) -> LinearCoeffs | None:
        """FitModels.clock_plain as coefficients (None when the profile had no plain-engine rows)."""
        return self.models.clock_plain.coeffs() if self.models.clock_plain else None

    @property
    def drafting_target_clock(self) -> LinearCoeffs | None:
        """FitModels.clock_drafting as coefficients (None when the profile had no decode_drafting rows)."""
        return self.models.clock_drafting.coeffs() if self.models.clock_drafting else None

    @property
    def draft_pass_weights(self) -> tuple[float, ...] | None:
        """FitModels.draft_pass_weights (None when the profile had no draft step rows)."""
        w = self.models.draft_pass_weights
        return tuple(w) if w else None

    @property
    def draft_round_clock(self) -> LinearCoeffs | None:
        """FitModels.clock_draft_round as coefficients (None when the profile had no round rows)."""
        return self.models.clock_draft_round.coeffs() if self.models.clock_draft_round else None

    @property
    def sps(self) -> tuple[list[int], list[float]]:
        return [int(b) for b in self.models.sps["tokens"]], list(self.models.sps["values"])

    @property
    def piecewise(self) -> dict[str, PiecewiseLatency]:
        return {k: v.latency() for k, v in self.models.piecewise.items()}

    @property
    def faser(self) -> FaserModels | None:
        """FASER's models as the serving step and engines use them (frontier chunk "auto", the
        simulator's overlapped timing, early exit's Eq. 10 times); None without draft and target fits."""
        return FaserModels.from_dict({k: v.model_dump() for k, v in self.models.piecewise.items()})

    @property
    def prefill(self) -> dict[str, PrefillLine]:
        return self.models.prefill

    @property
    def sts(self) -> StsCalibration:
        s = self.models.sts
        return StsCalibration(list(s["temperatures"]), s["ece_before"], s["ece_after"])

    @property
    def calibrator(self) -> Calibrator:
        """The calibrator DSpark applies: the fit's chosen one; for a fit written before calibrators were
        chosen, its STS temperatures."""
        if self.models.calibration is not None:
            return self.models.calibration.calibrator
        temps = list(self.models.sts.get("temperatures") or [])
        return StsCalibrator(temperatures=temps) if temps else IdentityCalibrator()

    @property
    def policy_inputs(self) -> dict[str, Any]:
        """What policies take from the fit by default (`autospec.strategy.apply_fit`): DSpark's calibrator
        and SPS(B) table, as preset parameters."""
        tokens, values = self.sps
        return {"calibration": self.calibrator.model_dump(mode="json"), "sps_tokens": tokens, "sps_values": values}

    @property
    def per_position_acceptance(self) -> dict[str, list[float]]:
        return self.models.per_position_acceptance


def fit_linear_relative(rows: np.ndarray, log_term: bool = False) -> LinearCoeffs:
    """AdaSpec's (α, γ, δ) from rows [N_c, N_b, seconds], fitted for relative error; with `log_term`
    also λ and μ of the simulator's clock model (λ·log2 N_b + μ·[N_b ≥ 2], see latency.LinearCoeffs) —
    μ only when the rows have passes over one token and over more (else it cannot be told from δ) —
    and, when the rows carry a fourth column (the requests in the pass), the decode pass's α (rows
    feeding one token each), again only when there are decode and multi-token passes both; a fifth
    column (1: one token per row, rows of unequal length) gives those masked passes their own α
    (`alpha_ragged`) when other rows fix α.

    Why not plain least squares (latency.fit_linear): it weighs the slowest shapes most and, on a
    shared machine, lets one multi-second outlier drag δ negative, which wrecks the fast shapes. Here
    residuals are relative (prediction/measured − 1, the quantity MAPE reports), the loss is soft-L1
    (robust to the odd preempted measurement), and the coefficients are bounded at 0 (a pass cannot get
    faster with more work). Plain relative least squares (scipy nnls) gives the starting point."""
    # lazily: scipy.optimize costs ~0.5 s, and `autospec report`, `tune` and `evaluate --engine sim` import
    # this module only to read a fit (docs/architecture.md, "Imports")
    from scipy.optimize import least_squares, nnls

    data = np.asarray(rows, float)
    n_c, n_b, seconds = data[:, 0], data[:, 1], data[:, 2]

    def both(mask: np.ndarray) -> bool:
        return bool(np.any(mask)) and bool(not np.all(mask))

    multi_term = log_term and both(n_b >= 2)
    one_token = n_b <= data[:, 3] if data.shape[1] > 3 else np.zeros(len(data), bool)
    ragged = one_token & (data[:, 4] > 0) if data.shape[1] > 4 else np.zeros(len(data), bool)
    decode = one_token & ~ragged
    decode_term = log_term and bool(np.any(decode)) and bool(np.any(~one_token))
    ragged_term = log_term and both(ragged)
    own_alpha = (decode & decode_term) | (ragged & ragged_term)  # rows priced by an α of their own
    names = ["alpha", "gamma", "delta"]
    columns = [np.where(own_alpha, 0.0, n_c), n_b, np.ones(len(data))]
    if log_term:
        names.append("lam")
        columns.append(np.log2(np.maximum(n_b, 1.0)))
    if multi_term:
        names.append("multi")
        columns.append((n_b >= 2).astype(float))
    if decode_term:
        names.append("alpha_decode")
        columns.append(np.where(decode, n_c, 0.0))
    if ragged_term:
        names.append("alpha_ragged")
        columns.append(np.where(ragged, n_c, 0.0))
    design = np.column_stack(columns) / seconds[:, None]
    start, _ = nnls(design, np.ones(len(data)))
    # optimise in units of the start so all are O(1); a coefficient nnls put at 0 starts at a small
    # share of the mean time instead (1e-12 s would leave it stuck there)
    scale = np.where(start > 0, start, 0.01 * float(np.mean(seconds)))
    x0 = np.where(start > 0, 1.0, 0.0)
    sol = least_squares(lambda th: design @ (th * scale) - 1.0, x0, bounds=(0.0, np.inf),
                        loss="soft_l1", f_scale=0.1)
    return LinearCoeffs(**{name: float(v) for name, v in zip(names, sol.x * scale)})


def fit_line_relative(x: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(per_x, fixed) of seconds = per_x·x + fixed, fitted like `fit_linear_relative`: relative
    residuals, soft-L1 loss, both coefficients >= 0. A prefill line has few points; plain least squares
    let one preempted measurement (a 0.18 s median for a 256-token draft prefill that takes 0.01 s) set
    the slope, and the simulator then charged 3x the real admission cost."""
    a, b = _fit_terms_relative([x, np.ones_like(np.asarray(x, float))], seconds)
    return a, b


def _fit_terms_relative(terms: list[np.ndarray], seconds: np.ndarray) -> list[float]:
    """Coefficients >= 0 of seconds = Σ coefficient·term, relative residuals, soft-L1 loss, started
    from plain relative least squares (scipy nnls); `fit_line_relative` says why."""
    from scipy.optimize import least_squares, nnls

    t = np.asarray(seconds, float)
    design = np.column_stack([np.asarray(term, float) for term in terms]) / t[:, None]
    start, _ = nnls(design, np.ones_like(t))
    scale = np.maximum(start, 1e-12)
    sol = least_squares(lambda th: design @ (th * scale) - 1.0, np.ones(len(terms)), bounds=(0.0, np.inf),
                        loss="soft_l1", f_scale=0.1)
    return [float(v) for v in sol.x * scale]


def _folds(n: int, seed: int) -> list[np.ndarray]:
    """Seeded cross-validation folds of the row indices, each holding out HOLDOUT of the rows (5 folds
    at 20%; fewer when there are too few rows to leave 3 to fit on)."""
    order = np.random.default_rng(seed).permutation(n)
    k = max(2, min(int(round(1 / HOLDOUT)), n // 4))
    return [f for f in np.array_split(order, k) if len(f)]


def _held_out_mape(n: int, seed: int, fit_and_predict) -> float:
    """MAPE of predictions each made by a model fitted without the row's fold (k-fold CV):
    `fit_and_predict(train_idx, test_idx)` returns (predicted, actual) for the test rows."""
    predicted, actual = [], []
    for test in _folds(n, seed):
        train = np.setdiff1d(np.arange(n), test)
        p, a = fit_and_predict(train, test)
        predicted.extend(np.asarray(p, float).ravel())
        actual.extend(np.asarray(a, float).ravel())
    return mape(predicted, actual)


def fit_latency(latency: pd.DataFrame, seed: int = 0) -> dict[str, Any]:
    """Linear, clock, piecewise and prefill fits per model. Each model is fitted on every decode row;
    its error is the k-fold cross-validated MAPE (every row predicted by a fit that did not see it,
    HOLDOUT of the rows per fold) — with a quick profile's 12 draft rows one 80/20 split held out 2
    rows, too few to tell a model from noise."""
    out: dict[str, Any] = {"linear": {}, "linear_mape": {}, "clock": {}, "clock_mape": {}, "piecewise": {},
                           "piecewise_mape": {}, "prefill": {}, "prefill_mape": {}, "points": {}}
    phase = latency["phase"] if "phase" in latency else pd.Series("decode", index=latency.index)
    for model in ("draft", "target"):
        rows = latency[(latency["model"] == model) & (phase == "decode")]
        if len(rows) < 5:
            raise InputError(f"the profile has {len(rows)} decode rows for the {model}; a fit needs at least 5",
                             field="latency.parquet")
        b, s, c, t = (rows[k].to_numpy(float) for k in ("batch", "tokens", "context", "median_s"))
        r = rows["sm_split"].fillna(NOMINAL_SPLIT).to_numpy(float)
        # AdaSpec's model (policies) is fitted on the context summed over the pass's positions, as Eq.
        # 3–4 use it (latency.linear_features); the simulator's clock keeps the context counted once
        # per pass (the form it has always timed passes with).
        # (the clock's fourth column: the requests in the pass, which tells decode passes apart; its
        # fifth: 1 for the `decode_ragged` rows — one token per row, rows of unequal length, timed at
        # the longest row's context, which the padded engine attends for every row)
        ragged = latency[(latency["model"] == model) & (phase == "decode_ragged")]
        rb, rs, rc, rt = (ragged[k].to_numpy(float) for k in ("batch", "tokens", "context", "median_s"))
        designs = {"linear": np.column_stack([*linear_features(b, s, c), t]),
                   "clock": np.vstack([np.column_stack([b * c, b * s, t, b, np.zeros_like(b)]),
                                       np.column_stack([rb * rc, rb * rs, rt, rb, np.ones_like(rb)])])}
        for name, log_term in (("linear", False), ("clock", True)):
            design = designs[name]
            n = len(design)

            def linear_cv(train, test, log_term=log_term, design=design):
                co = fit_linear_relative(design[train], log_term=log_term)
                return [co.forward(*row[:2], *row[3:]) for row in design[test]], design[test][:, 2]

            out[name][model] = fit_linear_relative(design, log_term=log_term)
            out[f"{name}_mape"][model] = _held_out_mape(n, seed, linear_cv)
        kind = "draft" if model == "draft" else "target"
        out["piecewise"][model], out["piecewise_mape"][model] = _piecewise_with_cv(kind, b, s, r, t, seed)
        out["points"][model] = len(rows)
        pre = latency[(latency["model"] == model) & (phase == "prefill")]
        out["prefill"][model], out["prefill_mape"][model] = _prefill_line(pre, out["linear"][model])
    # FASER's early-exit check T_ee and pruning cost T_pr (Eq. 13–14), when the profile timed them (rows
    # with model "early_exit" / "prune": tokens = positions per request). Eq. 10 then uses the fitted
    # times (TorchSDEngine.configure_execution) instead of EarlyExitParams' cost ratios.
    for kind in ("early_exit", "prune"):
        rows = latency[(latency["model"] == kind) & (phase == "decode")]
        if len(rows) < 5:
            continue
        b, s, t = (rows[k].to_numpy(float) for k in ("batch", "tokens", "median_s"))
        r = rows["sm_split"].fillna(NOMINAL_SPLIT).to_numpy(float)
        out["piecewise"][kind], out["piecewise_mape"][kind] = _piecewise_with_cv(kind, b, s, r, t, seed)
        out["points"][kind] = len(rows)
    # the target's clock in an engine serving without SD (vLLM's plain engine), from `decode_plain` rows
    out["clock_plain"], out["clock_plain_mape"] = _engine_target_clock(latency, phase, "decode_plain", seed)
    # the target's clock on the engine that drafts (vLLM's draft_model engine, which a replay serves SD
    # with), from its `decode_drafting` rows: the fixed-K engine's `decode` rows, which `clock` is fitted
    # to, ran 5-9% under those steps at K >= 2 (docs/vllm.md, "Profile on vLLM")
    out["clock_drafting"], out["clock_drafting_mape"] = _engine_target_clock(latency, phase, "decode_drafting", seed)
    out["clock_draft_round"], out["clock_draft_round_error"] = _draft_round_fit(latency, phase, seed)
    # what the step's passes cost by their place in the round (a draft step is not linear in K, the line over
    # K that split it into passes and a round is not: `_draft_pass_weights`)
    out["draft_pass_weights"] = _draft_pass_weights(latency, phase, out["clock"]["draft"], out["clock_draft_round"])
    # the whole-step clock — the round plus K weighted draft passes — on the `step` rows the two were split
    # from (in-sample): its MAPE, and per K its signed error, which the MAPE hides
    steps = _draft_steps_priced(latency, phase, out["clock"]["draft"], out["clock_draft_round"],
                                out["draft_pass_weights"])
    out["draft_step_mape"] = None if steps is None else mape(steps[1], steps[2])
    out["draft_step_bias"] = None if steps is None else _bias_by_tokens(*steps)
    out["drafting_target_bias"] = _drafting_target_bias(latency, phase, out["clock_drafting"] or out["clock"]["target"])
    return out


def _engine_target_clock(latency: pd.DataFrame, phase: pd.Series, row_phase: str,
                         seed: int) -> tuple[LinearCoeffs | None, float | None]:
    """The target's clock (with λ and μ, `fit_linear_relative`) and its k-fold MAPE from the profile's
    target rows of `row_phase` — one engine form's steps; (None, None) with fewer than 5 of them."""
    rows = latency[(latency["model"] == "target") & (phase == row_phase)]
    if len(rows) < 5:
        return None, None
    design = np.column_stack([(rows["batch"] * rows["context"]).to_numpy(float),
                              (rows["batch"] * rows["tokens"]).to_numpy(float),
                              rows["median_s"].to_numpy(float), rows["batch"].to_numpy(float)])
    return _linear_with_cv(design, True, seed)


def _bias_by_tokens(tokens: np.ndarray, predicted: np.ndarray, measured: np.ndarray) -> dict[int, float]:
    """Per value of `tokens`, the median over its rows of predicted / measured − 1 (signed: > 0 where the
    clock over-prices)."""
    ratio = predicted / measured - 1
    return {int(k): float(np.median(ratio[tokens == k])) for k in np.unique(tokens)}


def _draft_pass_weights(latency: pd.DataFrame, phase: pd.Series, draft_clock: LinearCoeffs,
                        round_clock: LinearCoeffs | None) -> list[float] | None:
    """What the i-th draft pass of a round costs, as a multiple w_i of the draft clock's pass (i = 1 ..
    the profile's K_max), from its draft `step` rows (a vLLM profile): per profiled K the median over
    (batch, context) of (step − round) / pass, i.e. W_K = w_1 + .. + w_K, held non-decreasing from W_0 = 0
    and linear between the profiled K (1, 2, K_max / 2, K_max). None without step rows or a round clock
    (the torch engine: every pass costs the clock's pass).

    Why: `latency_profile.draft_line` splits each shape's steps over K into a per-pass and a per-round
    cost by a line, and vLLM's draft step is not linear in K — one line over K = 1, 2, 4, 8 priced the
    whole step 9-13% over at K = 1 and 4-6% under at K = 2 and 4 in three quick profiles of the bundled
    pair, whose weights read 0.66-0.84 for the first pass, 1.28-1.56 for the second, 1.01-1.09 for the
    third and fourth and 0.88-0.93 after (docs/vllm.md, "Profile on vLLM"): with one line the replay's
    K = 1 steps came out dear and its K = 2-4 steps cheap on the simulator."""
    steps = latency[(latency["model"] == "draft") & (phase == "step")]
    if not len(steps) or round_clock is None:
        return None
    b, k, c, t = (steps[name].to_numpy(float) for name in ("batch", "tokens", "context", "median_s"))
    one_pass = np.array([draft_clock.forward(bb * cc, bb, bb) for bb, cc in zip(b, c)])
    rounds = np.array([round_clock.forward(bb * cc, bb) for bb, cc in zip(b, c)])
    ks = np.unique(k)
    passes = np.array([np.median(((t - rounds) / one_pass)[k == kk]) for kk in ks])
    passes = np.maximum.accumulate(np.maximum(passes, 0.0))  # a further pass never saves time
    cumulative = np.interp(np.arange(int(ks[-1]) + 1), np.concatenate([[0.0], ks]), np.concatenate([[0.0], passes]))
    return [float(w) for w in np.diff(cumulative)]


def _draft_steps_priced(latency: pd.DataFrame, phase: pd.Series, draft_clock: LinearCoeffs,
                        round_clock: LinearCoeffs | None, weights: list[float] | None = None,
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The profile's draft `step` rows (a vLLM profile) as (K, the simulator's price of the whole step — K
    draft passes, weighted by `weights` (`_draft_pass_weights`), plus the round —, the measured seconds).
    None without step rows or a round clock."""
    steps = latency[(latency["model"] == "draft") & (phase == "step")]
    if not len(steps) or round_clock is None:
        return None
    b, k, c, t = (steps[name].to_numpy(float) for name in ("batch", "tokens", "context", "median_s"))
    passes = k if weights is None else np.array([sum(weights[:int(kk)]) for kk in k])
    predicted = np.array([n * draft_clock.forward(bb * cc, bb, bb) + round_clock.forward(bb * cc, bb)
                          for bb, n, cc in zip(b, passes, c)])
    return k, predicted, t


def _drafting_target_bias(latency: pd.DataFrame, phase: pd.Series,
                          target_clock: LinearCoeffs) -> dict[int, float] | None:
    """Per K, how far `target_clock` — the clock the simulator prices those steps with: `clock_drafting`,
    fitted to these rows, or the fixed-K engine's clock when there are too few of them to fit — sits
    from the target's side of the draft_model engine's steps (`decode_drafting` rows, tokens = K + 1),
    the engine a vLLM replay serves SD with; signed, keyed by K: what one line over the rows leaves per
    K. None without such rows (a torch profile, or a vLLM profile from before they were timed)."""
    rows = latency[(latency["model"] == "target") & (phase == "decode_drafting")]
    if not len(rows):
        return None
    b, s, c, t = (rows[name].to_numpy(float) for name in ("batch", "tokens", "context", "median_s"))
    predicted = np.array([target_clock.forward(bb * cc, bb * ss, bb) for bb, ss, cc in zip(b, s, c)])
    return _bias_by_tokens(s - 1, predicted, t)


def _draft_round_fit(latency: pd.DataFrame, phase: pd.Series,
                     seed: int) -> tuple[LinearCoeffs | None, float | None]:
    """The draft round's clock from the profile's `round` rows (a vLLM profile) and its k-fold error (mean
    absolute error over the mean round time: a MAPE would be dominated by rounds near 0). (None, None)
    without round rows."""
    rows = latency[(latency["model"] == "draft") & (phase == "round")]
    if len(rows) < 5:
        return None, None
    b, c, t = (rows[k].to_numpy(float) for k in ("batch", "context", "median_s"))
    design = np.column_stack([b * c, b, t])
    # a round's cost can be ~0 at some shapes (the line's intercept held at 0): fit it in absolute
    # terms — relative residuals of a near-zero row would dominate
    coeffs = _nonnegative_linear(design)
    errors = []
    for test in _folds(len(design), seed):
        train = np.setdiff1d(np.arange(len(design)), test)
        co = _nonnegative_linear(design[train])
        errors.extend(abs(co.forward(nc, nb) - s) for nc, nb, s in design[test])
    scale = float(np.mean(t)) or 1.0
    return coeffs, float(np.mean(errors)) / scale


def _nonnegative_linear(design: np.ndarray) -> LinearCoeffs:
    """(α, γ, δ) >= 0 of seconds = α·N_c + γ·N_b + δ by non-negative least squares on rows [N_c, N_b, s]."""
    from scipy.optimize import nnls

    coef, _ = nnls(np.column_stack([design[:, 0], design[:, 1], np.ones(len(design))]), design[:, 2])
    return LinearCoeffs(float(coef[0]), float(coef[1]), float(coef[2]))


def _linear_with_cv(design: np.ndarray, log_term: bool, seed: int) -> tuple[LinearCoeffs, float]:
    """`fit_linear_relative` on every row of `design` (columns N_c, N_b, seconds[, requests]), and its k-fold
    MAPE."""

    def fold(train, test):
        co = fit_linear_relative(design[train], log_term=log_term)
        return [co.forward(*row[:2], *row[3:]) for row in design[test]], design[test, 2]

    return fit_linear_relative(design, log_term=log_term), _held_out_mape(len(design), seed, fold)


def _piecewise_with_cv(kind: str, b: np.ndarray, s: np.ndarray, r: np.ndarray, t: np.ndarray,
                       seed: int) -> tuple[dict[str, Any], float]:
    """FASER's piecewise model of `kind` on every row (as a dict), and its k-fold MAPE."""

    def fold(train, test):
        pw_fold, _ = fit_piecewise(kind, b[train], s[train], r[train], t[train])
        return pw_fold(b[test], s[test], r[test]), t[test]

    pw, _ = fit_piecewise(kind, b, s, r, t)
    return pw.to_dict(), _held_out_mape(len(t), seed, fold)


def _prefill_line(pre: pd.DataFrame, coeffs: LinearCoeffs) -> tuple[PrefillLine, float | None]:
    """One model's prefill line over its prefill rows (MAPE in-sample: few points). Without two distinct
    prefill sizes a prompt token is priced like a token of a one-request decode pass (documented
    fallback, from the model's linear fit `coeffs`; no MAPE).

    A line prices a prompt's tokens alike, but attention over a prompt grows with its length squared:
    on a profile out to 1536-token prompts (profile --workload) the line missed the longest by 36% and
    the simulator's TTFT with it. So when the line's MAPE passes PREFILL_LINE_MAPE and the rows have
    three distinct sizes, a per-prompt term in L² is fitted beside it (each row's prompts are `batch`
    prompts of `tokens`: Σ L² = batch·tokens²), and kept if it lowers the MAPE."""
    n_tok = (pre["batch"] * pre["tokens"]).to_numpy(float)
    seconds = pre["median_s"].to_numpy(float)
    if len(pre) < 2 or len(np.unique(n_tok)) < 2:
        return PrefillLine(per_token_s=coeffs.gamma, fixed_s=coeffs.delta), None
    slope, icpt = fit_line_relative(n_tok, seconds)
    line = PrefillLine(per_token_s=slope, fixed_s=icpt)
    error = mape([line.time(n) for n in n_tok], seconds)
    squares = (pre["batch"] * pre["tokens"].astype(float) ** 2).to_numpy(float)
    if error > PREFILL_LINE_MAPE and len(np.unique(n_tok)) >= 3:
        slope, square, icpt = _fit_terms_relative([n_tok, squares, np.ones_like(n_tok)], seconds)
        curve = PrefillLine(per_token_s=slope, fixed_s=icpt, per_square_token_s=square)
        curve_error = mape([curve.time(n, q) for n, q in zip(n_tok, squares)], seconds)
        if curve_error < error:
            return curve, curve_error
    return line, error


def sps_table(latency: pd.DataFrame) -> tuple[list[int], list[float], int]:
    """SPS(B) = 1 / target pass seconds at B = batch·tokens verification tokens, at the median context.

    Shapes with the same B are averaged; the table is made non-increasing (a bigger pass never runs
    more steps per second) so noise cannot invent a throughput bump that DSpark would chase."""
    phase = latency["phase"] if "phase" in latency else pd.Series("decode", index=latency.index)
    rows = latency[(latency["model"] == "target") & (phase == "decode")]
    # Profiles of live engine calls record the context the calls really had (it drifts up from the
    # nominal grid value as verify commits tokens), so rows within 25% of the median context count as
    # "at" it.
    contexts = np.sort(rows["context"].to_numpy())
    ctx = int(contexts[(len(contexts) - 1) // 2])
    at = rows[np.abs(rows["context"] - ctx) <= 0.25 * ctx].assign(B=lambda d: d["batch"] * d["tokens"])
    per_b = at.groupby("B")["median_s"].mean().sort_index()
    values = np.minimum.accumulate(1.0 / per_b.to_numpy(float))
    return [int(v) for v in per_b.index], [float(v) for v in values], ctx


def per_position_acceptance(acceptance: pd.DataFrame, k_max: int) -> dict[str, list[float]]:
    """P(m ≥ j) for j = 1..K_max per domain, and over all traces ("all")."""
    out = {}
    groups = list(acceptance.groupby("domain")) + [("all", acceptance)]
    for domain, frame in groups:
        m = frame["match_len"].to_numpy()
        out[str(domain)] = [float(np.mean(m >= j)) for j in range(1, k_max + 1)]
    return out


def chain_matrix(acceptance: pd.DataFrame, column: str, k_max: int) -> np.ndarray:
    """A list<float> column as an (N, K_max) float array."""
    values = acceptance[column].to_numpy()
    try:
        mat = np.stack([np.asarray(v, dtype=float) for v in values])
    except ValueError:
        raise InputError(f"column {column} has chains of different lengths", field=column) from None
    if mat.ndim != 2 or mat.shape[1] != k_max:
        raise InputError(f"column {column} chains have length {mat.shape[-1]}, profile says K_max {k_max}",
                         field=column)
    return mat


# --- acceptance calibration -------------------------------------------------------------------------------

CAL_FOLDS = 5  # k of the cross-validation grouped by prompt (each fold holds out ~HOLDOUT of the prompts)
BOOTSTRAP = 1000  # prompt resamples behind the held-out CIs [chosen]


def prompt_folds(prompt_ids: Sequence[str], domains: Sequence[str], k: int = CAL_FOLDS,
                 seed: int = 0) -> list[np.ndarray]:
    """Row indices of each held-out fold, grouped by prompt: every row of a prompt is in the same fold,
    so no prompt has chains on both sides of a train/held-out split. Prompts are dealt to the folds
    round-robin in a seeded order within each domain (so each fold holds every domain) [chosen]; at
    most one fold per prompt."""
    pids = np.asarray(prompt_ids).astype(str)
    doms = np.asarray(domains).astype(str)
    unique = list(dict.fromkeys(pids.tolist()))
    if len(unique) < 2:
        raise InputError(f"the acceptance traces hold {len(unique)} prompt(s); holding out by prompt needs at "
                         "least 2", field="acceptance.parquet")
    k = max(2, min(k, len(unique)))
    first_domain = {p: d for p, d in zip(pids[::-1], doms[::-1])}  # the domain a prompt's first row has
    rng = np.random.default_rng(seed)
    fold_of: dict[str, int] = {}
    dealt = 0
    for domain in sorted(set(first_domain.values())):
        group = sorted(p for p in unique if first_domain[p] == domain)
        for p in rng.permutation(group).tolist():
            fold_of[p] = dealt % k
            dealt += 1
    assignment = np.array([fold_of[p] for p in pids])
    return [np.flatnonzero(assignment == f) for f in range(k)]


def cluster_ece(gap: np.ndarray, count: np.ndarray):
    """ECE of prompt-cluster resamples, for scipy.stats.bootstrap (vectorised): `gap` (G, bins) holds per
    prompt group Σ(y − p) of its samples in each bin, `count` (G,) its samples; a sample (..., n) of group
    indices that takes group g w_g times has ECE Σ_bins |Σ_g w_g·gap_gb| / Σ_g w_g·count_g — what
    `sts.ece` gives on the samples of those prompts, duplicates included."""
    n_groups = len(count)

    def statistic(sample: np.ndarray, axis: int = -1) -> np.ndarray:
        idx = np.asarray(sample, dtype=np.intp)
        lead = idx.shape[:-1]
        rows = int(np.prod(lead))
        flat = idx.reshape(rows, -1) + (np.arange(rows) * n_groups)[:, None]
        w = np.bincount(flat.ravel(), minlength=rows * n_groups).reshape(*lead, n_groups).astype(float)
        return np.abs(w @ gap).sum(axis=-1) / np.maximum(w @ count, 1.0)

    return statistic


def ece_interval(gap: np.ndarray, count: np.ndarray, estimate: float, resamples: int, seed: int,
                 level: float = 0.95) -> list[float]:
    """[low, high] of ECE: the bias-corrected ("basic", pivotal) bootstrap interval over prompt clusters,
    clipped at 0 and extended to hold the point estimate `estimate`.

    scipy.stats.bootstrap resamples whole prompts (their chains are correlated) through `cluster_ece`.
    The basic interval [2·ECE − q_hi, 2·ECE − q_lo] (q: the resamples' quantiles) reads the resamples'
    excess over the estimate as the estimate's own excess over the true ECE — ECE sums absolute gaps, so
    noise only adds to it, and both excesses are positive. The percentile interval [q_lo, q_hi] it
    replaces ignores that bias and sits above the estimate (on the bundled pair's profile the chosen
    calibrator's held-out 0.018 had 97% of its resamples above it: [0.017, 0.052]).
    [chosen: basic, not BCa] With a predictor 0.02 off (60 prompts × 40 chains; the test
    `test_the_ece_interval_corrects_the_bootstraps_upward_bias`) the 95% intervals of 100 seeded
    replicates covered the true ECE 94 times as basic, 5 times as BCa and never as percentiles: where
    the bias exceeds the resamples' spread — a calibrator near the noise floor, the kind `fit` chooses —
    BCa's z0 is extreme, both its ends fall into the resamples' lower tail, and its interval shrinks to
    a sliver above the truth.
    [chosen] Where the bias-corrected interval ends below the estimate (the bias exceeds the spread) it
    is extended up to the estimate, so the interval always holds the point estimate printed with it
    (a wider interval never covers less).
    """
    from scipy.stats import bootstrap  # lazily: see fit_linear_relative

    res = bootstrap((np.arange(len(count)),), cluster_ece(gap, count), n_resamples=resamples, vectorized=True,
                    confidence_level=level, method="basic", rng=np.random.default_rng(seed))
    low = max(0.0, float(res.confidence_interval.low))
    high = max(0.0, float(res.confidence_interval.high))
    return [min(low, estimate), max(high, estimate)]


def _score(pred: np.ndarray, labels: np.ndarray, valid: np.ndarray, base: np.ndarray, groups: np.ndarray,
           weights: np.ndarray, bins: int, seed: int = 0) -> dict[str, Any]:
    """CalibrationScore fields of out-of-fold predictions `pred` (N, K) against `labels`, with the
    base-rate predictions `base` as the Brier reference. The ECE CI is bias-corrected, over prompt groups
    (`ece_interval`, as many resamples as `weights` has rows, seeded by `seed`); the Brier skill CI is the
    percentile interval of `weights` (B, G): each row one bootstrap resample's multiplicity of every
    prompt group."""
    rows, cols = np.nonzero(valid)
    p, y, b, g = pred[rows, cols], labels[rows, cols], base[rows, cols], groups[rows]
    n_groups = weights.shape[1]
    idx = bin_index(p, bins)
    # per prompt group: samples, Σ(y − p) per bin, squared errors of the predictor and the base rate
    count = np.bincount(g, minlength=n_groups).astype(float)
    gap = np.zeros((n_groups, bins))
    np.add.at(gap, (g, idx), y - p)
    se = np.bincount(g, (p - y) ** 2, minlength=n_groups)
    se_base = np.bincount(g, (b - y) ** 2, minlength=n_groups)
    boot_skill = 1.0 - (weights @ se) / np.maximum(weights @ se_base, 1e-300)
    brier_base = float(np.mean((b - y) ** 2))
    brier_p = float(np.mean((p - y) ** 2))
    point = ece(p, y, bins)
    return {"ece": point, "ece_ci": ece_interval(gap, count, point, weights.shape[0], seed),
            "brier": brier_p, "brier_skill": 1.0 - brier_p / brier_base if brier_base > 0 else 0.0,
            "brier_skill_ci": [float(v) for v in np.percentile(boot_skill, [2.5, 97.5])],
            "ece_by_position": [ece(pred[valid[:, j], j], labels[valid[:, j], j], bins) for j in range(pred.shape[1])],
            "reliability": reliability(p, y, bins)}


def fit_calibration(confidences: np.ndarray, accepted: np.ndarray, prompt_ids: Sequence[str],
                    domains: Sequence[str] | None = None, *, kinds: Sequence[str] = ("sts", "isotonic", "platt"),
                    folds: int = CAL_FOLDS, bootstrap: int = BOOTSTRAP, seed: int = 0) -> CalibrationFit:
    """Fit the calibrators of `kinds` (autospec.policies.calibrators.FITTERS) to draft chains and choose one.

    confidences: (N, K) chain confidences (NaN past a chain's end); accepted: (N,) match lengths;
    prompt_ids / domains: each chain's prompt and domain. Each candidate is scored on out-of-fold
    predictions of a k-fold cross-validation grouped by prompt (`prompt_folds`) — every chain is
    predicted by a calibrator fitted on other prompts only — with the same `Calibrator.survival` DSpark
    applies; "identity" (raw confidences) and "base_rate" (per position, P(m ≥ j) of the training
    prompts) are scored alongside. CIs resample prompts (`bootstrap` times). The candidate with the
    lowest held-out ECE is chosen [chosen: the spec's criterion; ties go to the earlier kind] and
    refitted on every chain.
    [chosen] Cross-validation rather than one 80/20 split: a quick profile holds ~100 prompts, and one
    split would score the calibrators on ~20 of them, where prompt-to-prompt differences in acceptance
    swamp a 2% ECE."""
    conf = np.atleast_2d(np.asarray(confidences, float))
    acc = np.asarray(accepted, float)
    if conf.shape[0] != acc.shape[0] or conf.shape[0] != len(prompt_ids):
        raise InputError("confidences, match lengths and prompt ids need one row per chain", field="acceptance")
    unknown = [k for k in kinds if k not in FITTERS]
    if unknown:
        raise InputError(f"unknown calibrator kind(s) {unknown}; known: {sorted(FITTERS)}", field="kinds")
    n, k_max = conf.shape
    domains = ["all"] * n if domains is None else domains
    test_folds = prompt_folds(prompt_ids, domains, folds, seed)
    labels = survival_labels(acc, k_max)
    valid = ~np.isnan(conf)
    names = ["identity", "base_rate", *kinds]
    pred = {name: np.full((n, k_max), np.nan) for name in names}
    for test in test_folds:
        train = np.setdiff1d(np.arange(n), test)
        with np.errstate(invalid="ignore"):
            rate = np.nanmean(np.where(valid[train], labels[train], np.nan), axis=0)
        pred["base_rate"][test] = np.nan_to_num(rate, nan=0.0)[None, :]
        pred["identity"][test] = IdentityCalibrator().survival(conf[test])
        for kind in kinds:
            pred[kind][test] = FITTERS[kind](conf[train], acc[train]).survival(conf[test])
    # bootstrap weights over prompts: row = one resample's count of each prompt
    pids = np.asarray(prompt_ids).astype(str)
    uniq, groups = np.unique(pids, return_inverse=True)
    rng = np.random.default_rng(seed)
    weights = rng.multinomial(len(uniq), np.full(len(uniq), 1.0 / len(uniq)), size=bootstrap).astype(float)
    scores = {name: CalibrationScore(**_score(np.where(valid, pred[name], np.nan), labels, valid,
                                              pred["base_rate"], groups, weights, ECE_BINS, seed))
              for name in names}
    chosen = min(kinds, key=lambda k: (scores[k].ece, list(kinds).index(k)))
    candidates = {kind: FITTERS[kind](conf, acc) for kind in kinds}
    return CalibrationFit(chosen=chosen, calibrator=candidates[chosen], candidates=candidates, held_out=scores,
                          folds=len(test_folds), prompts=len(uniq), chains=n, samples=int(valid.sum()),
                          bootstrap=bootstrap, bins=ECE_BINS, seed=seed)


def fit_profile(run_dir: Path, seed: int = 0) -> FitModels:
    """All fits from DIR/profile (see the module docstring); validates the inputs first."""
    prof = Path(run_dir) / "profile"
    if not prof.is_dir():
        raise InputError("no profile folder (run `autospec profile --out DIR` first)", path=prof)
    meta = read_profile_meta(run_dir)
    if meta is None:
        raise InputError("file not found (it records the profile's settings)", path=prof / "profile.json")
    latency = read_latency_table(run_dir)
    acceptance = read_acceptance_table(run_dir)
    k_max = meta.settings.k_max
    lat = fit_latency(latency, seed)
    tokens, values, ctx = sps_table(latency)
    conf = chain_matrix(acceptance, "confidences", k_max)
    cal = fit_calibration(conf, acceptance["match_len"].to_numpy(float), acceptance["prompt_id"].to_numpy(),
                          acceptance["domain"].to_numpy(), seed=seed)
    raw, sts = cal.held_out["identity"], cal.held_out["sts"]
    return FitModels(
        schema_version=SCHEMA_VERSION, k_max=k_max,
        linear=LinearLatencyModel(draft=lat["linear"]["draft"], target=lat["linear"]["target"]).to_dict(),
        linear_mape=lat["linear_mape"],
        clock=LinearLatencyModel(draft=lat["clock"]["draft"], target=lat["clock"]["target"]).to_dict(),
        clock_mape=lat["clock_mape"],
        clock_plain=asdict(lat["clock_plain"]) if lat["clock_plain"] is not None else None,
        clock_plain_mape=lat["clock_plain_mape"],
        clock_drafting=asdict(lat["clock_drafting"]) if lat["clock_drafting"] is not None else None,
        clock_drafting_mape=lat["clock_drafting_mape"],
        clock_draft_round=asdict(lat["clock_draft_round"]) if lat["clock_draft_round"] is not None else None,
        clock_draft_round_error=lat["clock_draft_round_error"], draft_step_mape=lat["draft_step_mape"],
        draft_step_bias=lat["draft_step_bias"], drafting_target_bias=lat["drafting_target_bias"],
        draft_pass_weights=lat["draft_pass_weights"],
        piecewise=lat["piecewise"],
        piecewise_mape=lat["piecewise_mape"],
        prefill=lat["prefill"], prefill_mape=lat["prefill_mape"],
        sps={"tokens": [float(t) for t in tokens], "values": values}, sps_context=ctx,
        per_position_acceptance=per_position_acceptance(acceptance, k_max),
        # STS (DSpark's own method) keeps its key: its temperatures and held-out ECE, scored as every
        # calibrator is (fit_calibration); `calibration` holds the one DSpark applies
        sts={"temperatures": cal.candidates["sts"].temperatures, "ece_before": raw.ece, "ece_after": sts.ece,
             "ece_before_by_position": raw.ece_by_position, "ece_after_by_position": sts.ece_by_position},
        calibration=cal,
        holdout=HOLDOUT, seed=seed, points={**lat["points"], "acceptance": len(acceptance)})


# [chosen] a clock whose held-out MAPE exceeds this misses its own profile's rows by more than a profile of a
# quiet host does: 17 fits of the bundled pair on the 2-core CI VM (torch and vLLM, s27-s33) read 1.9-11.3% for
# every clock but one, a vLLM plain-engine clock at 16.7% whose profile timed 4 of its 12 rows at 1.5-2.1x the
# same shapes in the profile before (the host busy with other processes), and whose simulator then priced
# vLLM's no-SD steps 21-23% high (docs/vllm.md, "The simulator against vLLM")
CLOCK_MAPE_LIMIT = 0.15


def loose_clocks(models: FitModels, limit: float = CLOCK_MAPE_LIMIT) -> dict[str, float]:
    """The simulator's clocks whose held-out MAPE exceeds `limit`, by name, with that MAPE: a profile timed
    through a slow spell of the host (or shapes the clock's line cannot follow) — the simulator's figures
    built on it are not the engine's."""
    clocks = {f"{side} clock": mape for side, mape in (models.clock_mape or {}).items()}
    clocks["plain-engine target clock"] = models.clock_plain_mape
    clocks["drafting-engine target clock"] = models.clock_drafting_mape
    return {name: float(mape) for name, mape in clocks.items() if mape is not None and mape > limit}


def loose_clocks_warning(models: FitModels, limit: float = CLOCK_MAPE_LIMIT) -> str | None:
    """One line naming the clocks `loose_clocks` finds, and what to do; None when there are none."""
    loose = loose_clocks(models, limit)
    if not loose:
        return None
    named = ", ".join(f"the {name} {mape:.1%}" for name, mape in loose.items())
    return (f"the fit misses its own profile's held-out rows by more than {limit:.0%} ({named}): the profile was "
            "probably timed through a slow spell of the host; re-profile on a quiet host before trusting the "
            "simulator's figures")


def write_fit(run_dir: Path, models: FitModels) -> Path:
    path = Path(run_dir) / "fit" / "models.json"
    write_json(path, models.model_dump(mode="json"))
    return path


def load_fit(run_dir: str | Path) -> FitResult:
    """Read DIR/fit/models.json (DIR may also be the fit folder itself or the file)."""
    return FitResult(read_fit_models(run_dir))


# --- the simulator calibrated by a run directory ------------------------------------------------------


def profiled_grid(run_dir: Path) -> ProfiledGrid:
    """The largest shapes the run directory's profile measured (the target's passes): what the
    simulator replays without extrapolating (`autospec.serving.coverage`)."""
    latency = read_latency_table(run_dir)
    target = latency[latency["model"] == "target"]
    decode, prefill = target[target["phase"] == "decode"], target[target["phase"] == "prefill"]

    def largest(frame: pd.DataFrame, column: str) -> Any:
        return frame[column].max().item() if len(frame) else None

    return ProfiledGrid(decode_batch=largest(decode, "batch"), decode_context=largest(decode, "context"),
                        verify_tokens=largest(decode, "tokens"), prefill_batch=largest(prefill, "batch"),
                        prefill_tokens=largest(prefill, "tokens"))


def profiled_engine(run_dir: Path) -> str:
    """The engine a run directory's profile measured (profile.json's `engine`; the simulator takes its step
    structure from it, so a profile without profile.json is refused rather than guessed)."""
    meta = read_profile_meta(run_dir)
    if meta is None:
        raise InputError("file not found (it records the engine and grid the profile measured)",
                         path=Path(run_dir) / "profile" / "profile.json")
    return meta.engine


def sim_costs(fit: FitResult) -> SimCosts:
    """The simulator's clock inputs from a fit: the policies' linear model, the clock model, the
    prefill lines and the plain- and drafting-engine target clocks."""
    models = fit.models
    return SimCosts(fit.latency_model,
                    (models.prefill["target"].per_token_s, models.prefill["target"].fixed_s),
                    (models.prefill["draft"].per_token_s, models.prefill["draft"].fixed_s),
                    prefill_square=(models.prefill["target"].per_square_token_s,
                                    models.prefill["draft"].per_square_token_s),
                    clock=fit.clock_model, plain_target=fit.plain_target_clock,
                    drafting_target=fit.drafting_target_clock, draft_round=fit.draft_round_clock,
                    draft_pass_weights=fit.draft_pass_weights)


class FittedSimEngine(SimEngine):
    """The simulator (`autospec.engines.sim.SimEngine`) with its run-directory constructor. The engine
    takes fitted data (acceptance traces and clock costs); reading profile/ and fit/ — or fitting the
    profile in memory when fit/ is absent — is this stage's work, so the constructor lives here and
    engines never import a stage (tests/test_layers.py)."""

    fit: FitResult | None = None  # set by from_dirs

    @classmethod
    def from_dirs(cls, run_dir: str | Path, fit_dir: str | Path | None = None, *, k_max: int | None = None,
                  temperature: float = 0.0, seed: int = 0) -> "FittedSimEngine":
        """A simulator from a run directory holding profile/ (and fit/; fitted in memory when absent).

        `run_dir` may also be the profile folder itself."""
        root = Path(run_dir)
        if root.name == "profile" and (root / "acceptance.parquet").exists():
            root = root.parent
        if not (root / "profile").is_dir():
            raise InputError("no profile folder (run `autospec profile --out DIR` first)", path=root / "profile")
        fit_path = Path(fit_dir) if fit_dir is not None else root / "fit"
        if fit_dir is not None or (fit_path / "models.json").is_file():
            fit = load_fit(fit_path)
            if (root / "profile" / "latency.parquet").exists():  # the fit prices the clock; the profile beside
                read_latency_table(root)  # it must still be sound (a NaN latency once passed unnoticed)
        else:
            fit = FitResult(fit_profile(root))
        frame = read_acceptance_table(root)
        kind = profiled_engine(root)
        engine = cls(AcceptanceTraces(frame, fit.models.k_max), sim_costs(fit), k_max=k_max,
                     temperature=temperature, seed=seed, fused_prefill=kind == "vllm", padded_batches=kind == "torch")
        engine.fit = fit  # the fit it was built from: the replay's policy defaults (FitResult.policy_inputs)
        return engine
