"""benchmarks/vllm_probe_reference.py (issue 16): the prices it compares engines with, on the committed CI profile
and its fit, and its one-line refusal of a directory that is not a profiled, fitted run. (Its measurement
needs a vLLM profile of the host, minutes of engines; `benchmarks/results/vllm_probe_reference*.json` are
its runs.)"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from autospec.fit import load_fit

from autospec_testing import REPO
from benchmarks.vllm_probe_reference import fitted, fitted_draft, profile_row

PROFILE = REPO / "reports" / "ci-profile"


@pytest.fixture(scope="module")
def profiled():
    return pd.read_parquet(PROFILE / "profile" / "latency.parquet"), load_fit(PROFILE)


def test_the_clock_prices_the_profiled_target_passes_it_was_fitted_to(profiled):
    latency, fit = profiled
    rows = latency[(latency["model"] == "target") & (latency["phase"] == "decode")]
    ratios = np.array([fitted(fit, "static-k", int(r.batch), int(r.tokens), r.context) / r.median_s
                       for r in rows.itertuples()])
    # the context counted once per pass, as engines.sim does; summed over the pass's positions (Eq. 4's
    # form, the policies' model) it prices these rows 23% off at the median
    assert np.median(np.abs(ratios - 1)) < 0.08


def test_the_plain_price_needs_a_plain_engine_clock(profiled):
    _, fit = profiled
    assert fit.plain_target_clock is None  # a torch profile times no plain engine
    assert fitted(fit, "plain", 8, 1, 128.0) is None


def test_a_draft_round_is_its_passes_each_at_the_context_so_far(profiled):
    _, fit = profiled
    assert fit.draft_round_clock is None  # no round term on a torch profile: the passes alone
    draft = fit.clock_model.draft
    assert fitted_draft(fit, 4, 128.0, 3) == pytest.approx(sum(draft.forward(4 * (128 + j), 4, rows=4)
                                                                for j in range(3)))
    prices = [fitted_draft(fit, 4, 128.0, k) for k in (1, 2, 4, 8)]
    assert prices == sorted(prices) and prices[0] > 0


def test_the_row_read_is_the_nearest_context_at_the_shape(profiled):
    latency, _ = profiled
    rows = latency[(latency["model"] == "target") & (latency["phase"] == "decode") & (latency["batch"] == 4)
                   & (latency["tokens"] == 3)]
    nearest = rows.iloc[int(np.argmin(np.abs(rows["context"].to_numpy() - 130)))]
    assert profile_row(latency, "decode", 4, 3, 130) == pytest.approx(nearest["median_s"])
    assert profile_row(latency, "decode_plain", 4, 1, 130) is None


def test_a_directory_without_a_vllm_profile_is_one_line_and_writes_nothing(tmp_path):
    out = tmp_path / "out.json"
    for run_dir in (tmp_path / "missing", PROFILE):  # absent; a torch profile
        res = subprocess.run([sys.executable, "benchmarks/vllm_probe_reference.py", "--run-dir", str(run_dir),
                              "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().splitlines() == [
            f"error: {run_dir}: not a run directory with a vLLM latency profile and its fit"]
        assert not out.exists()
