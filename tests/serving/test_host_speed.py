"""The host-speed check (`autospec.profile.HostSpeedCheck`): a real replay measures the host it ran on,
and on a shared VM that host drifts; every torch run is bracketed by a check against the profile, and
evaluate, its CLI line, the report and the confirmation say when a run went outside 1 ± tolerance.

No test asserts a measured speed (a noisy host is the point): the ratios are checked for being
measured, and the flags for following the ratios, with the check's measurement replaced.
"""

from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest

from autospec import profile as profile_stage
from autospec.config import EngineSpec, PairSpec
from autospec.evaluate import EvaluateSpec, host_speed_summary, open_sim_replay, run_evaluate
from autospec.profile import HOST_SPEED_TOLERANCE, HostSpeedCheck, off_profile
from autospec.report.build import write_report
from autospec.serving.factory import build_engine
from autospec.serving.metrics import step_account, step_contexts, step_seconds, step_speed, uneven_repeats
from autospec.strategy import load_preset
from autospec.workloads.spec import load_workload

from autospec_testing import REPO
from stage_helpers import slowed_records, synthetic_workload, write_synthetic_run

PROFILE = REPO / "reports" / "ci-profile"  # a real profile + fit of the bundled pair, committed
WORKLOAD = synthetic_workload("host-speed", rate=20, duration_s=1, max_requests=4, prompt_tokens=24,
                              output_tokens=6, domains=False)


def test_the_check_times_a_profiled_shape_and_leaves_the_engine_empty(bundled_pair):
    engine = build_engine(PairSpec(), EngineSpec(k_max=8), 0.0)
    check = HostSpeedCheck.from_profile(engine, PROFILE)
    assert check is not None and (check.batch, check.tokens, check.context) == (8, 3, 128)
    lat = pd.read_parquet(PROFILE / "profile" / "latency.parquet")
    rows = lat[(lat.model == "target") & (lat.phase == "decode") & (lat.batch == 8) & (lat.tokens == 3)]
    nearest = rows.iloc[(rows.context - 128).abs().argmin()]
    assert check.profiled_s == pytest.approx(nearest.median_s)
    ratio = check()
    assert math.isfinite(ratio) and ratio > 0
    assert engine.active_ids() == []  # its requests are removed: a replay starts from an empty engine


def test_no_check_without_a_torch_profile_of_the_same_shape(tmp_path, bundled_pair, tiny_pair):
    engine = build_engine(PairSpec(), EngineSpec(k_max=8), 0.0)
    assert HostSpeedCheck.from_profile(engine, write_synthetic_run(tmp_path / "v", engine="vllm")) is None
    assert HostSpeedCheck.from_profile(engine, tmp_path / "nowhere") is None
    # another target shape than the profile's (its manifest's config.json): its steps cost something else
    other = build_engine(PairSpec(target=tiny_pair[0], draft=tiny_pair[1]), EngineSpec(k_max=8), 0.0)
    assert HostSpeedCheck.from_profile(other, PROFILE) is None


def test_the_flags_follow_the_ratios():
    assert not off_profile([1.0, 1.0 + HOST_SPEED_TOLERANCE * 0.9, 1.0 - HOST_SPEED_TOLERANCE * 0.9])
    assert off_profile([1.02, 1.0 + HOST_SPEED_TOLERANCE * 1.5]) and off_profile([1.0 - HOST_SPEED_TOLERANCE * 1.5])
    assert host_speed_summary({"no-sd": []}) is None
    quiet = host_speed_summary({"no-sd": [1.01, 0.97], "static-k2": []})
    assert quiet["disturbed"] is False and quiet["note"] is None and quiet["range"] == [0.97, 1.01]
    assert set(quiet["ratios"]) == {"no-sd"}
    drifted = host_speed_summary({"no-sd": [1.01, 1.19]})  # a shared VM's own drift: off its profile only
    assert drifted["off_profile"] is True and drifted["disturbed"] is False
    assert "outside 1 ± 0.10" in drifted["note"] and "judge the host, not the simulator" in drifted["note"]
    off = host_speed_summary({"no-sd": [1.01, 1.6]})
    assert off["disturbed"] is True and off["note"].startswith("measurements disturbed: the host ran 1.01-1.60x")
    assert host_speed_summary({"no-sd": [0.6]})["disturbed"] is True  # far faster than profiled: another machine
    assert quiet["off_profile"] is False


def test_the_prefill_probe_is_reported_and_named_but_flags_nothing():
    """vLLM's prefill probe (serving/vllm/speed_check.py) is reported beside the decode probe; off its
    profile it is named in the note, but it never marks the runs off profile or disturbed."""
    assert host_speed_summary({"no-sd": [1.0]})["prefill"] is None  # torch: no prefill probe
    within = host_speed_summary({"no-sd": [1.0, 1.02]}, {"no-sd": [0.95, 1.04], "static-k2": []})
    assert within["prefill"] == {"ratios": {"no-sd": [0.95, 1.04]}, "range": [0.95, 1.04]} and within["note"] is None
    fast = host_speed_summary({"no-sd": [1.0, 1.02]}, {"no-sd": [0.78, 0.83]})
    assert fast["off_profile"] is False and fast["disturbed"] is False
    assert fast["note"].startswith("the host prefilled at 0.78-0.83x the profiled prefill time")
    both = host_speed_summary({"no-sd": [1.01, 1.19]}, {"no-sd": [1.3]})
    assert both["off_profile"] is True
    assert "judge the host, not the simulator; the host prefilled at 1.30-1.30x" in both["note"]


def test_a_replay_brackets_each_run_and_the_check_does_not_change_it(tmp_path):
    (tmp_path / "w.toml").write_text(WORKLOAD)
    replay = open_sim_replay(PROFILE, load_workload(tmp_path / "w.toml"))
    calls = []

    def check() -> float:
        calls.append(1)
        return 1.25

    checked = dataclasses.replace(replay, speed_check=check)
    spec = load_preset("static-k2")
    plain, bracketed = replay.run(spec, 0), checked.run(spec, 0)
    assert plain.host_speed == [] and bracketed.host_speed == [1.25, 1.25] and len(calls) == 2
    pd.testing.assert_frame_equal(plain.requests_frame(), bracketed.requests_frame())


def test_a_disturbed_torch_evaluation_is_flagged_in_the_summary_and_the_report(tmp_path, bundled_pair, monkeypatch):
    (tmp_path / "w.toml").write_text(WORKLOAD)
    spec = EvaluateSpec(workload=tmp_path / "w.toml", strategies=["static-k2"], engine="torch", profile=PROFILE,
                        max_batch=2)
    quiet = run_evaluate(spec, None).summary["host_speed"]
    assert set(quiet["ratios"]) == {"no-sd", "static-k2"}  # measured around each run: before and after
    assert all(len(r) == 2 and all(x > 0 for x in r) for r in quiet["ratios"].values())
    monkeypatch.setattr(profile_stage.HostSpeedCheck, "__call__", lambda self: 1.6)
    run_evaluate(spec, tmp_path / "run")
    summary = (tmp_path / "run" / "eval" / "summary.json").read_text()
    assert '"disturbed": true' in summary and "1.60-1.60x the profiled step time" in summary
    write_report(tmp_path / "run")
    markdown = (tmp_path / "run" / "summary.md").read_text()
    assert "**Warning —** measurements disturbed: the host ran 1.60-1.60x the profiled step time" in markdown


def test_step_speed_sees_a_slow_spell_inside_a_run_and_the_odd_repeat_out():
    """The in-run check (metrics.step_speed) on a real simulator replay's steps: a host twice as slow over
    the last third of the run moves the run's step speed by that third's share of the plain steps' time,
    and `uneven_repeats` singles out that repeat among identical ones."""
    sim = open_sim_replay(PROFILE, load_workload(REPO / "workloads" / "bursty.toml").cap(40), k_max=8, max_batch=8)
    spec = load_preset("static-k2")
    records = sim.run(spec, 0)
    steps, requests = records.steps_frame(), records.requests_frame()
    clock = sim.step_clock(spec)
    base = step_speed(steps, requests, clock)
    # the simulator's steps against its own clock: 1 but for the draft's lag, which a padded engine (the
    # CI profile's torch engine) feeds and the clock of hypothetical requests does not know
    assert base is not None and base == pytest.approx(1.0, rel=0.05)
    since = 2 * len(steps) // 3
    slow = slowed_records(records, 2.0, since).steps_frame()
    plain = (steps["admitted"] == 0) & (steps["preempted"] == 0)
    durations = steps["end_s"] - steps["start_s"]
    share = durations[plain & (steps["step"] >= since)].sum() / durations[plain].sum()
    assert step_speed(slow, requests, clock) == pytest.approx(base * (1.0 + share))
    assert uneven_repeats([base, base * 1.02, step_speed(slow, requests, clock)], HOST_SPEED_TOLERANCE) == [2]
    # steps that admitted a request (prefill inside them on vLLM) do not count: the probe is the decode work
    admitting = steps.index[steps["admitted"] > 0]
    assert len(admitting) and len(admitting) < len(steps)
    stretched = steps.copy()
    stretched.loc[admitting, "end_s"] += 10.0
    assert step_speed(stretched, requests, clock) == pytest.approx(base)


def test_step_speed_prices_each_step_on_the_simulators_clock_for_its_strategy():
    """Each step's requests at their own contexts (step_contexts: they add up to the step's KV before it),
    priced by the clock the simulator charged them with: a no-SD replay's steps read 1 to rounding."""
    sim = open_sim_replay(PROFILE, load_workload(REPO / "workloads" / "bursty.toml").cap(40), k_max=8, max_batch=8)
    no_sd = load_preset("no-sd")
    records = sim.run(no_sd, 0)
    steps, requests = records.steps_frame(), records.requests_frame()
    contexts = step_contexts(steps, dict(zip(requests["req_id"], requests["prompt_len"])))
    assert [int(c.sum()) for c in contexts] == (steps["kv_tokens"] - steps["committed"]).tolist()
    assert step_speed(steps, requests, sim.step_clock(no_sd)) == pytest.approx(1.0, rel=2e-3)
    # a strategy that never drafts is priced on the plain engine's clock (vLLM's profile has one; the CI
    # profile's torch engine does not, so there both clocks are one), as the serving loop tells the simulator
    assert sim.step_clock(no_sd).__self__._speculative is False
    assert sim.step_clock(load_preset("static-k2")).__self__._speculative is True
    # only the simulator has a clock to price with
    assert dataclasses.replace(sim, probe=None).step_clock(no_sd) is None


def test_uneven_repeats_needs_two_speeds_and_ignores_unknown_ones():
    assert uneven_repeats([1.0], 0.1) == [] and uneven_repeats([None, 1.5], 0.1) == []
    assert uneven_repeats([1.0, None, 1.05, 1.02], 0.1) == []
    assert uneven_repeats([1.0, 1.3], 0.1) == [0, 1]  # two that disagree: neither is the reference
    assert uneven_repeats([0.7, 1.0, 1.02], 0.1) == [0]  # faster than its siblings is uneven too


def test_step_account_splits_a_replays_time_by_kind_of_step():
    """metrics.step_account on real simulator replays: no-SD commits one token per request per step and
    static-k2 more; a host twice as slow doubles every time figure and no count; longer admission steps
    move the admission figures and leave the plain ones alone."""
    sim = open_sim_replay(PROFILE, load_workload(REPO / "workloads" / "bursty.toml").cap(40), k_max=8, max_batch=8)
    assert step_account(sim.run(load_preset("no-sd"), 0).steps_frame())["plain_tokens_per_request"] == 1.0
    records = sim.run(load_preset("static-k2"), 0)
    steps = records.steps_frame()
    base = step_account(steps)
    assert 1.0 < base["plain_tokens_per_request"] <= 3.0 and 1.0 <= base["plain_batch"] <= 8
    assert 0.0 < base["admission_share"] < 1.0 and base["steps"] == int((steps["batch"] > 0).sum())
    slow = step_account(slowed_records(records, 2.0, 0).steps_frame())
    for key in ("plain_step_s", "admission_step_s", "s_per_token_plain", "s_per_token_admission"):
        assert slow[key] == pytest.approx(2.0 * base[key])
    for key in ("steps", "plain_batch", "plain_tokens_per_request", "admission_share"):
        assert slow[key] == base[key]
    # every admission step a second longer: it ends a second later and every later step starts later
    extra = (steps["admitted"] > 0).astype(float)
    stretched = steps.assign(start_s=steps["start_s"] + extra.cumsum() - extra, end_s=steps["end_s"] + extra.cumsum())
    longer = step_account(stretched)
    assert longer["admission_step_s"] == pytest.approx(base["admission_step_s"] + 1.0)
    assert longer["s_per_token_admission"] > base["s_per_token_admission"]
    assert longer["s_per_token_plain"] == pytest.approx(base["s_per_token_plain"])
    assert longer["plain_step_s"] == pytest.approx(base["plain_step_s"])


def test_a_steps_seconds_run_to_the_next_step_that_continues_its_batch():
    """vLLM records a step from schedule to update (t0..t1), leaving out the engine core's work before the
    next step, which the profile times; step_seconds counts that work in. A step followed by one of other
    requests (the engine went idle between them), and the last step, keep their own duration."""
    steps = pd.DataFrame({"start_s": [0.0, 0.012, 0.030, 0.100], "end_s": [0.010, 0.025, 0.041, 0.110],
                          "req_ids": [[1, 2], [2], [3], [3, 4]]})
    assert step_seconds(steps).tolist() == pytest.approx([0.012, 0.013, 0.070, 0.010])
    # the serving loop's steps (torch, simulator) follow each other: there the period is the step
    sim = open_sim_replay(PROFILE, load_workload(REPO / "workloads" / "bursty.toml").cap(20), k_max=8, max_batch=8)
    frame = sim.run(load_preset("static-k2"), 0).steps_frame()
    assert step_seconds(frame).to_numpy() == pytest.approx((frame["end_s"] - frame["start_s"]).to_numpy())
