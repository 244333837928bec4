"""Synthetic generators: seeded, the requested mean rate, and the burstiness each one promises."""

from __future__ import annotations

import numpy as np
import pytest

from autospec.workloads.synthetic import (
    diurnal_arrivals,
    gamma_arrivals,
    lognormal_lengths,
    on_off_arrivals,
    poisson_arrivals,
    synthesize,
)


def cv_of(arrivals: np.ndarray) -> float:
    gaps = np.diff(arrivals)
    return float(gaps.std() / gaps.mean())


@pytest.mark.parametrize("generator", ["poisson", "gamma", "diurnal", "onoff"])
def test_seeded_and_in_range(generator):
    kwargs = dict(rate=5.0, duration_s=200.0, cv=2.0, period_s=50.0, domains={"code": 1, "math": 1})
    a = synthesize(generator, seed=1, **kwargs)
    assert a == synthesize(generator, seed=1, **kwargs)
    assert a != synthesize(generator, seed=2, **kwargs)
    arrival = a.column("arrival_s")
    assert np.all(arrival >= 0) and np.all(arrival < 200) and np.all(np.diff(arrival) >= 0)
    assert 0.7 * 1000 < len(a) < 1.3 * 1000  # mean rate 5/s over 200 s
    assert set(a.column("domain")) == {"code", "math"}
    assert a.column("prompt_len").min() >= 1 and a.column("output_len").min() >= 1


def test_poisson_and_gamma_cv():
    rng = np.random.default_rng(0)
    assert cv_of(poisson_arrivals(50.0, 200.0, rng)) == pytest.approx(1.0, rel=0.1)
    assert cv_of(gamma_arrivals(50.0, 3.0, 200.0, rng)) == pytest.approx(3.0, rel=0.2)
    assert cv_of(gamma_arrivals(50.0, 0.5, 200.0, rng)) == pytest.approx(0.5, rel=0.1)
    even = gamma_arrivals(2.0, 0.0, 10.0, rng)
    assert np.allclose(np.diff(even), 0.5)


def test_diurnal_follows_the_sine():
    rng = np.random.default_rng(0)
    arrivals = diurnal_arrivals(20.0, 1000.0, rng, amplitude=0.8, period_s=100.0)
    phase = (arrivals % 100.0) / 100.0
    high, low = np.sum(phase < 0.5), np.sum(phase >= 0.5)  # sin > 0 in the first half of each period
    assert high > 2 * low
    assert len(arrivals) == pytest.approx(20 * 1000, rel=0.05)


def test_on_off_is_bursty_with_the_mean_rate():
    rng = np.random.default_rng(0)
    arrivals = on_off_arrivals(10.0, 2000.0, rng, on_s=5.0, off_s=15.0)
    assert len(arrivals) == pytest.approx(10 * 2000, rel=0.2)
    assert cv_of(arrivals) > 1.5


def test_lognormal_mean():
    rng = np.random.default_rng(0)
    lengths = lognormal_lengths(200.0, 20_000, rng, sigma=1.0)
    assert lengths.dtype == np.int64 and lengths.min() >= 1
    assert lengths.mean() == pytest.approx(200.0, rel=0.05)


@pytest.mark.parametrize("kwargs, words", [
    (dict(generator="zipf"), "unknown generator"),
    (dict(rate=0.0), "rate"),
    (dict(duration_s=-1.0), "duration_s"),
    (dict(rate=1e6, duration_s=1e6), "more than"),
    (dict(generator="gamma", cv=-1.0), "cv"),
    (dict(generator="onoff", off_rate=5.0), "off_rate"),
])
def test_bad_arguments(kwargs, words):
    args = dict(generator="poisson", rate=1.0, duration_s=10.0) | kwargs
    with pytest.raises(ValueError, match=words):
        synthesize(args.pop("generator"), **args)
