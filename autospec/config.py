"""Settings as pydantic models: the same models validate CLI flags, TOML files and run artifacts.

A run config TOML has one table per model below (`[pair]`, `[engine]`, `[generate]`); every table and
key is optional and falls back to the embedded default (the bundled pair on the torch engine over the
bundled prompt domains). Unknown keys are errors, so a typo never silently falls back to a default.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Literal

import tomli_w
from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


class RunSpec(_Model):
    schema_version: int = SCHEMA_VERSION
    pair: PairSpec = PairSpec()
    engine: EngineSpec = EngineSpec()
    generate: GenerateSpec = GenerateSpec()


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
    return spec


def _resolve(base: Path, p: Path) -> Path:
    return p if p.is_absolute() else (base / p)


def dump_run_spec(spec: RunSpec) -> str:
    data = spec.model_dump(mode="json", exclude_none=True)
    return tomli_w.dumps(data)
