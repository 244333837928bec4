"""Strategy presets: every bundled preset loads and builds; broken files fail with file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from autospec.errors import InputError
from autospec.strategy import apply_overrides, build_strategy, list_presets, load_preset, presets_dir, search_space

EXPECTED = {"no-sd", "k-schedule", *(f"static-k{k}" for k in range(1, 9)), "adaspec", "adaspec-minus", "threshold",
            "gp-lcb", "dsde", "dspark", "dspark-async", "laps-sd", "las", "lp-sjf", "smartspec", "adaedl", "oracle",
            "oracle-m"}

GOOD = """
[strategy]
name = "mine"

[length]
policy = "static"
k = 3

[search.length.k]
type = "int"
low = 1
high = 8
"""


def test_all_expected_presets_are_bundled():
    assert set(list_presets()) == EXPECTED
    # in a checkout (editable install) the presets are read from the repo's policies/ itself
    assert presets_dir().resolve() == (Path(__file__).parents[2] / "policies").resolve()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_preset_loads_and_builds(name):
    spec = load_preset(name)
    assert spec.name == name and spec.strategy.description
    strategy = build_strategy(spec)
    assert strategy.length is not build_strategy(spec).length  # fresh policy state per build
    for key in search_space(spec):
        assert key.split(".")[0] in ("length", "verify", "schedule", "execution")


def test_preset_contents():
    assert load_preset("static-k5").length.params == {"k": 5}
    assert load_preset("no-sd").length.policy == "none"
    assert load_preset("adaspec").verify.policy == "adaspec"
    assert load_preset("adaspec-minus").verify.policy == "all"
    assert load_preset("dspark-async").verify.params["lag"] == 2
    assert load_preset("laps-sd").schedule.policy == "laps-sd"
    assert search_space(load_preset("static-k1"))["length.k"].high == 8


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "broken.toml"
    path.write_text(text)
    return path


def _error(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        load_preset(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    return info.value


def test_user_file_loads(tmp_path):
    spec = load_preset(_write(tmp_path, GOOD))
    assert spec.name == "mine" and spec.verify.policy == "all" and spec.schedule.policy == "fcfs"


def test_wrong_type(tmp_path):
    err = _error(_write(tmp_path, GOOD.replace("k = 3", 'k = "3"')))
    assert err.field == "length.k"
    err = _error(_write(tmp_path, GOOD + '\n[execution]\nearly_exit = "yes"\n'))
    assert err.field == "execution.early_exit"


def test_unknown_policy_name(tmp_path):
    err = _error(_write(tmp_path, GOOD.replace('policy = "static"', 'policy = "statik"')))
    assert err.field == "length.policy" and "statik" in err.problem and "static" in err.problem


def test_unknown_param(tmp_path):
    err = _error(_write(tmp_path, GOOD.replace("k = 3", "k = 3\nkk = 4")))
    assert err.field == "length.kk"


def test_inverted_search_range(tmp_path):
    err = _error(_write(tmp_path, GOOD.replace("low = 1", "low = 9")))
    assert err.field == "search.length.k" and "inverted" in err.problem


def test_search_problems(tmp_path):
    assert _error(_write(tmp_path, GOOD.replace("[search.length.k]", "[search.length.q]"))).field == \
        "search.length.q"
    # an int parameter cannot be searched as float
    bad_type = GOOD.replace('type = "int"\nlow = 1\nhigh = 8', 'type = "float"\nlow = 1.0\nhigh = 8.0')
    assert _error(_write(tmp_path, bad_type)).field == "search.length.k"
    # a range that leaves the parameter's allowed values (k >= 0)
    assert _error(_write(tmp_path, GOOD.replace("low = 1", "low = -2"))).field == "search.length.k"
    log_at_zero = GOOD.replace("low = 1", "low = 0\nlog = true")
    assert "log" in _error(_write(tmp_path, log_at_zero)).problem


def test_toml_syntax_error_has_line(tmp_path):
    err = _error(_write(tmp_path, GOOD.replace("k = 3", "k = ")))
    assert err.line == 7


def test_unknown_preset_name():
    with pytest.raises(InputError, match="unknown preset 'nope'.*static-k4"):
        load_preset("nope")


def test_apply_overrides_validates():
    spec = apply_overrides(load_preset("static-k4"), {"length.k": 6, "execution.sm_split": 0.3})
    assert spec.length.params["k"] == 6 and spec.execution.sm_split == 0.3
    with pytest.raises(InputError, match=r"\[length.k\]"):
        apply_overrides(spec, {"length.k": -1})
