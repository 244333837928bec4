"""`autospec evaluate` end to end on the torch engine, its prompt handling and its bad-input contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from autospec.config import PairSpec
from autospec.evaluate import HEADLINE, _torch_prompts
from autospec.workloads.trace import Trace

AUTOSPEC = [sys.executable, "-m", "autospec.cli"]

WORKLOAD = """
[workload]
name = "five"
format = "synthetic"
generator = "poisson"
rate = 50.0
duration_s = 10.0
max_requests = 5
mean_prompt_tokens = 12
mean_output_tokens = 6
max_prompt_tokens = 16
max_output_tokens = 8
prompts = []
seed = 3
"""


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*AUTOSPEC, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.fixture
def workload(tmp_path) -> Path:
    path = tmp_path / "five.toml"
    path.write_text(WORKLOAD)
    return path


def test_evaluate_smoke_writes_the_three_files(tmp_path, workload, tiny_pair):
    target, draft = tiny_pair
    out = tmp_path / "run"
    res = run_cli("evaluate", "--workload", str(workload), "--strategies", "static-k2,las", "--engine", "torch",
                  "--out", str(out), "--repeats", "2", "--max-batch", "2", "--k-max", "4",
                  "--target", str(target), "--draft", str(draft))
    assert res.returncode == 0, res.stderr
    assert "decode" in res.stdout and "×no-SD" in res.stdout  # the rich table, strategies as rows
    summary = json.loads((out / "eval" / "summary.json").read_text())
    assert summary["schema_version"] == 1
    assert set(summary["strategies"]) == {"no-sd", "static-k2", "las"}
    assert summary["baseline"] == "no-sd"
    # the one SLO default, `autospec run`'s (config.SloSpec)
    assert summary["engine"]["kind"] == "torch" and summary["slo"] == {"ttft_s": 1.0, "tpot_s": 0.05}
    assert summary["workload"]["requests"] == 5
    for name, metrics in summary["strategies"].items():
        for key in HEADLINE:
            assert set(metrics[key]) == {"mean", "ci_low", "ci_high"}, (name, key)
        assert metrics["throughput_tok_s"]["ci_low"] <= metrics["throughput_tok_s"]["mean"] \
            <= metrics["throughput_tok_s"]["ci_high"]
    for ratio in ("throughput_vs_no_sd", "tpot_speedup_vs_no_sd", "e2e_speedup_vs_no_sd"):
        assert summary["strategies"]["no-sd"][ratio]["mean"] == pytest.approx(1.0)
    assert summary["strategies"]["static-k2"]["capacity_rps"]["mean"] is None and summary["capacity"] is None
    assert summary["shift"] is None and "simulator only" in summary["shift_skipped"]
    assert summary["outside_profile"] is None  # a real engine measures every shape it runs
    assert summary["host_speed"] is None  # no --profile: no profiled speed to check the host against
    assert summary["strategies"]["no-sd"]["acceptance_rate"]["mean"] is None
    assert 0.0 <= summary["strategies"]["static-k2"]["acceptance_rate"]["mean"] <= 1.0

    requests = pd.read_parquet(out / "eval" / "requests.parquet")
    steps = pd.read_parquet(out / "eval" / "steps.parquet")
    assert len(requests) == 3 * 2 * 5  # strategies × repeats × requests
    assert set(requests["strategy"]) == {"no-sd", "static-k2", "las"} and set(requests["repeat"]) == {0, 1}
    assert (requests["output_len"] == requests["max_tokens"]).all()
    assert {"start_s", "end_s", "batch", "k", "l", "accepted", "draft_s", "verify_s"} <= set(steps.columns)
    assert steps["batch"].max() <= 2
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["strategies"] == ["static-k2", "las"]
    assert str(workload) in manifest["inputs"]


def test_trace_text_is_tokenized_and_clipped_or_padded_to_prompt_len(bundled_pair):
    trace = Trace(pd.DataFrame({"arrival_s": [0.0, 0.1], "prompt_len": [3, 40], "output_len": [4, 4],
                                "domain": ["code", "code"], "prompt": ["def add(a, b):", "x = 1"],
                                "source_id": ["a", "b"]}))
    prompts = _torch_prompts(trace, engine=None, pair=PairSpec())
    assert [len(p) for p in prompts] == [3, 40]
    from autospec.serving.factory import load_tokenizer

    ids = load_tokenizer(bundled_pair[0]).encode("x = 1", add_special_tokens=False)
    assert prompts[1][: len(ids)] == ids and prompts[1][len(ids): 2 * len(ids)] == ids  # cycled


@pytest.mark.parametrize("case", ["unknown_strategy", "missing_workload", "sim_without_profile"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, workload, case):
    args = {"unknown_strategy": ["--workload", str(workload), "--strategies", "static-k2,no-such-preset"],
            "missing_workload": ["--workload", str(tmp_path / "nope.toml"), "--strategies", "static-k2"],
            "sim_without_profile": ["--workload", str(workload), "--strategies", "static-k2", "--engine", "sim"]}[case]
    out = tmp_path / "run"
    res = run_cli("evaluate", *args, "--out", str(out))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert not out.exists()
