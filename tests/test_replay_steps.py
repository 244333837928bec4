"""benchmarks/vllm_replay_steps.py (issue 16): its per-batch step speeds and spreads on a simulator replay of
the committed CI profile, and its one-line refusal of a directory that is not an `autospec run` on vLLM.
(Its measurement starts a dozen vLLM engines, minutes; `benchmarks/results/vllm_replay_steps.json` is its
run.)"""

from __future__ import annotations

import pytest

from autospec.evaluate import open_sim_replay
from autospec.serving.metrics import step_speed
from autospec.strategy import load_preset
from autospec.workloads.spec import load_workload

from autospec_testing import REPO, assert_bench_refuses
from benchmarks.vllm_replay_steps import by_batch, spread
from stage_helpers import slowed_records

PROFILE = REPO / "reports" / "ci-profile"


def test_per_batch_step_speeds_are_the_runs_split_by_batch_size():
    """On the simulator's no-SD replay every batch size reads 1 against its own clock; a host slowed over the
    run's second half moves the batch sizes that ran then, and the whole run's step speed lies among them."""
    sim = open_sim_replay(PROFILE, load_workload(REPO / "workloads" / "bursty.toml").cap(40), k_max=8, max_batch=8)
    spec = load_preset("no-sd")
    records = sim.run(spec, 0)
    steps, requests, clock = records.steps_frame(), records.requests_frame(), sim.step_clock(spec)
    speeds = by_batch(steps, requests, clock)
    assert len(speeds) >= 3 and all(v == pytest.approx(1.0, rel=2e-3) for v in speeds.values())
    slow = slowed_records(records, 1.5, len(steps) // 2).steps_frame()
    slowed = by_batch(slow, requests, clock)
    assert set(slowed) == set(speeds) and max(slowed.values()) > 1.05
    assert min(slowed.values()) - 1e-9 <= step_speed(slow, requests, clock) <= max(slowed.values()) + 1e-9


def test_spread_is_relative_to_the_median_and_needs_two_values():
    assert spread([1.0]) is None and spread([]) is None
    assert spread([0.9, 1.0, 1.2]) == pytest.approx(0.3)


def test_a_directory_that_is_not_a_vllm_run_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out.json"
    torch_run = tmp_path / "torch-run"
    torch_run.mkdir()
    (torch_run / "config.toml").write_text(f'stages = ["profile"]\nworkload = "{REPO}/workloads/bursty.toml"\n'
                                           '[engine]\nkind = "torch"\n')
    cases = {tmp_path / "missing": f"{tmp_path / 'missing'}: not an autospec run directory (no config.toml)",
             PROFILE: f"{PROFILE}: not an autospec run directory (no config.toml)",
             torch_run: (f"{torch_run / 'config.toml'} [engine.kind]: its engine is 'torch': this compares vLLM "
                         "replays with a vLLM profile")}
    for run_dir, message in cases.items():
        assert_bench_refuses("vllm_replay_steps.py", ["--run-dir", str(run_dir)], message, out, usage=False)
