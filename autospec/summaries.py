"""The shapes of `eval/summary.json` (autospec evaluate) and `tune/summary.json` (autospec tune) as their
readers — `autospec report` and `autospec gate` — check them on read.

Both files are written by autospec, but a reader cannot trust them: a run directory is copied, hand-edited,
truncated by a full disk or produced by another version. A value of the wrong type deep inside used to
surface as an AttributeError or KeyError in the middle of building a report; here it is an InputError
naming the file and the dotted field. Only what the readers use is typed; every other key is kept as
written (`extra="allow"`), so the writers can add fields without touching this module.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autospec.artifacts import read_json
from autospec.errors import InputError

__all__ = ["check_eval_summary", "read_eval_summary", "read_tune_summary"]

# A metric: a number (JSON has no NaN or infinity of its own; Python's writer can emit them) or null
Number = Annotated[float, Field(strict=True)]


class MetricInterval(BaseModel):
    """One metric of one strategy: its mean over repeats and the 95% CI."""

    model_config = ConfigDict(extra="forbid")
    mean: Number | None
    ci_low: Number | None = None
    ci_high: Number | None = None


class EvalSummaryShape(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_version: int
    strategies: dict[str, dict[str, MetricInterval]] = Field(min_length=1)
    baseline: str | None = None
    repeats: int | None = None
    workload: dict[str, Any] = Field(default_factory=dict)
    engine: dict[str, Any] = Field(default_factory=dict)
    slo: dict[str, Any] = Field(default_factory=dict)
    load: dict[str, Any] | None = None
    per_position_acceptance: dict[str, list[Number | None]] = Field(default_factory=dict)
    calibration: dict[str, Any] | None = None
    findings: dict[str, list[str]] | None = None  # strategy → what its own rule did (Strategy.findings)
    capacity: dict[str, Any] | None = None
    host_speed: dict[str, Any] | None = None
    shift: dict[str, Any] | None = None
    outside_profile: dict[str, Any] | None = None
    fit_health: dict[str, Any] | None = None  # the simulator's clocks that miss their profile (fit.loose_clocks)
    host_load: dict[str, Any] | None = None  # a real engine's other-process CPU share (telemetry.HostLoadMeter)


class TrialRecord(BaseModel):
    model_config = ConfigDict(extra="allow")
    number: int | None = None
    strategy: str
    name: str | None = None
    params: dict[str, Any] = Field(default_factory=dict)
    value: Number | list[Number | None] | None = None


class ConfirmedCandidate(BaseModel):
    model_config = ConfigDict(extra="allow")
    strategy: str
    why: str
    real_attainment: MetricInterval
    sim_attainment: Number | None = None
    tied_with_best: bool = False


class Confirmation(BaseModel):
    """tune's real-engine confirmation (autospec.confirm)."""

    model_config = ConfigDict(extra="allow")
    status: str
    candidates: list[ConfirmedCandidate] = Field(default_factory=list)
    recommended: str | None = None


class TuneSummaryShape(BaseModel):
    model_config = ConfigDict(extra="allow")
    schema_version: int
    study_name: str | None = None
    objective: str | None = None
    objectives: list[str] | None = None
    direction: str | None = None
    directions: list[str] | None = None
    scope: str | None = None
    best: TrialRecord  # what the report shows first; a summary without it is not one tune wrote
    best_deployable: TrialRecord | None = None
    none_feasible: str | None = None  # the one line when no trial meets the SLO target (tune.none_feasible)
    confirmed: Confirmation | None = None
    deploy: dict[str, Any] | None = None
    run: dict[str, Any] | None = None


def _read(path: Path, shape: type[BaseModel]) -> dict[str, Any]:
    data = read_json(path)
    _check(data, path, shape)
    return data


def _check(data: dict[str, Any], path: str | Path, shape: type[BaseModel]) -> None:
    try:
        shape.model_validate(data)
    except ValidationError as exc:
        raise InputError.from_validation(exc, path) from None


def check_eval_summary(data: dict[str, Any], path: str | Path) -> None:
    """An eval summary already read (autospec gate reads it with a tolerant version check) checked."""
    _check(data, path, EvalSummaryShape)


def read_eval_summary(path: str | Path) -> dict[str, Any]:
    """An eval/summary.json, checked (InputError naming the file and the field otherwise), as written."""
    return _read(Path(path), EvalSummaryShape)


def read_tune_summary(path: str | Path) -> dict[str, Any]:
    """A tune/summary.json, checked (InputError naming the file and the field otherwise), as written."""
    return _read(Path(path), TuneSummaryShape)
