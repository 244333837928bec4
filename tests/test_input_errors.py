"""`InputError.from_validation`: the one conversion of a pydantic ValidationError into the one-line
input error every command prints (file, dotted field, problem)."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autospec.config import SloSpec
from autospec.errors import InputError
from autospec.strategy import SpecFieldError


class Inner(BaseModel):
    model_config = ConfigDict(extra="forbid")
    k: int = Field(1, ge=0)


class Outer(BaseModel):
    model_config = ConfigDict(extra="forbid")
    inner: Inner = Inner()
    low: float = 0.0
    high: float = 1.0

    @model_validator(mode="after")
    def _ordered(self) -> "Outer":
        if self.low > self.high:
            raise ValueError("low must not exceed high")
        return self


class Blamed(BaseModel):
    x: int = 0

    @model_validator(mode="after")
    def _blame(self) -> "Blamed":
        if self.x < 0:
            raise SpecFieldError("length.k", "a cross-field problem names its own field")
        return self


def error_of(model: type[BaseModel], data: dict) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return info.value


def test_the_first_problem_names_its_dotted_field_and_the_file():
    err = InputError.from_validation(error_of(Outer, {"inner": {"k": -1}}), "run.toml")
    assert (err.path, err.field) == ("run.toml", "inner.k")
    assert "greater than or equal to 0" in err.problem
    assert str(err) == f"run.toml [inner.k]: {err.problem}"


def test_unknown_keys_value_errors_and_self_naming_causes_read_plainly():
    assert InputError.from_validation(error_of(Outer, {"inner": {"kk": 1}})).problem == "unknown key"
    assert InputError.from_validation(error_of(Outer, {"inner": {"kk": 1}})).field == "inner.kk"
    ordered = InputError.from_validation(error_of(Outer, {"low": 2.0}))
    assert ordered.problem == "low must not exceed high" and ordered.field is None  # no "Value error, "
    blamed = InputError.from_validation(error_of(Blamed, {"x": -1}), prefix="strategy")
    assert (blamed.field, blamed.problem) == ("strategy.length.k", "a cross-field problem names its own field")


def test_a_prefix_roots_the_field_and_further_problems_are_counted():
    err = InputError.from_validation(error_of(Outer, {"inner": {"k": -1}, "extra": 1, "low": "x"}),
                                     prefix="workload")
    assert err.field == "workload.inner.k"
    assert err.problem.endswith("(and 2 more problems)")
    one_more = InputError.from_validation(error_of(Outer, {"inner": {"k": -1}, "extra": 1}))
    assert one_more.problem.endswith("(and 1 more problem)")


def test_the_slo_default_is_one_and_positive():
    """The SLO's one default (run, evaluate and tune all take it); a non-positive SLO is refused."""
    assert SloSpec().model_dump() == {"ttft_s": 1.0, "tpot_s": 0.05}
    err = InputError.from_validation(error_of(SloSpec, {"tpot_s": 0}))
    assert err.field == "tpot_s" and "greater than 0" in err.problem
