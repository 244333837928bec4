"""Settings as pydantic models: the same models validate CLI flags, TOML files and run artifacts.

A run config TOML has one table per model below (`[pair]`, `[engine]`, `[generate]`, `[slo]`, `[profile]`,
`[tune]`, `[evaluate]`, plus `stages`, `workload`, `max_batch`); every table and
key is optional and falls back to the embedded default (the bundled pair on the torch engine over the
bundled prompt domains). Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autospec.errors import InputError
from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET

SCHEMA_VERSION = 1


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PairSpec(_Model):
    """The draft/target pair: Hugging Face model directories (default: the bundled pair)."""

    target: Path = BUNDLED_TARGET
    draft: Path | None = BUNDLED_DRAFT  # None = no draft model (plain decoding only)

    def is_bundled(self) -> bool:
        return self.target == BUNDLED_TARGET and self.draft == BUNDLED_DRAFT


class EngineSpec(_Model):
    kind: Literal["torch"] = "torch"
    device: str = "cpu"
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    k_max: int = Field(8, ge=1, le=32)
    seed: int = 0
    threads: int | None = Field(None, ge=1)  # torch intra-op threads; None = torch's default


class GenerateSpec(_Model):
    """`autospec generate`: a strategy over a prompt file with FCFS static batching."""

    prompts: list[Path] = Field(default_factory=list)  # empty = the bundled domain sets
    prompts_per_set: int | None = Field(None, ge=1)
    strategy: str = "static-k4"
    k: int | None = Field(None, ge=0)  # shorthand: static K (0 = no SD); overrides `strategy`
    temperature: float = Field(0.0, ge=0.0)
    max_tokens: int = Field(64, ge=1)
    batch_size: int = Field(8, ge=1)
    ignore_eos: bool = False
    compare_to_no_sd: bool = False  # also run K=0 and report the speed-up


def bundled_workload(name: str) -> Path:
    """A bundled workload spec (workloads/<name>.toml; autospec/workload_specs is a link to it)."""
    here = Path(__file__).resolve().parent
    for folder in (here / "workload_specs", here.parent / "workloads"):
        if (folder / f"{name}.toml").is_file():
            return folder / f"{name}.toml"
    return here / "workload_specs" / f"{name}.toml"


STAGES = ("generate", "profile", "fit", "tune", "evaluate", "report")
PIPELINE = ["profile", "fit", "tune", "evaluate", "report"]


class SloSpec(_Model):
    """[chosen] for the bundled ~10M-parameter pair on a CPU (~10 ms/token at batch 1): first token
    within 1 s, then 50 ms per output token. Set your deployment's numbers."""

    ttft_s: float = Field(1.0, gt=0)
    tpot_s: float = Field(0.05, gt=0)


class ProfileStage(_Model):
    quick: bool = True  # the ≤ 3 min CPU grid; false = the full grid
    k_max: int = Field(8, ge=1, le=32)
    reuse: Path | None = None  # an already profiled (+ fitted) run directory: skip profile (and fit)


class TuneStage(_Model):
    trials: int = Field(40, ge=1)
    objective: Literal["goodput", "multi"] = "goodput"
    min_attainment: float = Field(0.9, ge=0.0, le=1.0)
    strategies: list[str] | None = None  # None = tune's default candidates
    storage: str | None = None


class EvaluateStage(_Model):
    # On the simulator: these plus the tuned strategy; on the real engine: real_strategies plus it.
    strategies: list[str] = Field(default_factory=lambda: ["no-sd", "static-k2", "static-k4", "adaspec", "oracle"])
    real_strategies: list[str] = Field(default_factory=lambda: ["no-sd"])
    real_engine: bool = True  # also replay on the torch engine (the simulator-vs-real comparison)
    repeats: int = Field(1, ge=1)


class RunSpec(_Model):
    schema_version: int = SCHEMA_VERSION
    # Which stages run, in order. Default: the pipeline; a config with only a [generate] table keeps
    # the generate-only run it always meant.
    stages: list[Literal["generate", "profile", "fit", "tune", "evaluate", "report"]] = Field(
        default_factory=lambda: list(PIPELINE))
    pair: PairSpec = PairSpec()
    engine: EngineSpec = EngineSpec()
    generate: GenerateSpec = GenerateSpec()
    workload: Path = Field(default_factory=lambda: bundled_workload("bursty"))
    slo: SloSpec = SloSpec()
    max_batch: int = Field(8, ge=1)
    profile: ProfileStage = ProfileStage()
    tune: TuneStage = TuneStage()
    evaluate: EvaluateStage = EvaluateStage()

    @model_validator(mode="before")
    @classmethod
    def _generate_only_configs(cls, data: Any) -> Any:
        if isinstance(data, dict) and "stages" not in data and "generate" in data and not (
                {"profile", "fit", "tune", "evaluate", "workload"} & set(data)):
            return {**data, "stages": ["generate"]}
        return data


def _first_error(err: ValidationError) -> tuple[str, str]:
    e = err.errors()[0]
    return ".".join(str(p) for p in e["loc"]), e["msg"]


def load_run_spec(path: str | Path) -> RunSpec:
    """Read a run config TOML; relative paths inside it are resolved against the file's folder."""
    path = Path(path)
    if not path.is_file():
        raise InputError("config file not found", path=path)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise InputError("config file is not UTF-8 text", path=path) from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"invalid TOML: {exc}", path=path) from None
    try:
        spec = RunSpec.model_validate(data)
    except ValidationError as err:
        where, msg = _first_error(err)
        raise InputError(msg, path=path, field=where) from None
    if spec.schema_version != SCHEMA_VERSION:
        raise InputError(f"schema_version {spec.schema_version} is not supported (this autospec reads "
                         f"{SCHEMA_VERSION})", path=path, field="schema_version")
    base = path.resolve().parent
    pair = spec.pair
    spec.pair = PairSpec(target=_resolve(base, pair.target),
                         draft=None if pair.draft is None else _resolve(base, pair.draft))
    spec.generate.prompts = [_resolve(base, p) for p in spec.generate.prompts]
    if "workload" in data:
        spec.workload = _resolve(base, spec.workload)
    if spec.profile.reuse is not None:
        spec.profile.reuse = _resolve(base, spec.profile.reuse)
    return spec


def _resolve(base: Path, p: Path) -> Path:
    return p if p.is_absolute() else (base / p)


def dump_run_spec(spec: RunSpec) -> str:
    data = spec.model_dump(mode="json", exclude_none=True)
    return tomli_w.dumps(data)
