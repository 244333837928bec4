"""GPU telemetry: the no-GPU record, and the sampler's aggregation (with an injected sampling function)."""

from __future__ import annotations

import time

import pytest

from autospec import telemetry
from autospec.telemetry import TelemetrySampler, aggregate


def test_without_a_gpu_the_record_says_why(monkeypatch):
    monkeypatch.setattr(telemetry, "_nvml", lambda: (None, "NVML could not start: no driver"))
    rec = TelemetrySampler(interval_s=0.01).start().stop()
    assert rec == {"available": False, "reason": "NVML could not start: no driver"}
    snap = telemetry.snapshot()
    assert snap["available"] is False and snap["reason"]


def test_this_machine_record_is_well_formed():
    rec = TelemetrySampler(interval_s=0.05).start().stop()
    assert isinstance(rec["available"], bool)
    assert rec["available"] or rec["reason"]


def test_aggregate_per_gpu_and_metric():
    samples = [(0.0, [{"index": 0, "sm_clock_mhz": 1000, "utilization_gpu_pct": 10, "memory_used_bytes": 5,
                       "power_w": 100.0},
                      {"index": 1, "sm_clock_mhz": 500, "utilization_gpu_pct": 0, "memory_used_bytes": 1,
                       "power_w": 50.0}]),
               (0.5, [{"index": 0, "sm_clock_mhz": 2000, "utilization_gpu_pct": 30, "memory_used_bytes": 7,
                       "power_w": 300.0}]),
               (1.0, [{"index": 0, "sm_clock_mhz": 1500, "utilization_gpu_pct": 20, "memory_used_bytes": 6,
                       "power_w": None}])]
    gpus = aggregate(samples)
    assert [g["index"] for g in gpus] == [0, 1]
    g0 = gpus[0]["stats"]
    assert g0["sm_clock_mhz"] == {"n": 3, "mean": 1500.0, "min": 1000.0, "p50": 1500.0, "max": 2000.0}
    assert g0["utilization_gpu_pct"]["mean"] == pytest.approx(20.0)
    assert g0["power_w"]["n"] == 2 and g0["power_w"]["mean"] == pytest.approx(200.0)  # a missing reading skipped
    assert gpus[1]["stats"]["memory_used_bytes"]["max"] == 1.0


def test_sampler_thread_collects_and_survives_a_failing_read():
    calls = {"n": 0}

    def fake():
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("power counter not supported")
        return [{"index": 0, "sm_clock_mhz": 1400.0 + calls["n"], "utilization_gpu_pct": 50.0,
                 "memory_used_bytes": 1e9, "power_w": 250.0}]

    with TelemetrySampler(interval_s=0.005, sample_fn=fake) as s:
        time.sleep(0.1)
    rec = s.record()
    assert rec["available"] is True and rec["sample_errors"] == 1
    assert rec["samples"] == calls["n"] - 1 >= 3
    assert rec["gpus"][0]["stats"]["power_w"]["mean"] == 250.0
    assert len(rec["series"]) == rec["samples"] and rec["duration_s"] > 0


def test_evaluate_writes_eval_telemetry(tmp_path, tiny_pair):
    import json

    import pandas as pd

    from autospec.config import PairSpec
    from autospec.evaluate import EvaluateSpec, run_evaluate

    workload = tmp_path / "three.toml"
    workload.write_text("""
[workload]
name = "three"
format = "synthetic"
generator = "poisson"
rate = 50.0
duration_s = 10.0
max_requests = 3
mean_prompt_tokens = 8
mean_output_tokens = 4
max_prompt_tokens = 10
max_output_tokens = 5
prompts = []
seed = 3
""")
    spec = EvaluateSpec(workload=workload, strategies=["static-k2"], max_batch=2, k_max=4,
                        pair=PairSpec(target=tiny_pair[0], draft=tiny_pair[1]))
    run_evaluate(spec, tmp_path / "run")
    tele = json.loads((tmp_path / "run" / "eval" / "telemetry.json").read_text())
    assert isinstance(tele["available"], bool) and (tele["available"] or tele["reason"])
    steps = pd.read_parquet(tmp_path / "run" / "eval" / "steps.parquet")
    assert "early_exit_fraction" in steps.columns and (steps["early_exit_fraction"] == 0).all()
