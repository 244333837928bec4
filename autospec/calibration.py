"""The profile's and the fit's records as data: what `autospec profile` writes and `autospec fit` reads
(the latency and acceptance table columns, the measurement grid) and the schema of fit/models.json.

Profiling (`autospec.profile`, and the vLLM runner's `profile_latency`) and fitting (`autospec.fit`)
are stages; what they exchange lives here, one layer below them, so that the vLLM runner in
`autospec.serving.vllm` can time a grid and its online scheduler can read a fit without importing a
stage (tests/test_layers.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autospec.artifacts import read_json
from autospec.errors import InputError
from autospec.policies.calibrators import Calibrator

LATENCY_COLUMNS = ["model", "phase", "batch", "tokens", "context", "sm_split", "median_s", "mad_s", "repeats"]
ACCEPTANCE_COLUMNS = ["prompt_id", "domain", "position", "target_token", "match_len", "chain_tokens",
                      "confidences", "entropies", "klds", "target_probs", "accept_probs"]


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


class PrefillLine(BaseModel):
    """Prefill seconds = per_token_s · (batch · tokens) + fixed_s."""

    model_config = ConfigDict(extra="forbid")
    per_token_s: float
    fixed_s: float

    def time(self, tokens: float) -> float:
        return self.per_token_s * tokens + self.fixed_s if tokens > 0 else 0.0


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
    k_max: int
    linear: dict[str, Any]
    linear_mape: dict[str, float]
    # the simulator's clock: the linear model plus λ·log2(N_b) + μ·[N_b ≥ 2] (latency.LinearCoeffs); absent in fits
    # written before it existed (the simulator then clocks with `linear`)
    clock: dict[str, Any] | None = None
    clock_mape: dict[str, float] | None = None
    # the target's clock in an engine serving without speculative decoding, from `decode_plain` profile
    # rows (vLLM: a plain engine's step is cheaper than a speculative engine's step with no drafts);
    # None when the profile has none (the torch engine's pass is the same either way)
    clock_plain: dict[str, Any] | None = None
    clock_plain_mape: float | None = None
    # what a drafting round costs on top of its draft passes, from `round` profile rows (vLLM's proposer:
    # its first pass re-feeds every verified token, and it works outside the passes); None when the
    # profile has none (the torch engine: a round is its passes). `draft_step_mape`: the clock's error
    # on the profile's whole draft steps (K passes + the round) at each profiled K, in-sample
    clock_draft_round: dict[str, Any] | None = None
    clock_draft_round_error: float | None = None
    draft_step_mape: float | None = None
    piecewise: dict[str, dict[str, Any]]
    piecewise_mape: dict[str, float]
    prefill: dict[str, PrefillLine]
    prefill_mape: dict[str, float | None]
    sps: dict[str, list[float]]
    sps_context: int
    per_position_acceptance: dict[str, list[float]]
    sts: dict[str, Any]
    # the calibrator DSpark applies by default and its held-out scores; None in fits written before it
    calibration: CalibrationFit | None = None
    holdout: float
    seed: int
    points: dict[str, int]


def read_fit_models(run_dir: str | Path) -> FitModels:
    """Read and validate DIR/fit/models.json (DIR may also be the fit folder itself or the file);
    `autospec.fit.load_fit` wraps the result in a FitResult."""
    p = Path(run_dir)
    path = p if p.suffix == ".json" else (p / "models.json" if p.name == "fit" else p / "fit" / "models.json")
    data = read_json(path)
    try:
        return FitModels.model_validate(data)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise InputError(e["msg"], path=path, field=".".join(map(str, e["loc"]))) from None
