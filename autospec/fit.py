"""`autospec fit`: turn a profile into the models policies and the simulator consume (docs/architecture.md, "Stages").

From `DIR/profile/` it fits, each with a held-out error so a user can see how far to trust it:

* AdaSpec's linear forward model T = α·N_c + γ·N_b + δ per model (N_c = batch·context, N_b =
  batch·tokens) on the decode rows, robust relative least squares (`fit_linear_relative`), with a
  seeded 5-fold cross-validated MAPE (each fold holds out 20% of the rows; `fit_latency`); policies
  use it;
* the simulator's clock: the same plus λ·log2(N_b) (latency.LinearCoeffs says why), same MAPE; and,
  when the profile has `decode_plain` rows (vLLM's plain engine, which serves no-SD), the target's
  clock in that engine;
* FASER's piecewise model per model (latency.fit_piecewise: one segment when the profile has no SM
  split), same MAPE;
* a prefill line per model, T = per_token·(batch·tokens) + fixed, from the prefill rows by the same
  robust relative fit (`fit_line_relative`; it prices admission in the simulator and the KV swap cost
  on preemption);
* DSpark's SPS(B) table: target steps per second at B = batch·tokens verification tokens, measured at
  the profile's typical (median) context;
* per-position acceptance per domain: P(m ≥ j), j = 1..K_max, from the acceptance traces;
* STS calibration of draft confidences against "the first k drafts are all accepted", with held-out
  ECE before and after.

Everything lands in `DIR/fit/models.json`; `load_fit` reads it back as a `FitResult`.
`FittedSimEngine.from_dirs` builds the simulator of a run directory from its profile and fit (fitting
in memory when fit/ is absent); the engine itself takes only the fitted data.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from autospec.artifacts import read_json, write_json

# fit/models.json's schema (re-exported: callers import it from here)
from autospec.calibration import ACCEPTANCE_COLUMNS, LATENCY_COLUMNS, FitModels, PrefillLine, read_fit_models
from autospec.config import SCHEMA_VERSION
from autospec.engines.sim import AcceptanceTraces, SimCosts, SimEngine
from autospec.errors import InputError
from autospec.latency import FaserModels, LinearCoeffs, LinearLatencyModel, PiecewiseLatency, fit_piecewise, mape
from autospec.policies.sts import StsCalibration, fit_sts
from autospec.profile import read_parquet

HOLDOUT = 0.2  # fraction of profile points held out for MAPE / ECE
NOMINAL_SPLIT = 0.5  # r used for rows without an SM split: any constant r gives a one-segment fit


@dataclass(frozen=True)
class FitResult:
    """A loaded fit: the latency model policies consult and the tables the simulator uses."""

    models: FitModels

    @property
    def latency_model(self) -> LinearLatencyModel:
        return LinearLatencyModel.from_dict(self.models.linear)

    @property
    def clock_model(self) -> LinearLatencyModel:
        """The simulator's clock (FitModels.clock), or the linear model for an older fit."""
        return LinearLatencyModel.from_dict(self.models.clock or self.models.linear)

    @property
    def plain_target_clock(self) -> LinearCoeffs | None:
        """FitModels.clock_plain as coefficients (None when the profile had no plain-engine rows)."""
        return LinearCoeffs(**self.models.clock_plain) if self.models.clock_plain else None

    @property
    def sps(self) -> tuple[list[int], list[float]]:
        return [int(b) for b in self.models.sps["tokens"]], list(self.models.sps["values"])

    @property
    def piecewise(self) -> dict[str, PiecewiseLatency]:
        return {k: PiecewiseLatency.from_dict(v) for k, v in self.models.piecewise.items()}

    @property
    def faser(self) -> FaserModels | None:
        """FASER's models as the serving step and engines use them (frontier chunk "auto", the
        simulator's overlapped timing, early exit's Eq. 10 times); None without draft and target fits."""
        return FaserModels.from_dict(self.models.piecewise)

    @property
    def prefill(self) -> dict[str, PrefillLine]:
        return self.models.prefill

    @property
    def sts(self) -> StsCalibration:
        s = self.models.sts
        return StsCalibration(list(s["temperatures"]), s["ece_before"], s["ece_after"])

    @property
    def per_position_acceptance(self) -> dict[str, list[float]]:
        return self.models.per_position_acceptance


def fit_linear_relative(rows: np.ndarray, log_term: bool = False) -> LinearCoeffs:
    """AdaSpec's (α, γ, δ) from rows [N_c, N_b, seconds], fitted for relative error; with `log_term`
    also λ of the simulator's clock model (λ·log2 N_b, see latency.LinearCoeffs).

    Why not plain least squares (latency.fit_linear): it weighs the slowest shapes most and, on a
    shared machine, lets one multi-second outlier drag δ negative, which wrecks the fast shapes. Here
    residuals are relative (prediction/measured − 1, the quantity MAPE reports), the loss is soft-L1
    (robust to the odd preempted measurement), and the coefficients are bounded at 0 (a pass cannot get
    faster with more work). Plain relative least squares (scipy nnls) gives the starting point."""
    # lazily: scipy.optimize costs ~0.5 s, and `autospec report`, `tune` and `evaluate --engine sim` import
    # this module only to read a fit (docs/architecture.md, "Imports")
    from scipy.optimize import least_squares, nnls

    data = np.asarray(rows, float)
    columns = [data[:, 0], data[:, 1], np.ones(len(data))]
    if log_term:
        columns.append(np.log2(np.maximum(data[:, 1], 1.0)))
    design = np.column_stack(columns) / data[:, 2:3]
    start, _ = nnls(design, np.ones(len(data)))
    # optimise in units of the start so all are O(1); a coefficient nnls put at 0 starts at a small
    # share of the mean time instead (1e-12 s would leave it stuck there)
    scale = np.where(start > 0, start, 0.01 * float(np.mean(data[:, 2])))
    x0 = np.where(start > 0, 1.0, 0.0)
    sol = least_squares(lambda th: design @ (th * scale) - 1.0, x0, bounds=(0.0, np.inf),
                        loss="soft_l1", f_scale=0.1)
    coef = [float(v) for v in sol.x * scale]
    return LinearCoeffs(*coef)


def fit_line_relative(x: np.ndarray, seconds: np.ndarray) -> tuple[float, float]:
    """(per_x, fixed) of seconds = per_x·x + fixed, fitted like `fit_linear_relative`: relative
    residuals, soft-L1 loss, both coefficients >= 0. A prefill line has few points; plain least squares
    let one preempted measurement (a 0.18 s median for a 256-token draft prefill that takes 0.01 s) set
    the slope, and the simulator then charged 3x the real admission cost."""
    from scipy.optimize import least_squares, nnls

    x, t = np.asarray(x, float), np.asarray(seconds, float)
    design = np.column_stack([x, np.ones_like(x)]) / t[:, None]
    start, _ = nnls(design, np.ones_like(t))
    scale = np.maximum(start, 1e-12)
    sol = least_squares(lambda th: design @ (th * scale) - 1.0, np.ones(2), bounds=(0.0, np.inf),
                        loss="soft_l1", f_scale=0.1)
    a, b = sol.x * scale
    return float(a), float(b)


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
        design = np.column_stack([b * c, b * s, t])
        for name, log_term in (("linear", False), ("clock", True)):
            out[name][model], out[f"{name}_mape"][model] = _linear_with_cv(design, log_term, seed)
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
    plain = latency[(latency["model"] == "target") & (phase == "decode_plain")]
    out["clock_plain"], out["clock_plain_mape"] = None, None
    if len(plain) >= 5:
        design = np.column_stack([(plain["batch"] * plain["context"]).to_numpy(float),
                                  (plain["batch"] * plain["tokens"]).to_numpy(float),
                                  plain["median_s"].to_numpy(float)])
        out["clock_plain"], out["clock_plain_mape"] = _linear_with_cv(design, True, seed)
    return out


def _linear_with_cv(design: np.ndarray, log_term: bool, seed: int) -> tuple[LinearCoeffs, float]:
    """`fit_linear_relative` on every row of `design` (columns N_c, N_b, seconds), and its k-fold MAPE."""

    def fold(train, test):
        co = fit_linear_relative(design[train], log_term=log_term)
        return [co.forward(nc, nb) for nc, nb, _ in design[test]], design[test, 2]

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
    fallback, from the model's linear fit `coeffs`; no MAPE)."""
    n_tok = (pre["batch"] * pre["tokens"]).to_numpy(float)
    if len(pre) >= 2 and len(np.unique(n_tok)) >= 2:
        slope, icpt = fit_line_relative(n_tok, pre["median_s"].to_numpy(float))
        line = PrefillLine(per_token_s=slope, fixed_s=icpt)
        return line, mape([line.time(n) for n in n_tok], pre["median_s"])
    return PrefillLine(per_token_s=coeffs.gamma, fixed_s=coeffs.delta), None


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


def fit_profile(run_dir: Path, seed: int = 0) -> FitModels:
    """All fits from DIR/profile (see the module docstring); validates the inputs first."""
    prof = Path(run_dir) / "profile"
    if not prof.is_dir():
        raise InputError("no profile folder (run `autospec profile --out DIR` first)", path=prof)
    meta = read_json(prof / "profile.json")
    latency = read_parquet(prof / "latency.parquet", LATENCY_COLUMNS)
    acceptance = read_parquet(prof / "acceptance.parquet", ACCEPTANCE_COLUMNS)
    try:
        k_max = int(meta["settings"]["k_max"])
    except (KeyError, TypeError, ValueError):
        raise InputError("profile.json has no settings.k_max", path=prof / "profile.json") from None
    lat = fit_latency(latency, seed)
    tokens, values, ctx = sps_table(latency)
    conf = chain_matrix(acceptance, "confidences", k_max)
    sts = fit_sts(conf, acceptance["match_len"].to_numpy(float), holdout=HOLDOUT, seed=seed)
    return FitModels(
        schema_version=SCHEMA_VERSION, k_max=k_max,
        linear=LinearLatencyModel(draft=lat["linear"]["draft"], target=lat["linear"]["target"]).to_dict(),
        linear_mape=lat["linear_mape"],
        clock=LinearLatencyModel(draft=lat["clock"]["draft"], target=lat["clock"]["target"]).to_dict(),
        clock_mape=lat["clock_mape"],
        clock_plain=asdict(lat["clock_plain"]) if lat["clock_plain"] is not None else None,
        clock_plain_mape=lat["clock_plain_mape"], piecewise=lat["piecewise"],
        piecewise_mape=lat["piecewise_mape"],
        prefill=lat["prefill"], prefill_mape=lat["prefill_mape"],
        sps={"tokens": [float(t) for t in tokens], "values": values}, sps_context=ctx,
        per_position_acceptance=per_position_acceptance(acceptance, k_max),
        sts={"temperatures": sts.temperatures, "ece_before": sts.ece_before, "ece_after": sts.ece_after,
             "ece_before_by_position": sts.ece_before_by_position,
             "ece_after_by_position": sts.ece_after_by_position},
        holdout=HOLDOUT, seed=seed, points={**lat["points"], "acceptance": len(acceptance)})


def write_fit(run_dir: Path, models: FitModels) -> Path:
    path = Path(run_dir) / "fit" / "models.json"
    write_json(path, models.model_dump(mode="json"))
    return path


def load_fit(run_dir: str | Path) -> FitResult:
    """Read DIR/fit/models.json (DIR may also be the fit folder itself or the file)."""
    return FitResult(read_fit_models(run_dir))


# --- the simulator calibrated by a run directory ------------------------------------------------------


def profiled_engine(run_dir: Path) -> str:
    """The engine a run directory's profile measured ("torch" when profile.json does not say)."""
    try:
        meta = json.loads((Path(run_dir) / "profile" / "profile.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return "torch"
    return str(meta.get("engine") or "torch")


def sim_costs(fit: FitResult) -> SimCosts:
    """The simulator's clock inputs from a fit: the policies' linear model, the clock model, the
    prefill lines and the plain-engine target clock."""
    models = fit.models
    return SimCosts(fit.latency_model,
                    (models.prefill["target"].per_token_s, models.prefill["target"].fixed_s),
                    (models.prefill["draft"].per_token_s, models.prefill["draft"].fixed_s),
                    clock=fit.clock_model, plain_target=fit.plain_target_clock)


class FittedSimEngine(SimEngine):
    """The simulator (`autospec.engines.sim.SimEngine`) with its run-directory constructor. The engine
    takes fitted data (acceptance traces and clock costs); reading profile/ and fit/ — or fitting the
    profile in memory when fit/ is absent — is this stage's work, so the constructor lives here and
    engines never import a stage (tests/test_layers.py)."""

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
        else:
            fit = FitResult(fit_profile(root))
        frame = read_parquet(root / "profile" / "acceptance.parquet", ACCEPTANCE_COLUMNS)
        return cls(AcceptanceTraces(frame, fit.models.k_max), sim_costs(fit), k_max=k_max, temperature=temperature,
                   seed=seed, fused_prefill=profiled_engine(root) == "vllm")
