"""Property tests (hypothesis) of every reader of user files and of autospec's own artifacts: whatever the
bytes, a reader returns a valid object or raises InputError — never another exception, never a hang.

The structured inputs start from a valid artifact and replace one value somewhere in it with an arbitrary
JSON value (or drop a key); the text inputs are arbitrary bytes and rows built from awkward cells. The
`autospec` command line maps InputError to its one-line, exit-code-2 refusal (tests/hostile/test_bad_files.py
checks that end to end).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autospec.errors import InputError, parse_json, parse_toml
from autospec.fit import fit_profile, load_fit, write_fit

from stage_helpers import synthetic_workload, write_synthetic_run

FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                       HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**20, 10**20)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)


def paths_of(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path (a tuple of keys / indices) to a value inside nested dicts and lists."""
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            out += paths_of(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data[:3]):  # a few elements of long lists are enough
            out += paths_of(value, (*prefix, i))
    return out


def one_change(data: st.DataObject, original: dict) -> dict:
    """`original` with one value somewhere replaced by an arbitrary JSON value, or one key dropped."""
    path = data.draw(st.sampled_from(paths_of(original)))
    return mutated(original, path, data.draw(json_values), data.draw(st.booleans()))


def mutated(data: dict, path: tuple, value: Any, drop: bool) -> dict:
    out = copy.deepcopy(data)
    target = out
    for part in path[:-1]:
        target = target[part]
    if drop and isinstance(target, dict):
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return out


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> Path:
    run = write_synthetic_run(tmp_path_factory.mktemp("fuzz"))
    write_fit(run, fit_profile(run))
    (run / "w.toml").write_text(synthetic_workload("fuzz", rate=4, duration_s=2, max_requests=6, prompt_tokens=16,
                                                   output_tokens=6, domains=False))
    return run


@FUZZ
@given(data=st.data())
def test_any_single_change_to_models_json_loads_or_is_an_input_error(fitted, tmp_path_factory, data):
    """A fit with one value changed either loads — and then drives the simulator to a finite, positive
    clock — or is refused naming models.json; it never raises anything else, hangs or runs a clock that
    stands still (the NaN and zero-cost fits that once hung `evaluate`)."""
    from autospec.evaluate import open_sim_replay
    from autospec.strategy import load_preset
    from autospec.workloads.spec import load_workload

    case = one_change(data, json.loads((fitted / "fit" / "models.json").read_text()))
    run = tmp_path_factory.mktemp("case")
    (run / "fit").mkdir()
    (run / "fit" / "models.json").write_text(json.dumps(case))
    (run / "profile").symlink_to(fitted / "profile")
    try:
        fit = load_fit(run)
    except InputError as exc:
        assert "models.json" in str(exc)
        return
    assert fit.clock_model.target.forward(100, 4) > 0
    try:
        replay = open_sim_replay(run, load_workload(fitted / "w.toml"), k_max=4)
    except InputError:
        return
    records = replay.run(load_preset("static-k2"), 0)
    finish = [r.finish_s for r in records.requests]
    assert finish and all(math.isfinite(t) and t > 0 for t in finish)


@pytest.fixture(scope="module")
def summary(fitted) -> dict:
    from autospec.evaluate import run_evaluate, spec_from_flags

    spec = spec_from_flags(workload=fitted / "w.toml", strategies=["static-k2"], engine="sim", profile=fitted,
                           k_max=4, capacity=None, shift=False)
    return json.loads(json.dumps(run_evaluate(spec, None).summary, default=str))  # as a file holds it


@FUZZ
@given(data=st.data())
def test_any_single_change_to_an_eval_summary_is_gated_or_refused(summary, tmp_path_factory, data):
    from autospec.gate import run_gate

    case = one_change(data, summary)
    root = tmp_path_factory.mktemp("gate")
    (root / "base.json").write_text(json.dumps(summary))
    (root / "cand.json").write_text(json.dumps(case))
    try:
        verdict = run_gate(root / "base.json", root / "cand.json")
    except InputError:
        return
    assert verdict.markdown().count("\n") >= 4


@FUZZ
@given(data=st.data())
def test_any_single_change_to_an_eval_summary_is_reported_or_refused(summary, tmp_path_factory, data):
    from autospec.report.build import build_sections, load_run, render_summary

    case = one_change(data, summary)
    root = tmp_path_factory.mktemp("report")
    (root / "eval").mkdir()
    (root / "eval" / "summary.json").write_text(json.dumps(case))
    try:
        run = load_run(root)
        build_sections(run)
        render_summary(run)
    except InputError as exc:
        assert "summary.json" in str(exc)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
def test_json_and_toml_text_parse_or_are_input_errors(text):
    for parse in (parse_json, parse_toml):
        try:
            parse(text, path="f")
        except InputError:
            pass


CELLS = ["", " ", "0", "1", "-1", "3", "1.5", "1e30", "9e18", "nan", "inf", "-inf", "x", '"', "2023-11-16 18:15:46",
         "2023-11-16 18:15:46+05:00", "2023-11-16T18:15:46Z", "1700000000", "\u00e9", ",,"]


@FUZZ
@given(rows=st.lists(st.lists(st.sampled_from(CELLS), min_size=1, max_size=5), min_size=0, max_size=6),
       header=st.sampled_from(["TIMESTAMP,ContextTokens,GeneratedTokens", "Timestamp,Request tokens,Response tokens",
                               "TIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens", ""]))
def test_csv_traces_load_or_are_input_errors(tmp_path_factory, rows, header):
    from autospec.workloads.loaders import load_trace

    path = tmp_path_factory.mktemp("trace") / "t.csv"
    path.write_text("\n".join([header, *(",".join(r) for r in rows)]) + "\n")
    try:
        trace = load_trace(path)
    except InputError as exc:
        assert "t.csv" in str(exc)
        return
    assert all(r.prompt_len >= 0 and r.output_len >= 1 for r in trace.requests())


@FUZZ
@given(content=st.binary(max_size=300) | st.lists(
    st.sampled_from(['{"prompt": "a"}', '{"prompt": 1}', '{"turns": []}', '[', '{"prompt_token_ids": [1, -2]}',
                     '{"question": "q"}', '"x"', '{}', 'null', '{"prompt": "' + "\u2028" + '"}']),
    max_size=5).map(lambda lines: "\n".join(lines).encode()))
def test_prompt_files_load_or_are_input_errors(tmp_path_factory, content):
    from autospec.workloads.prompts import load_prompts

    path = tmp_path_factory.mktemp("prompts") / "p.jsonl"
    path.write_bytes(content)
    try:
        prompts = load_prompts(path)
    except InputError as exc:
        assert "p.jsonl" in str(exc)
        return
    assert all(p.text or p.ids for p in prompts)


WORKLOAD_KEYS = {
    "generator": st.sampled_from(["poisson", "gamma", "diurnal", "onoff", "other"]),
    "rate": st.sampled_from([-1, 0, 1e-9, 0.5, 4.0, 1e12, float("nan")]),
    "duration_s": st.sampled_from([-1, 0, 1e-9, 2.0, 1e9]),
    "cv": st.sampled_from([0, 0.5, 3.0, 11.0, 1e6]),
    "on_s": st.sampled_from([1e-9, 0.5, 5.0]),
    "off_s": st.sampled_from([1e-9, 0.5, 15.0]),
    "period_s": st.sampled_from([1e-9, 1.0, 86400.0]),
    "mean_prompt_tokens": st.sampled_from([0, 1, 64, 1e12]),
    "mean_output_tokens": st.sampled_from([0, 1, 16]),
    "max_requests": st.sampled_from([0, 1, 50]),
    "seed": st.sampled_from([-1, 0, 2**40]),
    "time_scale": st.sampled_from([0, 1e-9, 1.0, 1e9]),
}


@FUZZ
@given(fields=st.fixed_dictionaries({}, optional=WORKLOAD_KEYS))
def test_synthetic_workload_specs_build_quickly_or_are_input_errors(tmp_path_factory, fields):
    """Every combination either builds (bounded: at most MAX_REQUESTS, in well under a second here) or
    is refused; none loops for ever or asks for terabytes (cv = 1e6, on/off periods of 1e-9 s did)."""
    import time

    import tomli_w

    from autospec.workloads.spec import load_workload

    path = tmp_path_factory.mktemp("workload") / "w.toml"
    body = {"name": "fuzz", "format": "synthetic", "prompts": [],
            **{k: v for k, v in fields.items() if not (isinstance(v, float) and math.isnan(v))}}
    path.write_text(tomli_w.dumps({"workload": body}))
    t0 = time.perf_counter()
    try:
        trace = load_workload(path)
    except InputError as exc:
        assert "w.toml" in str(exc)
        return
    assert len(trace) <= 5_000_000 and time.perf_counter() - t0 < 60
