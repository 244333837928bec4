"""Strategies: presets (TOML) → validated `StrategySpec` → built `Strategy` (docs/architecture.md,
"Strategies").

A preset file (policies/<name>.toml at the repo root, shipped as package data under autospec/presets):

    [strategy]  name, description
    [length]    policy = "<registry name>" plus that policy's params (flat keys)
    [verify]    policy + params           (default: all)
    [schedule]  policy + params           (default: fcfs)
    [execution] sm_split, chunk_size, early_exit (+ ee_* early-exit constants)
    [search.<section>.<param>]  type = "int" | "float" | "categorical", low, high, log, choices
                (on a list parameter, e.g. batch-schedule's k, the range applies to each element)

Every problem is an InputError naming the file and the dotted field, in one line.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Mapping

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from autospec.contract import VIEW_SIGNALS
from autospec.early_exit import EarlyExitParams
from autospec.errors import InputError, parse_toml, read_text_file
from autospec.policies.base import LengthPolicy, PolicyParams, SchedulePolicy, VerifyPolicy, build_policy, policy_class

SECTIONS = ("length", "verify", "schedule")


class SpecFieldError(ValueError):
    """A validation problem tied to a dotted field; load_preset turns it into InputError(field=...)."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


class StrategyMeta(_Strict):
    name: str = Field(min_length=1)
    description: str = ""


class PolicySection(BaseModel):
    """`policy` plus that policy's parameters as flat keys (validated against its Params model)."""

    model_config = ConfigDict(strict=True, extra="allow", frozen=True)
    policy: str

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ExecutionSpec(_Strict):
    """FASER execution knobs (docs/policies.md §4). 0 turns a feature off (TOML has no null)."""

    sm_split: float = Field(0.0, ge=0.0, lt=1.0)  # draft's share r of the SMs; 0 = no split
    # frontier-overlap chunk s_c; 0 = no overlap; "auto" = FASER's condition on the fitted models each
    # step (serving/frontier.py: without an SM split that means no overlap)
    chunk_size: int | Literal["auto"] = 0
    early_exit: bool = False
    # How the draft proposes at T>0: "sample" from its distribution, or "greedy" (its argmax, verified
    # as a point mass). A verify policy that trims by the drafts' own confidences (AdaSpec's verifier,
    # DSpark) is only lossless with greedy proposals: the verified prefix must not depend on a random
    # draw (DSpark App. A shows the bias otherwise; tests/engine/test_strategies_lossless.py measures it).
    draft_sampling: Literal["sample", "greedy"] = "sample"
    ee_start_fraction: float = Field(0.4, gt=0.0, lt=1.0)  # L_init = ⌊fraction·L⌋ [chosen]
    ee_k_start: int = Field(64, ge=1)  # K_ℓ at L_init [chosen]
    ee_k_end: int = Field(10, ge=1)  # K_ℓ at L − 1 [chosen]
    # Eq. 10's check and pruning costs as fractions of one verify pass, used when no fitted FASER
    # model gives them [chosen] (autospec/early_exit.py)
    ee_check_cost_ratio: float = Field(0.05, ge=0.0)
    ee_prune_cost_ratio: float = Field(0.01, ge=0.0)

    @field_validator("chunk_size", mode="before")
    @classmethod
    def _check_chunk(cls, value: Any) -> Any:
        if not (value == "auto" and isinstance(value, str)) and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f'chunk_size must be an integer >= 0 or "auto", got {value!r}')
        return value

    @property
    def frontier(self) -> bool:
        """Frontier overlap asked for: a fixed chunk or "auto"."""
        return self.chunk_size != 0

    @property
    def early_exit_params(self) -> EarlyExitParams:
        return EarlyExitParams(start_fraction=self.ee_start_fraction, k_start=self.ee_k_start,
                               k_end=self.ee_k_end, check_cost_ratio=self.ee_check_cost_ratio,
                               prune_cost_ratio=self.ee_prune_cost_ratio)


class SearchRange(_Strict):
    """One Optuna search dimension."""

    type: Literal["int", "float", "categorical"]
    low: int | float | None = None
    high: int | float | None = None
    log: bool = False
    choices: list[int | float | bool | str] | None = None

    def endpoints(self) -> list[Any]:
        return list(self.choices or []) if self.type == "categorical" else [self.low, self.high]


class StrategySpec(_Strict):
    strategy: StrategyMeta
    length: PolicySection
    verify: PolicySection = PolicySection(policy="all")
    schedule: PolicySection = PolicySection(policy="fcfs")
    execution: ExecutionSpec = ExecutionSpec()
    search: dict[str, dict[str, SearchRange]] = Field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.strategy.name

    @model_validator(mode="after")
    def _check_policies_and_search(self) -> "StrategySpec":
        for kind in SECTIONS:
            section: PolicySection = getattr(self, kind)
            try:
                cls = policy_class(kind, section.policy)
            except InputError as err:
                raise SpecFieldError(f"{kind}.policy", err.problem) from None
            _validate_params(kind, cls.Params, section.params)
        if self.verify.policy != "all" and self.execution.draft_sampling != "greedy":
            raise SpecFieldError("execution.draft_sampling",
                                 f"verify policy {self.verify.policy!r} trims drafts by their own confidence, "
                                 "which is lossless only with draft_sampling = \"greedy\"")
        for kind, params in self.search.items():
            for name, rng in params.items():
                self._check_search(kind, name, rng)
        return self

    def _check_search(self, kind: str, name: str, rng: SearchRange) -> None:
        where = f"search.{kind}.{name}"
        if kind == "execution":
            model: type[BaseModel] = ExecutionSpec
            base = self.execution.model_dump()
        elif kind in SECTIONS:
            section: PolicySection = getattr(self, kind)
            model = policy_class(kind, section.policy).Params
            base = section.params
        else:
            raise SpecFieldError(where, f"unknown section {kind!r}; use one of length, verify, schedule, "
                                        "execution")
        if name not in model.model_fields:
            raise SpecFieldError(where, f"{name!r} is not a parameter of {kind} "
                                        f"({', '.join(model.model_fields) or 'no parameters'})")
        if rng.type == "categorical":
            if not rng.choices:
                raise SpecFieldError(where, "a categorical search needs a non-empty `choices` list")
        else:
            if rng.low is None or rng.high is None:
                raise SpecFieldError(where, f"a {rng.type} search needs `low` and `high`")
            if rng.type == "int" and not (isinstance(rng.low, int) and isinstance(rng.high, int)):
                raise SpecFieldError(where, "an int search needs integer `low` and `high`")
            if rng.low > rng.high:
                raise SpecFieldError(where, f"inverted search range: low {rng.low} > high {rng.high}")
            if rng.log and rng.low <= 0:
                raise SpecFieldError(where, "a log search needs low > 0")
        default = model.model_fields[name].get_default(call_default_factory=True)
        current = base.get(name, default)
        for value in rng.endpoints():
            if isinstance(current, list):  # a range on a list parameter searches each element
                value = [value] * len(current)
            try:
                model.model_validate({**base, name: value})
            except ValidationError as err:
                raise SpecFieldError(where, f"search value {value!r} is not valid for {kind}.{name}: "
                                            f"{err.errors()[0]['msg']}") from None


def _validate_params(kind: str, params_model: type[PolicyParams], params: Mapping[str, Any]) -> None:
    try:
        params_model.model_validate(dict(params))
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in first["loc"])
        raise SpecFieldError(f"{kind}.{loc}" if loc else kind, first["msg"]) from None


@dataclass
class Strategy:
    """A built strategy: the three policy objects (fresh state) and the execution config."""

    name: str
    length: LengthPolicy
    verify: VerifyPolicy
    schedule: SchedulePolicy
    execution: ExecutionSpec
    spec: StrategySpec

    @property
    def view_signals(self) -> frozenset[str]:
        """The RequestView and StepContext signals some policy of the strategy reads (`Policy.reads`:
        contract.VIEW_SIGNALS and CONTEXT_SIGNALS; all the view signals for a policy object that does
        not say)."""
        return frozenset().union(*(getattr(p, "reads", VIEW_SIGNALS)
                                   for p in (self.length, self.verify, self.schedule)))

    def findings(self) -> list[str]:
        """What the policies' own rules did in the run that a reader of the results should know (a policy
        may define `findings() -> list[str]`, e.g. AdaSpec's SLO refusals); read after a replay."""
        return [line for p in (self.length, self.verify, self.schedule) for line in getattr(p, "findings", list)()]


# --- defaults from a fit ---------------------------------------------------------------------------------

log = logging.getLogger("autospec.strategy")


def apply_fit(spec: StrategySpec, fit: Mapping[str, Any] | None) -> StrategySpec:
    """`spec` with the fit's values in the parameters its policies take from a fit and the preset left
    empty (a Params class names them in `fitted` and fills them in `with_fit`; DSpark: its calibrator
    and SPS(B) table). `fit` is `autospec.fit.FitResult.policy_inputs`; None returns `spec` unchanged.
    Every replay with a fit builds its strategies through this (`autospec.serving.replay.Replay`)."""
    if not fit:
        return spec
    data = None
    for kind in SECTIONS:
        section: PolicySection = getattr(spec, kind)
        params_model = policy_class(kind, section.policy).Params
        if not getattr(params_model, "fitted", ()):
            continue
        filled = params_model.with_fit(section.params, fit)  # type: ignore[attr-defined]
        if filled != section.params:
            data = spec.model_dump() if data is None else data
            data[kind] = {"policy": section.policy, **filled}
    return spec if data is None else spec_from_dict(data)


def uncalibrated(spec: StrategySpec) -> list[str]:
    """The policies of `spec` ("verify: dspark") that would rank drafts by raw, uncalibrated confidences
    (a Params class that says `calibrated` False)."""
    out = []
    for kind in SECTIONS:
        section: PolicySection = getattr(spec, kind)
        params = policy_class(kind, section.policy).Params.model_validate(dict(section.params))
        if getattr(params, "calibrated", True) is False:
            out.append(f"{kind}: {section.policy}")
    return out


def calibration_flags(specs: list[StrategySpec], fit: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Per strategy whose policies take a calibrator (DSpark): whether it runs calibrated, with which
    calibrator kind, from where ("fit", "preset" or None) — what an evaluation summary records."""
    out: dict[str, dict[str, Any]] = {}
    for spec in specs:
        for kind in SECTIONS:
            section: PolicySection = getattr(spec, kind)
            model = policy_class(kind, section.policy).Params
            if "calibrated" not in dir(model):
                continue
            own = model.model_validate(dict(section.params))
            used = model.model_validate(dict(getattr(apply_fit(spec, fit), kind).params))
            source = "preset" if own.calibrated else ("fit" if used.calibrated else None)
            out[spec.name] = {"calibrated": used.calibrated, "kind": used.calibrator.kind, "source": source}
    return out


def uncalibrated_warnings(specs: list[StrategySpec], fit: Mapping[str, Any] | None) -> list[str]:
    """One warning line per strategy that runs uncalibrated with `fit` (None: the run has no fit); each is
    also logged on the "autospec.strategy" logger (stderr when nothing else handles it)."""
    lines = []
    for spec in specs:
        raw = uncalibrated(apply_fit(spec, fit))
        if raw:
            why = "the run has no fit" if not fit else "its preset and the fit give no calibrator"
            lines.append(f"warning: {spec.name} runs uncalibrated ({', '.join(raw)} ranks drafts by raw draft "
                         f"confidences: {why}; `autospec profile --out DIR` + `autospec fit DIR` make one, "
                         "which evaluate --profile DIR, tune and run apply)")
    for line in lines:
        log.warning(line)
    return lines


def reads_the_future(spec: StrategySpec) -> bool:
    """Whether the strategy's length policy is an oracle (`oracle`, `oracle-m`): it reads the true match
    length, which only the simulator knows — a bound to compare with, never a policy to deploy or tune."""
    return "true_match_len" in policy_class("length", spec.length.policy).reads


def build_strategy(spec: StrategySpec, fit: Mapping[str, Any] | None = None) -> Strategy:
    """Instantiate the spec's policies (each call gives new objects with empty state), with the fit's
    defaults (`apply_fit`) when `fit` is given."""
    spec = apply_fit(spec, fit)
    return Strategy(
        name=spec.name,
        length=build_policy("length", spec.length.policy, **spec.length.params),  # type: ignore[arg-type]
        verify=build_policy("verify", spec.verify.policy, **spec.verify.params),  # type: ignore[arg-type]
        schedule=build_policy("schedule", spec.schedule.policy, **spec.schedule.params),  # type: ignore[arg-type]
        execution=spec.execution,
        spec=spec,
    )


# --- presets ----------------------------------------------------------------------------------------


def presets_dir() -> Path:
    """Where the bundled presets live: autospec/presets in an installed wheel (pyproject.toml maps the
    repo's top-level policies/ there as package data), else policies/ itself (editable install, checkout)."""
    # [chosen] a resource folder of `autospec`, not an import of `autospec.presets`: policies/ has no
    # __init__.py (it is the users' folder of TOML files), and setuptools' editable finder cannot import
    # a mapped folder without one, so editable installs and plain checkouts read the repo folder directly.
    installed = resources.files("autospec") / "presets"
    if installed.is_dir():
        return Path(str(installed))
    return Path(__file__).resolve().parents[1] / "policies"


def list_presets() -> list[str]:
    return sorted(p.stem for p in presets_dir().glob("*.toml"))


def preset_path(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    try:
        if path.suffix == ".toml" or path.exists():
            if not path.is_file():
                raise InputError("no such preset file", path=path)
            return path
        candidate = presets_dir() / f"{name_or_path}.toml"
        found = candidate.is_file()
    except OSError as exc:  # a name longer than the OS allows, say
        shown = str(name_or_path)
        raise InputError(f"not a preset name or file ({exc.strerror or exc}): "
                         f"{shown[:60] + '...' if len(shown) > 60 else shown!r}") from None
    if not found:
        raise InputError(f"unknown preset {str(name_or_path)!r}; known: {', '.join(list_presets())}")
    return candidate


def spec_from_dict(data: Mapping[str, Any], path: str | Path | None = None) -> StrategySpec:
    """Validate a parsed preset; InputError(path, field) on the first problem."""
    try:
        return StrategySpec.model_validate(dict(data))
    except ValidationError as err:
        raise InputError.from_validation(err, path) from None  # a SpecFieldError names its own field


def load_preset(name_or_path: str | Path) -> StrategySpec:
    """Load a bundled preset by name (see list_presets()) or any preset file by path."""
    path = preset_path(name_or_path)
    return spec_from_dict(parse_toml(read_text_file(path, "preset file"), path=path), path)


# length policies whose `k` is the draft length itself (a static K, a K per batch-size bucket), not a cap
FIXED_K_POLICIES = ("static", "batch-schedule")


def check_k_max(spec: StrategySpec, k_max: int) -> None:
    """A strategy whose length policy fixes its draft length (`k` of static K, or of a per-batch-size
    schedule) above the replay's K_max is an input error — it used to be clipped to K_max silently, so
    `k = 100` ran as K_max and reported under its own name. Elsewhere `k` is a cap drafting runs up to —
    under a verify policy that cuts the chain (DSpark's "draft long, let the scheduler cut", AdaSpec's
    verifier) or in an adaptive length policy — and K_max bounds it like any other length the policy
    picks; a search range reaching past K_max is a space, not a setting (tune's trials there run at
    K_max, as the presets' ranges up to 8 do under --k-max 4)."""
    if spec.length.policy not in FIXED_K_POLICIES or spec.verify.policy != "all":
        return
    fixed = spec.length.params.get("k")
    values = fixed if isinstance(fixed, list) else [fixed]
    too_long = [k for k in values if isinstance(k, int) and not isinstance(k, bool) and k > k_max]
    if too_long:
        raise InputError(f"{spec.name}: length.k {max(too_long)} is above K_max {k_max} (the longest draft chain "
                         "the engine verifies and the profile recorded); lower it or raise --k-max",
                         field="length.k")


def search_space(spec: StrategySpec) -> dict[str, SearchRange]:
    """The spec's search dimensions keyed by dotted field ("length.k")."""
    return {f"{kind}.{name}": rng for kind, params in spec.search.items() for name, rng in params.items()}


def apply_overrides(spec: StrategySpec, overrides: Mapping[str, Any]) -> StrategySpec:
    """A copy of `spec` with dotted fields set (an Optuna trial's values: {"length.k": 5}); validated."""
    data = spec.model_dump()
    for dotted, value in overrides.items():
        kind, _, name = dotted.partition(".")
        if kind not in (*SECTIONS, "execution") or not name:
            raise InputError(f"cannot override {dotted!r}: use <section>.<param>", field=dotted)
        data[kind][name] = value
    return spec_from_dict(data)


def spec_to_toml(spec: StrategySpec) -> str:
    """The spec as a preset file (load_preset reads it back to an equal spec)."""
    return tomli_w.dumps(spec.model_dump(mode="json", exclude_none=True))
