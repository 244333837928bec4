"""The profile's and the fit's records as data: what `autospec profile` writes and `autospec fit` reads
(the latency and acceptance table columns, the measurement grid) and the schema of fit/models.json.

Profiling (`autospec.profile`, and the vLLM runner's `profile_latency`) and fitting (`autospec.fit`)
are stages; what they exchange lives here, one layer below them, so that the vLLM runner in
`autospec.serving.vllm` can time a grid and its online scheduler can read a fit without importing a
stage (tests/test_layers.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Sequence

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autospec.artifacts import read_json, read_parquet
from autospec.errors import InputError
from autospec.latency import FaserKind, LinearCoeffs, LinearLatencyModel, PiecewiseLatency
from autospec.policies.calibrators import Calibrator
from autospec.workloads._table import first_flagged

LATENCY_COLUMNS = ["model", "phase", "batch", "tokens", "context", "sm_split", "median_s", "mad_s", "repeats"]
ACCEPTANCE_COLUMNS = ["prompt_id", "domain", "position", "target_token", "match_len", "chain_tokens",
                      "confidences", "entropies", "klds", "target_probs", "accept_probs"]


LATENCY_MODELS = ("draft", "target")
# the pass kinds a profile times (profile.time_* and the vLLM runner's profile_latency)
LATENCY_PHASES = ("decode", "decode_ragged", "decode_plain", "decode_drafting", "prefill", "round", "step")


def _first_bad(problems: list[tuple[Any, str]], path: Path) -> None:
    """InputError for the earliest row any (mask, message) check flags, naming the row and the column."""
    flagged = first_flagged(problems)
    if flagged is not None:
        row, message = flagged
        raise InputError(f"row {row}: {message}", path=path, field=message.split(" ", 1)[0])


def read_latency_table(run_dir: str | Path) -> pd.DataFrame:
    """DIR/profile/latency.parquet, its values checked: a hand-edited or corrupted profile is an input
    error naming the row and the column, never a fit of NaN or negative times (which once hung the
    simulator, its clock never advancing)."""
    path = Path(run_dir) / "profile" / "latency.parquet"
    frame = read_parquet(path, LATENCY_COLUMNS)
    for c in ("batch", "tokens", "context", "median_s", "mad_s", "repeats"):
        if not pd.api.types.is_numeric_dtype(frame[c]) or pd.api.types.is_bool_dtype(frame[c]):
            raise InputError(f"{c} must be a column of numbers, not {frame[c].dtype}", path=path, field=c)
    numbers = {c: frame[c].to_numpy(float) for c in ("batch", "tokens", "context", "median_s", "mad_s", "repeats")}
    _first_bad([
        (~frame["model"].isin(LATENCY_MODELS), f"model must be one of {', '.join(LATENCY_MODELS)}"),
        (~frame["phase"].isin(LATENCY_PHASES), f"phase must be one of {', '.join(LATENCY_PHASES)}"),
        (~(numbers["batch"] >= 1), "batch must be a whole number >= 1"),
        (~(numbers["tokens"] >= 1), "tokens must be a whole number >= 1"),
        (~(numbers["context"] >= 0), "context must be >= 0"),
        # a vLLM draft `round` row may be 0: the profiler holds a round's cost >= 0 and writes 0 when the
        # line over K goes through the origin (latency_profile.draft_line); every other row is a real time
        (~(np.isfinite(numbers["median_s"]) & (numbers["median_s"] < 60)
           & ((numbers["median_s"] > 0) | ((frame["phase"] == "round") & (numbers["median_s"] == 0)))),
         "median_s must be a time in (0, 60) s (a draft round row: [0, 60) s)"),
        (~(numbers["mad_s"] >= 0), "mad_s must be >= 0"),
        (~(numbers["repeats"] >= 1), "repeats must be >= 1"),
    ], path)
    decode = frame[frame["phase"] == "decode"]
    for model in LATENCY_MODELS:  # every fit starts from a model's decode passes
        if not (decode["model"] == model).any():
            raise InputError(f"no decode rows for the {model}: a profile times both models' passes", path=path,
                             field="phase")
    return frame


def read_acceptance_table(run_dir: str | Path) -> pd.DataFrame:
    """DIR/profile/acceptance.parquet, its values checked (see read_latency_table): a negative or too
    long `match_len` once sent the simulator's acceptance replay into an endless loop."""
    path = Path(run_dir) / "profile" / "acceptance.parquet"
    frame = read_parquet(path, ACCEPTANCE_COLUMNS)
    chain = np.array([len(c) if hasattr(c, "__len__") else -1 for c in frame["chain_tokens"]])
    match = np.asarray(frame["match_len"], float)
    widths = {c: np.array([len(v) if hasattr(v, "__len__") else -1 for v in frame[c]])
              for c in ("confidences", "accept_probs")}
    # probabilities: finite and in [0, 1]
    probable = {c: np.array([hasattr(v, "__len__") and _probabilities(v) for v in frame[c]])
                for c in ("confidences", "accept_probs", "target_probs")}
    named = {c: np.array([isinstance(v, str) and bool(v) for v in frame[c]]) for c in ("prompt_id", "domain")}
    _first_bad([
        *[(~named[c], f"{c} must be a non-empty string") for c in named],
        (chain < 1, "chain_tokens must be a non-empty list of token ids"),
        (~((match >= 0) & (match <= chain)), "match_len must be in [0, the chain's length]"),
        (~(np.asarray(frame["position"], float) >= 0), "position must be >= 0"),
        *[(widths[c] != chain, f"{c} must have one value per chain token") for c in widths],
        *[(~probable[c], f"{c} must be probabilities in [0, 1]") for c in probable],
    ], path)
    return frame


def _probabilities(values: Any) -> bool:
    v = np.asarray(values, float)
    return bool(np.all((v >= 0.0) & (v <= 1.0)))  # NaN fails both comparisons


class ProfileSettings(BaseModel):
    """The measurement grid and trace sizes; stored in profile.json so a fit knows what was measured."""

    model_config = ConfigDict(extra="forbid")

    k_max: int = Field(8, ge=1, le=32)
    batches: list[int] = Field(default_factory=lambda: [1, 2, 4, 8, 16])
    contexts: list[int] = Field(default_factory=lambda: [64, 256, 512, 1024])
    prefill_tokens: list[int] = Field(default_factory=lambda: [32, 128, 256, 512])
    repeats: int = Field(7, ge=1)
    warmup: int = Field(2, ge=0)
    # [chosen] 48: every prompt of the bundled chat and math sets. The acceptance calibration is scored
    # held out by prompt, and prompts differ in acceptance: at 6 per domain the held-out ECE of even the
    # base rate was 3-7%; at 48 the chosen calibrator's is ~1.5% (docs/policies.md §6)
    prompts_per_domain: int = Field(48, ge=1)
    trace_tokens: int = Field(128, ge=2)  # positions per acceptance trace (the target generates K_max more)
    max_prompt_tokens: int = Field(256, ge=1)  # longer prompts keep their last tokens
    seed: int = 0
    # draft SM shares r to time decode shapes at (CUDA green contexts; the r axis of FASER's models);
    # empty = no split, sm_split NaN in latency.parquet
    sm_splits: list[float] = Field(default_factory=list)

    @classmethod
    def quick(cls, k_max: int = 8) -> "ProfileSettings":
        """A grid small enough for a 2-core CPU in about three minutes; as many trace prompts as the full
        profile (the calibration needs them, see prompts_per_domain), shorter traces."""
        return cls(k_max=k_max, batches=[1, 2, 4, 8], contexts=[32, 128, 384], prefill_tokens=[32, 128, 256, 512],
                   repeats=5, warmup=2, prompts_per_domain=48, trace_tokens=48, max_prompt_tokens=128)

    def covering(self, context: int, prompt: int, window: int | None, spread: float = 0.5) -> "ProfileSettings":
        """This grid with decode contexts and prefill lengths added until it reaches a workload's longest
        context (prompt + output) and longest prompt, so the simulator prices its steps from measurements,
        not from the fit's extrapolation (`autospec profile --workload`, `autospec run`). Each added value
        doubles the last, the final one is the workload's own. None passes what the grid's cells can hold
        in the models' context `window`: a cell's prompts grow by up to (K_max + 1) x (warmup + repeats +
        2) tokens while it is timed, and a ragged cell's longest prompt is (1 + `spread`) x its context
        (0.5 on the torch engine, `time_ragged_calls`; vLLM's profile spreads its decode rows by
        `RAGGED_SPREAD`, 0.75). The steps beyond stay flagged as outside the profile. A grid that covers
        the workload already is returned unchanged."""
        growth = (self.k_max + 1) * (self.warmup + self.repeats + 2) + 2
        top_context = context if window is None else min(context, int((window - growth) / (1 + spread)))
        top_prompt = prompt if window is None else min(prompt, window - growth)
        return self.model_copy(update={"contexts": _extended(self.contexts, top_context),
                                       "prefill_tokens": _extended(self.prefill_tokens, top_prompt)})


def _extended(values: list[int], target: int) -> list[int]:
    """`values` with doublings of the largest added until `target`, which ends them (the largest doubles
    past it: `target` itself)."""
    out = list(values)
    while out and out[-1] < target:
        out.append(min(2 * out[-1], target))
    return out


class VllmWorker(BaseModel):
    """profile.json's `vllm_worker`: what the worker of a vLLM profile's draft_model engine computed on, read
    inside it (`serving.vllm.openmp.worker_runtime`; docs/vllm.md, "Install")."""

    model_config = ConfigDict(extra="ignore")
    openmp: Literal["intel", "llvm", "gnu"] | None = None  # the OpenMP runtime its parallel regions ran on
    omp_threads: int = Field(1, ge=1)
    ld_preload: str = ""  # the worker's LD_PRELOAD: the user's, or the libgomp vLLM adds when it has none


class ProfileMeta(BaseModel):
    """profile/profile.json: how `autospec profile` measured (validated on read; fields the readers do
    not use, such as wall_s, are kept in the file and ignored here)."""

    model_config = ConfigDict(extra="ignore")
    schema_version: int
    settings: ProfileSettings

    @field_validator("settings", mode="before")
    @classmethod
    def _k_max_recorded(cls, value: Any) -> Any:
        # the chain length the traces hold is a measurement, not a default: a profile.json without it
        # cannot say what the acceptance traces recorded
        if isinstance(value, dict) and "k_max" not in value:
            raise ValueError("settings.k_max is missing (the draft chain length the acceptance traces hold)")
        return value
    engine: Literal["torch", "vllm"] = "torch"
    device: str = "cpu"
    prompt_set: dict[str, Any] | None = None  # workloads.prompts.prompt_set_digest of the trace prompts
    # the prompts a vLLM profile's decode rows were timed on (latency_profile.decode_prompt_lengths): "ragged"
    # since they are; absent in a profile written before, whose rows' batches were "uniform"
    decode_prompts: Literal["uniform", "ragged"] = "uniform"
    vllm_worker: VllmWorker | None = None  # a vLLM profile's worker; absent in a profile written before


def read_profile_meta(run_dir: str | Path) -> ProfileMeta | None:
    """DIR/profile/profile.json validated; None when the file is absent (a profile written by hand or
    before it existed). A malformed one is an InputError naming the file and the field."""
    path = Path(run_dir) / "profile" / "profile.json"
    if not path.exists():
        return None
    data = read_json(path)
    try:
        return ProfileMeta.model_validate(data)
    except ValidationError as exc:
        raise InputError.from_validation(exc, path) from None


def mad(values: Sequence[float]) -> float:
    """Median absolute deviation: the spread a profile row records next to its median."""
    v = np.asarray(values, float)
    return float(np.median(np.abs(v - np.median(v))))


def latency_grid(settings: ProfileSettings, catch_up: bool = True,
                 ragged: bool = True) -> list[tuple[str, str, int, int, int]]:
    """(model, phase, batch, tokens, context) for every shape to time, in measuring order. `catch_up`:
    the torch engine's draft pass of 2 tokens per request — a round's first pass after a verify that
    accepted every draft feeds the last draft and the bonus token (TorchSDEngine's `pending`), and a
    width-2 pass costs 1.2-1.5x a width-1 pass on the bundled pair. `ragged`: the torch engine's
    one-token passes over rows of unequal length (`decode_ragged`, profile.time_ragged_calls; the
    context is the longest row's), at batch >= 2 and without an SM split."""
    shapes = []
    for split in settings.sm_splits or [None]:
        for context in settings.contexts:
            for batch in settings.batches:
                for tokens in range(1, settings.k_max + 2):  # verify feeds k drafts + 1 per request
                    shapes.append(("target", "decode", batch, tokens, context))
                shapes.append(("draft", "decode", batch, 1, context))  # one new token per request
                if catch_up:
                    shapes.append(("draft", "decode", batch, 2, context))
                if ragged and batch >= 2 and split is None:
                    shapes += [(model, "decode_ragged", batch, 1, context) for model in ("draft", "target")]
    for tokens in settings.prefill_tokens:
        for model in ("target", "draft"):
            shapes.append((model, "prefill", 1, tokens, 0))
    return shapes


# --- fit/models.json -------------------------------------------------------------------------------------


# Numbers in fit/models.json, validated on read so that a hand-edited or corrupted file is an input error
# naming its field, never a simulator whose clock runs backwards, stands still or overflows. Every fitted
# cost is bounded at 0 by its fit (fit.fit_linear_relative, fit.fit_line_relative); [chosen] 60 s caps a
# per-token or per-pass cost: no served model spends a minute per token, and 1e308 overflows the clock.
Seconds = Annotated[float, Field(strict=True, ge=0.0, le=60.0, allow_inf_nan=False)]
Finite = Annotated[float, Field(strict=True, allow_inf_nan=False)]
Probability = Annotated[float, Field(strict=True, ge=0.0, le=1.0, allow_inf_nan=False)]
Positive = Annotated[float, Field(strict=True, gt=0.0, allow_inf_nan=False)]
# [chosen] a draft pass weight (FitModels.draft_pass_weights) is a multiple of one fitted pass: >= 0, and 1000
# caps it far above any measured (0.6-1.6 on the bundled pair) short of a clock that overflows
PassWeight = Annotated[float, Field(strict=True, ge=0.0, le=1e3, allow_inf_nan=False)]


class CoeffsRecord(BaseModel):
    """latency.LinearCoeffs as stored: AdaSpec's (α, γ, δ) and the simulator clock's extra terms."""

    model_config = ConfigDict(extra="forbid")
    alpha: Seconds
    gamma: Seconds
    delta: Seconds
    lam: Seconds = 0.0
    multi: Seconds = 0.0
    alpha_decode: Seconds | None = None
    alpha_ragged: Seconds | None = None

    @model_validator(mode="after")
    def _a_pass_takes_time(self) -> "CoeffsRecord":
        if self.gamma + self.delta <= 0.0:
            raise ValueError("gamma + delta must be > 0: a pass over one token would take no time, and the "
                             "simulated clock would never advance")
        return self

    def coeffs(self) -> LinearCoeffs:
        return LinearCoeffs(**self.model_dump())


class LinearPair(BaseModel):
    """A draft/target pair of linear coefficients (latency.LinearLatencyModel.to_dict)."""

    model_config = ConfigDict(extra="forbid")
    kind: Literal["linear"] = "linear"
    draft: CoeffsRecord
    target: CoeffsRecord

    def latency_model(self) -> LinearLatencyModel:
        return LinearLatencyModel(self.draft.coeffs(), self.target.coeffs())


class PiecewiseRecord(BaseModel):
    """One FASER piecewise model (latency.PiecewiseLatency.to_dict): its coefficients are fitted without
    bounds (a segment's slope may be negative), so they are only required to be finite."""

    model_config = ConfigDict(extra="forbid")
    kind: FaserKind
    load: list[Finite] = Field(min_length=1)
    seg1: list[Finite] = Field(min_length=2, max_length=2)
    seg2: list[Finite] = Field(min_length=2, max_length=2)
    knee: Finite | None = None

    def latency(self) -> PiecewiseLatency:
        return PiecewiseLatency.from_dict(self.model_dump())


class PrefillLine(BaseModel):
    """Prefill seconds = per_token_s · Σ L + per_square_token_s · Σ L² + fixed_s over the prompts of
    lengths L prefilled together: attention over a prompt grows with its length squared. The square
    term is 0 while a line prices the profiled prefills well enough (fit._prefill_line), and in fits
    written before it."""

    model_config = ConfigDict(extra="forbid")
    per_token_s: Seconds
    fixed_s: Seconds
    per_square_token_s: Seconds = 0.0

    def time(self, tokens: float, square_tokens: float = 0.0) -> float:
        """Seconds to prefill prompts of `tokens` tokens in all and `square_tokens` = Σ L²."""
        if tokens <= 0:
            return 0.0
        return self.per_token_s * tokens + self.per_square_token_s * square_tokens + self.fixed_s


class CalibrationScore(BaseModel):
    """Held-out scores of one predictor of P(the first j drafts are all accepted), pooled over every
    drafted (chain, position) of the held-out prompts (`autospec.fit.fit_calibration`)."""

    model_config = ConfigDict(extra="forbid")
    ece: float  # 20 equal-width bins
    ece_ci: list[float]  # [low, high]: 95% bias-corrected (basic) bootstrap, prompts resampled (fit.ece_interval)
    brier: float
    # 1 − Brier / Brier(per-position base rate): > 0 means better than predicting P(m ≥ j) of the
    # training prompts for every chain; the base rate itself scores 0
    brier_skill: float
    brier_skill_ci: list[float]
    ece_by_position: list[float]
    # the reliability diagram: per non-empty bin its count, mean prediction and observed rate
    reliability: list[dict[str, float]]


class CalibrationFit(BaseModel):
    """The acceptance calibration of fit/models.json: the calibrator DSpark applies and how it scored.

    Every candidate is scored on prompts its fit did not see (k-fold cross-validation grouped by prompt:
    no prompt's chains are on both sides of a fold); the one with the lowest held-out ECE is chosen and
    refitted on every chain. `held_out` also scores "identity" (the raw confidences: "before") and
    "base_rate" (the reference of the Brier skill score)."""

    model_config = ConfigDict(extra="forbid")
    chosen: str
    calibrator: Calibrator
    candidates: dict[str, Calibrator]
    held_out: dict[str, CalibrationScore]
    folds: int
    prompts: int
    chains: int
    samples: int  # drafted (chain, position) pairs scored
    bootstrap: int  # resamples behind the CIs
    bins: int
    seed: int

    @model_validator(mode="after")
    def _chosen_is_scored(self) -> "CalibrationFit":
        if self.chosen not in self.candidates or self.chosen not in self.held_out:
            raise ValueError(f"chosen calibrator {self.chosen!r} is not among the candidates and their scores")
        if "identity" not in self.held_out:
            raise ValueError("held_out has no 'identity' score (the raw confidences, 'before')")
        return self

    @property
    def before(self) -> CalibrationScore:
        return self.held_out["identity"]

    @property
    def after(self) -> CalibrationScore:
        return self.held_out[self.chosen]


class FitModels(BaseModel):
    """The schema of fit/models.json (validated on read)."""

    model_config = ConfigDict(extra="forbid")
    schema_version: int
    k_max: int = Field(strict=True, ge=1, le=32)
    linear: LinearPair
    linear_mape: dict[str, float]
    # the simulator's clock: the linear model plus λ·log2(N_b) + μ·[N_b ≥ 2] (latency.LinearCoeffs); absent in fits
    # written before it existed (the simulator then clocks with `linear`)
    clock: LinearPair | None = None
    clock_mape: dict[str, float] | None = None
    # the target's clock in an engine serving without speculative decoding, from `decode_plain` profile
    # rows (vLLM: a plain engine's step is cheaper than a speculative engine's step with no drafts);
    # None when the profile has none (the torch engine's pass is the same either way)
    clock_plain: CoeffsRecord | None = None
    clock_plain_mape: float | None = None
    # the target's clock in the engine that drafts, from `decode_drafting` profile rows (vLLM's
    # draft_model engine, which a replay serves SD with; its target side ran 5-9% over the fixed-K
    # engine's `decode` rows that `clock` is fitted to); it prices SD steps' multi-token target passes.
    # None when the profile has too few (torch: a replay runs the engine the profile timed)
    clock_drafting: CoeffsRecord | None = None
    clock_drafting_mape: float | None = None
    # what a drafting round costs on top of its draft passes, from `round` profile rows (vLLM's proposer:
    # its first pass re-feeds every verified token, and it works outside the passes); None when the
    # profile has none (the torch engine: a round is its passes). `draft_step_mape`: the clock's error
    # on the profile's whole draft steps (K passes + the round) at each profiled K, in-sample
    clock_draft_round: CoeffsRecord | None = None
    clock_draft_round_error: float | None = None
    draft_step_mape: float | None = None
    # what a round's i-th draft pass costs as a multiple of the draft clock's pass, i = 1 .. the profile's
    # K_max, from the `step` rows (fit._draft_pass_weights: vLLM's draft step is not linear in K, the line
    # over K that splits it is not); None when the profile has none (torch: every pass costs the same)
    draft_pass_weights: list[PassWeight] | None = None
    # signed per-K errors of the vLLM clocks (predicted / measured − 1), reported by `autospec fit`: the
    # whole draft step (K passes + round) on the `step` rows, and the target clock that prices SD steps
    # (`clock_drafting`) on the draft_model engine's target side (`decode_drafting` rows); None when the
    # profile has no such rows
    draft_step_bias: dict[int, float] | None = None
    drafting_target_bias: dict[int, float] | None = None
    piecewise: dict[str, PiecewiseRecord]
    piecewise_mape: dict[str, float]
    prefill: dict[Literal["draft", "target"], PrefillLine]
    prefill_mape: dict[str, float | None]
    sps: dict[Literal["tokens", "values"], list[Positive]]  # DSpark's SPS(B): tokens in a pass → speed
    sps_context: int
    per_position_acceptance: dict[str, list[Probability]]
    sts: dict[str, Any]  # STS's temperatures and held-out ECE (checked by _sts_is_complete)
    # the calibrator DSpark applies by default and its held-out scores; None in fits written before it
    calibration: CalibrationFit | None = None
    holdout: float
    seed: int
    points: dict[str, int]


    @field_validator("sts")
    @classmethod
    def _sts_is_complete(cls, sts: dict[str, Any]) -> dict[str, Any]:
        temps = sts.get("temperatures")
        if not isinstance(temps, list) or not all(isinstance(t, (int, float)) and not isinstance(t, bool)
                                                  and 0 < t < float("inf") for t in temps):
            raise ValueError("sts.temperatures must be a list of positive numbers")
        for key in ("ece_before", "ece_after"):
            value = sts.get(key)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value <= 1:
                raise ValueError(f"sts.{key} must be a number in [0, 1]")
        return sts

    @model_validator(mode="after")
    def _tables_are_whole(self) -> "FitModels":
        if set(self.prefill) != {"draft", "target"}:
            raise ValueError("prefill needs a line for both the draft and the target")
        tokens, values = self.sps.get("tokens"), self.sps.get("values")
        if not tokens or values is None or len(tokens) != len(values):
            raise ValueError("sps needs 'tokens' and 'values' of one non-zero length")
        return self


def read_fit_models(run_dir: str | Path) -> FitModels:
    """Read and validate DIR/fit/models.json (DIR may also be the fit folder itself or the file);
    `autospec.fit.load_fit` wraps the result in a FitResult."""
    p = Path(run_dir)
    path = p if p.suffix == ".json" else (p / "models.json" if p.name == "fit" else p / "fit" / "models.json")
    data = read_json(path)
    try:
        return FitModels.model_validate(data)
    except ValidationError as exc:
        raise InputError.from_validation(exc, path) from None
