"""Capacity at the SLO (autospec.serving.capacity): the search brackets the crossing it reports, and on
the simulator the reported bracket is what a replay at those loads measures."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autospec.evaluate import RELATIVE, EvaluateSpec, open_sim_replay, relative_to_baseline, run_evaluate
from autospec.serving.capacity import (
    CapacitySpec,
    attainment,
    capacity_search,
    mean_rate,
    replay_capacity,
    scaled_requests,
)
from autospec.strategy import load_preset
from autospec.workloads.spec import load_workload

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "reports" / "ci-profile"  # a real profile + fit of the bundled pair, committed
BURSTY = REPO / "workloads" / "bursty.toml"


def step_curve(crossing: float, calls: list[float]):
    """Attainment 1 below `crossing`, 0.5 above: a load the engine stops keeping up with."""

    def at(scale: float) -> float:
        calls.append(scale)
        return 1.0 if scale <= crossing else 0.5

    return at


@pytest.mark.parametrize("crossing", [0.03, 0.3, 1.0, 1.7, 5.0, 40.0])
def test_the_search_brackets_the_crossing_within_the_tolerance(crossing):
    calls: list[float] = []
    found = capacity_search(step_curve(crossing, calls), base_rate_rps=2.0, spec=CapacitySpec(rel_tol=0.02))
    assert found.status == "found"
    assert found.scale <= crossing < found.scale_fail
    assert found.scale_fail / found.scale <= 1.02 + 1e-12
    assert found.rps == pytest.approx(2.0 * found.scale)
    assert [p[0] for p in found.probes] == calls  # every replay is recorded, in order
    assert len(calls) <= 16  # bracketing by doubling, then bisection in log-rate


def test_a_load_that_never_meets_the_slo_has_capacity_zero_and_one_that_always_does_is_a_lower_bound():
    never = capacity_search(lambda s: 0.2, base_rate_rps=3.0, spec=CapacitySpec(max_scale=16))
    assert never.status == "below_range" and never.rps == 0.0 and never.scale == 0.0
    assert min(p[0] for p in never.probes) == pytest.approx(1 / 16)
    always = capacity_search(lambda s: 1.0, base_rate_rps=3.0, spec=CapacitySpec(max_scale=16))
    assert always.status == "above_range" and always.scale == 16 and always.rps == pytest.approx(48.0)
    assert always.scale_fail is None


def test_the_target_decides_what_passes():
    curve = lambda s: 1.0 - 0.1 * s  # noqa: E731  attainment falls with load: 0.9 at s=1, 0.5 at s=5
    loose = capacity_search(curve, 1.0, CapacitySpec(target=0.5, rel_tol=0.01))
    strict = capacity_search(curve, 1.0, CapacitySpec(target=0.9, rel_tol=0.01))
    assert loose.scale == pytest.approx(5.0, rel=0.011) and strict.scale == pytest.approx(1.0, rel=0.011)


def wobbly(scale: float) -> float:
    """A non-monotone attainment curve (a burst landing differently): the search's path depends on
    every answer, so parallel probing must follow it exactly."""
    return 0.95 - 0.12 * math.log(scale) + 0.06 * math.sin(7 * scale)


@pytest.mark.parametrize("width", [2, 3, 7])
@pytest.mark.parametrize("curve", [wobbly, lambda s: 0.2, lambda s: 1.0, step_curve(0.3, []), step_curve(9.0, [])])
def test_parallel_probes_give_the_serial_search_exactly(curve, width):
    serial = capacity_search(curve, 2.0, CapacitySpec(rel_tol=0.01, max_scale=32))
    rounds: list[list[float]] = []

    def at_once(scales: list[float]) -> list[float]:
        rounds.append(scales)
        assert 1 <= len(scales) <= width and len(set(scales)) == len(scales)
        return [curve(s) for s in scales]

    parallel = capacity_search(lambda s: pytest.fail("asked serially"), 2.0, CapacitySpec(rel_tol=0.01, max_scale=32),
                               attainments=at_once, width=width)
    assert parallel == serial  # scale, bracket, status and the probes on the path, in order
    assert len(rounds) <= len(serial.probes)
    if width >= 3 and len(serial.probes) >= 3:  # both outcomes of the next probe covered: two levels a round
        assert len(rounds) < len(serial.probes)
    probed = [s for r in rounds for s in r]
    assert len(probed) == len(set(probed))  # no scale replayed twice


@pytest.fixture(scope="module")
def replay():
    trace = load_workload(BURSTY).cap(120)
    return open_sim_replay(PROFILE, trace, k_max=8, max_batch=8)


def test_scaled_requests_keep_order_and_lengths_and_scale_the_rate(replay):
    fast = scaled_requests(replay.requests, 2.5)
    assert [r.req_id for r in fast] == [r.req_id for r in replay.requests]
    assert [r.max_tokens for r in fast] == [r.max_tokens for r in replay.requests]
    assert mean_rate(fast) == pytest.approx(2.5 * mean_rate(replay.requests))


@pytest.mark.parametrize("name", ["no-sd", "static-k2"])
def test_on_the_simulator_the_reported_bracket_is_what_replays_measure(replay, name):
    spec = CapacitySpec(rel_tol=0.05)
    strategy = load_preset(name)
    found = replay_capacity(replay, strategy, seed=0, spec=spec)
    assert found.status == "found", found
    at = lambda s: attainment(replay.run(strategy, 0, requests=scaled_requests(replay.requests, s)),  # noqa: E731
                              replay.slo)
    assert at(found.scale) >= spec.target > at(found.scale_fail)
    assert found.rps == pytest.approx(found.scale * mean_rate(replay.requests))


def test_capacity_in_forked_processes_is_the_serial_one(replay):
    strategy = load_preset("static-k2")
    own = replay.run(strategy, 0)
    serial = replay_capacity(replay, strategy, 0, CapacitySpec(rel_tol=0.05), at_own_load=own)
    assert replay_capacity(replay, strategy, 0, CapacitySpec(rel_tol=0.05), at_own_load=own, jobs=3) == serial


def test_sd_buys_capacity_on_the_simulator_of_the_bundled_pair(replay):
    """The metric moves with what SD does: on the committed profile (drafting pays at these batch sizes,
    docs: oracle_bound) static-k2's capacity exceeds no-SD's, where open-loop throughput at the
    workload's own load cannot tell them apart."""
    no_sd = replay_capacity(replay, load_preset("no-sd"), 0)
    k2 = replay_capacity(replay, load_preset("static-k2"), 0)
    assert k2.rps > no_sd.rps * 1.05


def test_relative_metrics_are_better_than_no_sd_above_one():
    base = {"capacity_rps": 4.0, "tpot_mean": 0.02, "tpot_p50": 0.02, "tpot_p99": 0.04, "e2e_mean": 2.0,
            "throughput_tok_s": 100.0}
    one = {"capacity_rps": 6.0, "tpot_mean": 0.01, "tpot_p50": 0.01, "tpot_p99": 0.05, "e2e_mean": 1.0,
           "throughput_tok_s": 101.0}
    rel = relative_to_baseline(one, base)
    assert set(rel) == set(RELATIVE)
    assert rel["capacity_vs_no_sd"] == pytest.approx(1.5) and rel["tpot_speedup_vs_no_sd"] == pytest.approx(2.0)
    assert rel["tpot_p99_speedup_vs_no_sd"] == pytest.approx(0.8) and rel["e2e_speedup_vs_no_sd"] == 2.0
    assert relative_to_baseline({**one, "capacity_rps": None}, base)["capacity_vs_no_sd"] is None
    assert all(v == pytest.approx(1.0) for v in relative_to_baseline(base, base).values())


def test_evaluate_on_the_simulator_reports_capacity_and_its_probes(tmp_path):
    res = subprocess.run([sys.executable, "-m", "autospec.cli", "evaluate", "--workload", str(BURSTY), "--engine",
                          "sim", "--profile", str(PROFILE), "--strategies", "static-k2", "--out",
                          str(tmp_path / "run"), "--capacity-target", "0.8"],
                         capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert res.returncode == 0, res.stderr
    assert "capacity" in res.stdout and "static-k2" in res.stdout
    summary = json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())
    assert summary["capacity"]["spec"]["target"] == 0.8
    for name in ("no-sd", "static-k2"):
        cap = summary["strategies"][name]["capacity_rps"]["mean"]
        (run,) = summary["capacity"]["strategies"][name]
        assert cap == pytest.approx(run["rps"]) and cap > 0
        assert any(a >= 0.8 for _, a in run["probes"]) and any(a < 0.8 for _, a in run["probes"])
    ratio = summary["strategies"]["static-k2"]["capacity_vs_no_sd"]["mean"]
    caps = [summary["strategies"][n]["capacity_rps"]["mean"] for n in ("static-k2", "no-sd")]
    assert ratio == pytest.approx(caps[0] / caps[1])
    assert math.isfinite(summary["strategies"]["static-k2"]["tpot_speedup_vs_no_sd"]["mean"])
    # and every strategy at ±30% load and prompt mix (autospec.serving.shift), its best per point printed
    assert set(summary["shift"]["mix"][0]["strategies"]) == {"no-sd", "static-k2"}
    assert "±30% shifts" in res.stdout
    # --jobs 3: the probes replayed ahead in forked processes, the same capacities, probes and shift table
    res3 = subprocess.run([sys.executable, "-m", "autospec.cli", "evaluate", "--workload", str(BURSTY), "--engine",
                           "sim", "--profile", str(PROFILE), "--strategies", "static-k2", "--out",
                           str(tmp_path / "run3"), "--capacity-target", "0.8", "--jobs", "3"],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "200"})
    assert res3.returncode == 0, res3.stderr
    summary3 = json.loads((tmp_path / "run3" / "eval" / "summary.json").read_text())
    assert summary3["capacity"] == summary["capacity"] and summary3["shift"] == summary["shift"]


def test_no_shift_leaves_the_shift_table_out_and_keeps_capacity(tmp_path):
    res = subprocess.run([sys.executable, "-m", "autospec.cli", "evaluate", "--workload",
                          str(REPO / "workloads" / "poisson.toml"), "--engine", "sim", "--profile", str(PROFILE),
                          "--strategies", "static-k2", "--no-shift", "--out", str(tmp_path / "run")],
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    summary = json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())
    assert summary["shift"] is None and summary["shift_skipped"] == "not asked for (--no-shift)"
    assert summary["capacity"] is not None and "±30% shifts" not in res.stdout


def test_evaluate_without_capacity_skips_the_search(tmp_path):
    spec = EvaluateSpec(workload=BURSTY, strategies=["static-k2"], engine="sim", profile=PROFILE, capacity=None)
    summary = run_evaluate(spec, None).summary
    assert summary["capacity"] is None and summary["shift"] is None  # the mix shift is a capacity search
    assert summary["strategies"]["static-k2"]["capacity_rps"]["mean"] is None
    res = subprocess.run([sys.executable, "-m", "autospec.cli", "evaluate", "--workload", str(BURSTY), "--engine",
                          "sim", "--profile", str(PROFILE), "--strategies", "static-k2", "--no-capacity", "--out",
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())["capacity"] is None


def test_the_first_probe_reuses_a_run_at_the_workloads_own_load(replay):
    """evaluate and tune pass the records they already have at 1x: the same capacity, one replay fewer."""
    strategy = load_preset("static-k2")
    own = replay.run(strategy, 0)
    assert replay_capacity(replay, strategy, 0, at_own_load=own) == replay_capacity(replay, strategy, 0)
