"""The profile's r axis: FASER piecewise fits recover a knee from synthetic latency over SM splits."""

from __future__ import annotations

import itertools

import numpy as np
import pandas as pd
import pytest

from autospec.fit import fit_latency
from autospec.latency import PiecewiseLatency, faser_eval
from autospec.profile import LATENCY_COLUMNS

SPLITS = [0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875]


def synthetic_profile(noise: float, seed: int = 0) -> pd.DataFrame:
    """Latency rows shaped like `measure_latency`'s on a GPU with --sm-split (knees at x = 0.5)."""
    target = PiecewiseLatency("target", (2e-5, 1e-4, 2e-3), (1.0, 1.2), (0.8, 0.55), 0.5)
    draft = PiecewiseLatency("draft", (3e-5, 1e-5, 4e-4), (1.0, 1.4), (0.6, 0.45), 0.5)
    rng = np.random.default_rng(seed)
    rows = []
    for r, b, ctx in itertools.product(SPLITS, [1, 4, 16, 64], [128, 512]):
        for s in range(1, 10):
            t = float(faser_eval(target, b, s, r)) * (1 + noise * rng.standard_normal())
            rows.append(("target", "decode", b, s, ctx, r, t))
        t = float(faser_eval(draft, b, 1, r)) * (1 + noise * rng.standard_normal())
        rows.append(("draft", "decode", b, 1, ctx, r, t))
    frame = pd.DataFrame(rows, columns=["model", "phase", "batch", "tokens", "context", "sm_split", "median_s"])
    frame["mad_s"] = 0.0
    frame["repeats"] = 5
    return frame[LATENCY_COLUMNS]


def test_piecewise_fit_over_the_r_axis_finds_the_knee():
    out = fit_latency(synthetic_profile(noise=0.0))
    for model in ("target", "draft"):
        pw = PiecewiseLatency.from_dict(out["piecewise"][model])
        assert pw.knee == pytest.approx(0.5)
        assert out["piecewise_mape"][model] < 1e-3


def test_piecewise_fit_with_noise_stays_within_faser_bounds():
    out = fit_latency(synthetic_profile(noise=0.03, seed=1))
    assert out["piecewise_mape"]["target"] < 0.08  # FASER: target 6–8 %
    assert out["piecewise_mape"]["draft"] < 0.18  # FASER: draft 16–17 %, all < 18 %


def test_cpu_profile_without_splits_fits_one_segment():
    frame = synthetic_profile(noise=0.0)
    frame = frame[frame["sm_split"] == 0.5].assign(sm_split=np.nan)
    out = fit_latency(frame)
    assert out["piecewise"]["target"]["knee"] is None
