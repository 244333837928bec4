"""Simulated shapes outside the profiled grid (autospec.serving.coverage): counted per dimension from the
records, read from the profile's measurements, and named in evaluate's summary, CLI and report."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from autospec.evaluate import EvaluateSpec, run_evaluate
from autospec.fit import profiled_grid
from autospec.serving.coverage import ProfiledGrid, outside_grid, outside_text

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "reports" / "ci-profile"  # a real profile + fit of the bundled pair, committed
BURSTY = REPO / "workloads" / "bursty.toml"


def _frames():
    steps = pd.DataFrame({"batch": [1, 4, 8, 12], "kv_tokens": [100, 800, 4000, 1200],
                          "k": [[2], [2, 2, 2, 2], [8] * 8, [0] * 12], "admitted": [1, 0, 3, 0]})
    requests = pd.DataFrame({"prompt_len": [64, 128, 600, 32]})
    return requests, steps


def test_each_dimension_counts_the_shapes_above_the_grid():
    requests, steps = _frames()
    grid = ProfiledGrid(decode_batch=8, decode_context=396, verify_tokens=9, prefill_batch=1, prefill_tokens=512)
    found = outside_grid(requests, steps, grid)
    assert found["fractions"] == {"batch": 0.25,  # batch 12 of 4 steps
                                  "context": 0.25,  # 4000 / 8 = 500 tokens per request
                                  "verify_tokens": 0.0,  # K + 1 = 9 is measured
                                  "prefill_batch": 0.5,  # 1 of the 2 admissions prefilled 3 prompts
                                  "prefill_tokens": 0.25}  # the 600-token prompt
    assert found["outside"]
    line = outside_text({"static-k2": found}, grid)
    assert line.startswith("simulator predictions outside the profiled grid")
    assert "static-k2: batch > 8 (25%)" in line and "> 1 prompts prefilled together (50%)" in line
    inside = outside_grid(requests, steps, ProfiledGrid(decode_batch=16, decode_context=1000, verify_tokens=9,
                                                        prefill_batch=4, prefill_tokens=1024))
    assert not inside["outside"] and outside_text({"static-k2": inside}, grid) is None
    # a dimension the profile did not measure is not judged
    assert outside_grid(requests, steps, ProfiledGrid())["fractions"] == {}


def test_the_grid_is_what_the_committed_profile_measured():
    grid = profiled_grid(PROFILE)
    latency = pd.read_parquet(PROFILE / "profile" / "latency.parquet")
    target = latency[latency["model"] == "target"]
    assert grid.decode_batch == target[target["phase"] == "decode"]["batch"].max() == 8
    assert grid.prefill_tokens == target[target["phase"] == "prefill"]["tokens"].max()
    assert grid.prefill_batch == 1  # the quick profile prefills one prompt at a time


@pytest.mark.parametrize("max_batch", [8, 16])
def test_evaluate_flags_a_batch_beyond_the_profile_and_only_then(tmp_path, max_batch):
    spec = EvaluateSpec(workload=BURSTY, strategies=["static-k2"], engine="sim", profile=PROFILE,
                        max_batch=max_batch, capacity=None)
    summary = run_evaluate(spec, tmp_path).summary
    outside = summary["outside_profile"]
    assert outside["grid"]["decode_batch"] == 8
    batch = {name: s["fractions"]["batch"] for name, s in outside["strategies"].items()}
    assert set(batch) == {"no-sd", "static-k2"}
    if max_batch == 8:
        assert all(v == 0 for v in batch.values())
    else:  # bursts fill more than 8 slots: those steps' times are extrapolated
        assert all(v > 0 for v in batch.values()) and "batch > 8" in outside["warning"]
    # bursts admit several prompts at once; the quick profile measured prefills one at a time
    assert all(s["fractions"]["prefill_batch"] > 0 for s in outside["strategies"].values())

