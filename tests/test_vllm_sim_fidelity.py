"""benchmarks/vllm_sim_fidelity.py (issue 16): the error at the host's speed, which says how much of the
simulator's mean-TPOT error is the host moving between the profile and the replays. (Its measurement profiles
vLLM and replays on it, minutes; `benchmarks/results/vllm_sim_fidelity*.json` are its runs.)"""

from __future__ import annotations

import pytest

from benchmarks.vllm_sim_fidelity import at_host_speed


def row(strategy: str, sim: float, vllm: float) -> dict:
    return {"strategy": strategy, "sim_tpot_mean": sim, "vllm_tpot_mean": vllm,
            "err_tpot_mean": round(abs(sim - vllm) / vllm, 4)}


def test_the_error_at_the_hosts_speed_takes_out_the_drift_the_probe_read():
    """A simulator exactly right for its profile, replayed on a host the probe read 10% slow, errs 9.1% raw and
    0 at the host's speed; one that also under-prices by 5% keeps that 5%; the median of a strategy's readings
    is used (one wild reading does not move it); a strategy the probe never read has no such error."""
    rows = [row("no-sd", 0.010, 0.011), row("static-k2", 0.0095, 0.011), row("static-k4", 0.008, 0.010)]
    speed = {"ratios": {"no-sd": [1.08, 1.10, 1.12], "static-k2": [1.10, 1.10, 1.9, None]}}
    out = {r["strategy"]: r for r in at_host_speed(rows, speed)}
    assert out["no-sd"]["err_tpot_mean"] == pytest.approx(0.0909, abs=1e-4)
    assert out["no-sd"]["host_speed_median"] == pytest.approx(1.10)
    assert out["no-sd"]["err_tpot_mean_at_host_speed"] == pytest.approx(0.0, abs=1e-4)
    assert out["static-k2"]["host_speed_median"] == pytest.approx(1.10)
    assert out["static-k2"]["err_tpot_mean_at_host_speed"] == pytest.approx(0.05, abs=1e-4)
    assert out["static-k4"]["host_speed_median"] is None and out["static-k4"]["err_tpot_mean_at_host_speed"] is None
    assert out["static-k4"]["err_tpot_mean"] == rows[2]["err_tpot_mean"]  # the raw error is kept as it was
    assert [r["strategy"] for r in at_host_speed(rows, None)] == ["no-sd", "static-k2", "static-k4"]
