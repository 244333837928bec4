"""The `[workload]` TOML table: where requests come from and how the trace is shaped.

```toml
[workload]
trace = "bundled:azure-code-2023"   # a trace shipped with autospec, or a file (relative: from this TOML's folder)
format = "azure"            # azure | burstgpt | mooncake | servegen (detected when left out) | synthetic
start_s = 1800              # keep arrivals in [start_s, start_s + duration_s) ...
duration_s = 120            # ... and re-time them to start at 0
time_scale = 1.5            # multiply arrival times (1.5 = two thirds of the rate)
rate_scale = 1.0            # multiply the request rate
max_requests = 200          # then keep the first N
max_prompt_tokens = 256     # then clip lengths
max_output_tokens = 64
prompts = ["my_prompts.jsonl", { path = "more.txt", domain = "code" }]  # default: bundled code/chat/math
# or named datasets (autospec.workloads.datasets): [{ dataset = "mbpp", path = "mbpp.jsonl", limit = 50 }]
seed = 0
```

`trace` is a trace file (CSV/JSONL, gzipped or not; a relative path is taken from the folder of the
TOML file that names it) or `bundled:<name>`, a trace shipped inside the package, found wherever the
spec lives: `bundled:azure-code-2023` is one hour of the Azure LLM inference trace 2023, code
(8,819 requests, CC-BY-4.0; list in `autospec.workloads.loaders.BUNDLED_TRACES`).

A synthetic workload names a generator instead of a trace (see `autospec.workloads.synthetic`):
`format = "synthetic"`, `generator = "poisson" | "gamma" | "diurnal" | "onoff"`, `rate`, `duration_s`
and optionally `cv`, `amplitude`, `period_s`, `on_s`, `off_s`, `off_rate`, `mean_prompt_tokens`,
`mean_output_tokens`, `length_sigma`, `domains = { code = 1, chat = 2 }`. For a synthetic workload
`start_s` skips into the generated process (useful for the phase of a diurnal one).

The steps run in the order the keys are listed above; `prompts = []` leaves the requests without text
(enough for the simulator). Unknown keys and bad values raise InputError naming the field.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    PositiveInt,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from autospec.errors import InputError, parse_toml
from autospec.workloads._io import read_text
from autospec.workloads._table import MAX_TOKENS
from autospec.workloads.datasets import dataset_info, load_dataset
from autospec.workloads.default_prompts import bundled_prompt_sets
from autospec.workloads.loaders import BUNDLED_PREFIX, BUNDLED_TRACES, TRACE_FORMATS, load_trace
from autospec.workloads.prompts import Prompt, load_prompts
from autospec.workloads.synthetic import (
    GENERATORS,
    MAX_CV,
    MAX_LENGTH_SIGMA,
    MAX_PERIODS,
    MAX_REQUESTS,
    MIN_PERIOD_S,
    synthesize,
)
from autospec.workloads.trace import Trace

SYNTHETIC_KEYS = ("generator", "rate", "cv", "amplitude", "period_s", "on_s", "off_s", "off_rate",
                  "mean_prompt_tokens", "mean_output_tokens", "length_sigma", "domains")


class PromptSource(BaseModel):
    """A prompt file or a named dataset (`autospec.workloads.datasets`; with `dataset`, `path` is the
    dataset's file), optionally relabelled to one domain and cut to its first `limit` prompts."""

    model_config = ConfigDict(extra="forbid")
    path: str | None = None
    dataset: str | None = None
    field: str | None = Field(default=None, min_length=1)  # plain JSONL records: the key holding the text
    domain: str | None = Field(default=None, min_length=1)
    limit: PositiveInt | None = None

    @field_validator("dataset")
    @classmethod
    def _known_dataset(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            info = dataset_info(value)
        except InputError as exc:
            raise PydanticCustomError("unknown_dataset", exc.problem) from None
        if info.name == "random":
            # [chosen] a trace carries prompt text; random ids are what `prompts = []` already replays.
            raise PydanticCustomError("random_dataset", "dataset 'random' gives token ids, not text; a workload "
                                      "with `prompts = []` replays random token ids of the trace's lengths")
        return info.name

    @model_validator(mode="after")
    def _path_or_dataset(self) -> "PromptSource":
        if self.path is None and self.dataset is None:
            raise PydanticCustomError("prompt_source", "a prompt source needs `path` (a prompt file) or "
                                      "`dataset` (a named dataset)")
        if self.dataset == "stdlib" and self.path is not None:
            raise PydanticCustomError("prompt_source", "dataset 'stdlib' reads no file; drop `path`")
        return self


class WorkloadSpec(BaseModel):
    """The `[workload]` table (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    name: str | None = None
    trace: str | None = None
    format: Literal["azure", "burstgpt", "mooncake", "servegen", "synthetic"] | None = None
    domain: str | None = Field(default=None, min_length=1)  # label for a trace's requests

    generator: Literal["poisson", "gamma", "diurnal", "onoff"] | None = None
    rate: PositiveFloat | None = None
    # [chosen] cv ≤ 10: real traces measure ~1-4 (interarrival_cv in every summary); a gamma of cv 1e6 has
    # shape 1e-12, draws ~0 and its renewal loop never reached the end of the window
    cv: float = Field(default=1.0, ge=0, le=MAX_CV)
    amplitude: float = Field(default=0.5, ge=0, le=1)
    period_s: PositiveFloat = 86_400.0
    on_s: float = Field(default=5.0, ge=MIN_PERIOD_S)  # [chosen] ≥ 1 ms: one loop turn per period
    off_s: float = Field(default=15.0, ge=MIN_PERIOD_S)
    off_rate: NonNegativeFloat = 0.0
    mean_prompt_tokens: float = Field(default=256.0, ge=1, le=MAX_TOKENS)
    mean_output_tokens: float = Field(default=128.0, ge=1, le=MAX_TOKENS)
    # [chosen] ≤ 4: a lognormal of sigma 4 already spans e^±8 around its median; at 1000 its draws overflow
    length_sigma: float = Field(default=0.8, ge=0, le=MAX_LENGTH_SIGMA)
    domains: dict[str, NonNegativeFloat] | None = None

    start_s: NonNegativeFloat = 0.0
    duration_s: PositiveFloat | None = None
    time_scale: PositiveFloat = 1.0
    rate_scale: PositiveFloat = 1.0
    max_requests: PositiveInt | None = None
    max_prompt_tokens: PositiveInt | None = None
    max_output_tokens: PositiveInt | None = None
    prompts: list[PromptSource] | None = None  # a path, or a list of paths and {path, domain, limit} tables
    seed: int = Field(default=0, ge=0, le=2**32 - 1)

    @field_validator("rate", "cv", "amplitude", "period_s", "on_s", "off_s", "off_rate", "mean_prompt_tokens",
                     "mean_output_tokens", "length_sigma", "start_s", "duration_s", "time_scale", "rate_scale",
                     "max_requests", "max_prompt_tokens", "max_output_tokens", "seed", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value):
        # pydantic's lax mode reads `rate = true` as 1.0 and `rate = "4"` as 4.0: a TOML number is asked for
        if isinstance(value, (bool, str)):
            raise ValueError(f"expected a number, got {value!r}")
        return value

    @field_validator("domains", mode="before")
    @classmethod
    def _domains_are_named(cls, value):
        if isinstance(value, dict) and any(not str(name).strip() for name in value):
            raise ValueError("every domain needs a name (a key of at least one character)")
        return value

    @field_validator("prompts", mode="before")
    @classmethod
    def _prompt_paths_to_sources(cls, value):
        # One model for every spelling, so a bad entry is reported as prompts.<i>.<key>, not as a union mismatch.
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list):
            return [{"path": v} if isinstance(v, str) else v for v in value]
        return value

    @model_validator(mode="after")
    def _source_is_consistent(self) -> "WorkloadSpec":
        synthetic = self.format == "synthetic" or (self.format is None and self.trace is None)
        if synthetic:
            if self.trace is not None:
                raise _FieldProblem("trace", "a synthetic workload takes no trace file")
            if self.domain is not None:
                raise _FieldProblem("domain", "a synthetic workload mixes domains with 'domains = { code = 1, ... }'")
            for key in ("generator", "rate", "duration_s"):
                if getattr(self, key) is None:
                    raise _FieldProblem(key, f"a synthetic workload needs '{key}' "
                                        f"(generators: {', '.join(GENERATORS)}), or give a trace file")
            if self.rate * (self.start_s + self.duration_s) > MAX_REQUESTS:
                raise _FieldProblem("rate", f"rate x (start_s + duration_s) asks for more than "
                                            f"{MAX_REQUESTS:,} requests")
            if self.generator == "onoff" and (self.start_s + self.duration_s) / (self.on_s + self.off_s) > MAX_PERIODS:
                raise _FieldProblem("on_s", f"on_s + off_s is too short for the duration: more than {MAX_PERIODS:,} "
                                            "on/off periods")
            if self.off_rate > self.rate:
                raise _FieldProblem("off_rate", "off_rate cannot exceed rate (rate is the mean over on and off)")
            if self.domains is not None and not any(w > 0 for w in self.domains.values()):
                raise _FieldProblem("domains", "at least one domain needs a weight > 0")
            self.format = "synthetic"
        else:
            if self.trace is None:
                raise _FieldProblem("trace", f"format '{self.format}' needs a trace file")
            bundled = self.trace.removeprefix(BUNDLED_PREFIX)
            if self.trace.startswith(BUNDLED_PREFIX) and bundled not in BUNDLED_TRACES:
                raise _FieldProblem("trace", f"unknown bundled trace {bundled!r}; known: "
                                             f"{', '.join(BUNDLED_PREFIX + n for n in sorted(BUNDLED_TRACES))}")
            for key in SYNTHETIC_KEYS:
                if key in self.model_fields_set:
                    raise _FieldProblem(key, f"'{key}' only applies to format = \"synthetic\"")
        return self

    @property
    def is_synthetic(self) -> bool:
        return self.format == "synthetic"

    def build(self, base_dir: str | Path = ".") -> Trace:
        """The trace this spec describes; relative paths are taken from `base_dir`."""
        base_dir = Path(base_dir)
        end_s = math.inf if self.duration_s is None else self.start_s + self.duration_s
        if self.is_synthetic:
            trace = synthesize(self.generator, rate=self.rate, duration_s=end_s, seed=self.seed, cv=self.cv,
                               amplitude=self.amplitude, period_s=self.period_s, on_s=self.on_s, off_s=self.off_s,
                               off_rate=self.off_rate, mean_prompt_tokens=self.mean_prompt_tokens,
                               mean_output_tokens=self.mean_output_tokens, length_sigma=self.length_sigma,
                               domains=self.domains, name=self.name or "")
        else:
            trace = load_trace(_trace_source(base_dir, self.trace), self.format, domain=self.domain, seed=self.seed,
                               span=(self.start_s, end_s))
        if self.start_s > 0 or self.duration_s is not None:
            trace = trace.window(self.start_s, self.duration_s)
        if len(trace) == 0:
            raise InputError(f"no requests arrive in [{self.start_s:g}, {end_s:g}) s", field="start_s")
        trace = trace.time_scale(self.time_scale).rate_scale(self.rate_scale)
        if self.max_requests is not None:
            trace = trace.cap(self.max_requests)
        trace = trace.clip_lengths(self.max_prompt_tokens, self.max_output_tokens)
        prompt_sets = self.prompt_sets(base_dir)
        if prompt_sets:
            trace = trace.assign_prompts(prompt_sets, seed=self.seed)
        if self.name:
            trace.name = self.name
        return trace

    def prompt_sets(self, base_dir: str | Path = ".") -> dict[str, list[Prompt]]:
        """Domain → prompts: the bundled sets by default, else the named files grouped by domain."""
        if self.prompts is None:
            return bundled_prompt_sets()
        sets: dict[str, list[Prompt]] = {}
        for source in self.prompts:
            path = None if source.path is None else _resolve(Path(base_dir), source.path)
            if source.dataset is not None:
                loaded = load_dataset(source.dataset, path, limit=source.limit, domain=source.domain,
                                      seed=self.seed, field=source.field, path_hint="`path = FILE` in its source")
            else:
                loaded = load_prompts(path, source.domain, source.limit, field=source.field)
            for prompt in loaded:
                sets.setdefault(prompt.domain, []).append(prompt)
        return sets


class _FieldProblem(ValueError):
    """A cross-field problem, carrying the field to name (pydantic would blame the whole table)."""

    def __init__(self, field: str, problem: str):
        super().__init__(problem)
        self.field = field


def read_workload_spec(path: str | Path) -> WorkloadSpec:
    """The `[workload]` table of a TOML file (other tables, e.g. a run config's, are left alone)."""
    path = Path(path)
    data = parse_toml(read_text(path), path=path)
    if "workload" not in data or not isinstance(data["workload"], dict):
        raise InputError("no [workload] table", path=path)
    return workload_spec_from_dict(data["workload"], path)


def workload_spec_from_dict(data: dict, source: str | Path | None = None) -> WorkloadSpec:
    """Validate a `[workload]` table already parsed (e.g. from a run config); errors name `source`."""
    try:
        return WorkloadSpec.model_validate(data)
    except ValidationError as exc:
        raise _input_error(exc, source) from None


def load_workload(path: str | Path) -> Trace:
    """Read a workload TOML and build its trace (relative paths resolved against the TOML's folder)."""
    path = Path(path)
    spec = read_workload_spec(path)
    try:
        return spec.build(path.parent)
    except InputError as exc:
        if exc.path is None:  # a spec-level problem (empty window, ...): say which spec file
            raise InputError(exc.problem, path=path, field=exc.field and f"workload.{exc.field}") from None
        raise


def _trace_source(base_dir: Path, name: str) -> str | Path:
    """`bundled:<name>` as it is (load_trace finds it in the package), else a path from `base_dir`."""
    return name if name.startswith(BUNDLED_PREFIX) else _resolve(base_dir, name)


def _resolve(base_dir: Path, name: str) -> Path:
    path = Path(name).expanduser()
    return path if path.is_absolute() else base_dir / path


def _input_error(exc: ValidationError, source: str | Path | None) -> InputError:
    """The first pydantic error as a one-line InputError naming `workload.<field>` (a _FieldProblem
    names its own field); an unknown format lists the formats this reads."""
    error = InputError.from_validation(exc, source, prefix="workload")
    first = exc.errors()[0]
    if first["type"] == "literal_error" and tuple(first["loc"]) == ("format",):
        known = f"unknown format; expected one of {', '.join(TRACE_FORMATS + ('synthetic',))}"
        error = InputError(error.problem.replace(first["msg"], known, 1), path=source, field=error.field)
    return error
