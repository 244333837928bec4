"""benchmarks/vllm_engine_forms.py (issue 16): its comparison arithmetic on known step rows, its one-line
refusal of bad flags, and a short real run on vLLM-CPU writing every field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autospec_testing import REPO, assert_bench_refuses, needs_vllm
from benchmarks.vllm_engine_forms import compare


def _steps(period_s: float, draft_s: float, committed: list[int], n: int = 3) -> list[dict]:
    """`n` step-log rows of one cell: each step's period (to the next step's start) and its draft time."""
    return [{"t0": 10.0 * i, "t1": 10.0 * i + period_s / 2, "next_t0": 10.0 * i + period_s, "d": draft_s,
             "c": committed} for i in range(n)]


def test_the_ratios_compare_like_cells_and_the_summary_takes_their_median_over_batches():
    steps = {}
    for batch, scale in ((1, 1.0), (4, 2.0), (8, 3.0)):
        steps[("profiled", "random", 1, batch)] = _steps(0.010 * scale, 0.002 * scale, [1, 2])
        steps[("profiled", "predictable", 1, batch)] = _steps(0.010 * scale, 0.002 * scale, [2, 2])
        # the deployed engine: 10% slower outside its drafts at every batch, 20% at batch 8 (the odd one)
        slow = 1.2 if batch == 8 else 1.1
        steps[("deployed", "random", 1, batch)] = _steps(0.002 * scale + 0.008 * scale * slow, 0.002 * scale, [1, 1])
        steps[("deployed", "predictable", 1, batch)] = _steps(0.002 * scale + 0.008 * scale * slow, 0.002 * scale,
                                                              [2, 2])
    result = compare(steps, [1], [1, 4, 8])
    cell = result["per_k"]["1"]["4"]
    assert cell["cells"]["profiled/random"]["period_s"] == pytest.approx(0.020)
    assert cell["cells"]["profiled/random"]["outside_s"] == pytest.approx(0.016)
    assert cell["cells"]["profiled/random"]["committed"] == 1.5 and cell["cells"]["profiled/random"]["steps"] == 3
    assert cell["ratios"]["deployed/profiled (random)"]["outside_s"] == pytest.approx(1.1)
    assert cell["ratios"]["deployed/profiled (random)"]["draft_s"] == pytest.approx(1.0)
    assert cell["ratios"]["predictable/random (profiled)"]["period_s"] == pytest.approx(1.0)
    summary = result["summary"]["1"]
    assert summary["deployed/profiled (predictable)"]["outside_s"] == pytest.approx(1.1)  # the median, not 1.2
    assert summary["deployed/profiled (random)"]["period_s"] == pytest.approx(0.2 + 0.8 * 1.1)
    assert summary["committed"] == {"profiled/random": 1.5, "profiled/predictable": 2.0, "deployed/random": 1.0,
                                    "deployed/predictable": 2.0}


@pytest.mark.parametrize("args, says", [
    (["--ks", "1,9"], "--ks 9 exceeds --k-max 8"),
    (["--ks", "0"], "argument --ks: 0 is outside [1, 16]"),
    (["--context", "8"], "argument --context: 8 is outside [9, 2048]"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, args, says):
    assert_bench_refuses("vllm_engine_forms.py", args, says, tmp_path / "out.json")


@pytest.mark.slow
@needs_vllm
def test_a_short_run_on_vllm_times_every_cell_on_both_engine_forms(tmp_path):
    out = tmp_path / "forms.json"
    res = subprocess.run([sys.executable, "benchmarks/vllm_engine_forms.py", "--ks", "1", "--k-max", "2",
                          "--batches", "2", "--context", "32", "--repeats", "2", "--rounds", "1", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(out.read_text())
    # the engines vLLM resolved: the profile's (K_max, K set per step) and the static-K replay's
    assert result["engines"]["profiled"]["num_speculative_tokens"] == 2
    assert result["engines"]["deployed-k1"]["num_speculative_tokens"] == 1
    cells = result["per_k"]["1"]["2"]["cells"]
    assert set(cells) == {"profiled/random", "profiled/predictable", "deployed/random", "deployed/predictable"}
    for cell in cells.values():
        assert cell["period_s"] > cell["draft_s"] > 0 and cell["steps"] >= 1 and 1 <= cell["committed"] <= 2
    assert set(result["summary"]["1"]) == {"deployed/profiled (random)", "deployed/profiled (predictable)",
                                           "predictable/random (profiled)", "predictable/random (deployed)",
                                           "committed"}
