"""Synthetic workloads: seeded arrival processes and lognormal lengths, returned as a Trace.

Every generator takes `rate` as the long-run mean request rate (requests/s), so two generators at the
same `rate` offer the same load and differ only in how bursty it is:

- `poisson`: exponential inter-arrivals (CV 1).
- `gamma`: gamma inter-arrivals with a given coefficient of variation `cv` (CV > 1 is burstier than
  Poisson, CV < 1 smoother, CV 0 evenly spaced).
- `diurnal`: a Poisson process whose rate follows `rate * (1 + amplitude * sin(2 pi t / period_s))`,
  drawn by thinning.
- `onoff`: alternating on and off periods of fixed lengths `on_s` and `off_s`, starting on; Poisson
  at `off_rate` while off and, while on, at the rate that makes the mean over a cycle `rate`. Fixed
  periods keep the offered load of a short benchmark steady from seed to seed; the bursts are still
  Poisson inside.

Lengths are lognormal with the given means (`sigma` is the spread of the underlying normal) and at
least one token. All randomness comes from one `numpy.random.Generator(seed)`, so a seed fixes the trace.
"""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from autospec.workloads._table import MAX_TOKENS
from autospec.workloads.trace import Trace

GENERATORS = ("poisson", "gamma", "diurnal", "onoff")
MAX_REQUESTS = 5_000_000  # a typo in rate or duration should fail fast, not fill memory
MAX_CV = 10.0  # the burstiest gamma process a spec may ask for (workloads.spec says why)
MAX_LENGTH_SIGMA = 4.0  # the widest lognormal length distribution a spec may ask for
MIN_CV = 1e-6  # below it a gamma's shape 1/cv² overflows: such a process is evenly spaced (cv 0)
MIN_PERIOD_S = 1e-3  # the shortest on or off period of an on/off process
MAX_PERIODS = 1_000_000  # on/off periods in one workload: the generator loops once per period


def poisson_arrivals(rate: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times in [0, duration_s) of a Poisson process."""
    return _renewal(lambda n: rng.exponential(1.0 / rate, n), rate, duration_s)


def gamma_arrivals(rate: float, cv: float, duration_s: float, rng: np.random.Generator) -> np.ndarray:
    """Arrival times of a renewal process with gamma inter-arrivals: mean 1/rate, coefficient of variation cv."""
    _check(cv >= 0 and math.isfinite(cv), f"cv must be >= 0, got {cv}")
    if cv < MIN_CV:
        return _renewal(lambda n: np.full(n, 1.0 / rate), rate, duration_s)
    shape = 1.0 / cv**2
    return _renewal(lambda n: rng.gamma(shape, 1.0 / (rate * shape), n), rate, duration_s)


def diurnal_arrivals(rate: float, duration_s: float, rng: np.random.Generator, *, amplitude: float = 0.5,
                     period_s: float = 86_400.0) -> np.ndarray:
    """Poisson arrivals whose rate swings sinusoidally by +-amplitude around `rate` with the given period."""
    _check(0 <= amplitude <= 1, f"amplitude must be in [0, 1], got {amplitude}")
    _check(period_s > 0, f"period_s must be > 0, got {period_s}")
    peak = rate * (1 + amplitude)
    candidates = poisson_arrivals(peak, duration_s, rng)
    current = rate * (1 + amplitude * np.sin(2 * np.pi * candidates / period_s))
    return candidates[rng.random(len(candidates)) * peak < current]


def on_off_arrivals(rate: float, duration_s: float, rng: np.random.Generator, *, on_s: float = 5.0,
                    off_s: float = 15.0, off_rate: float = 0.0) -> np.ndarray:
    """Bursts: Poisson arrivals during on periods, fewer (`off_rate`) in between; mean rate `rate`."""
    _check(on_s > 0 and off_s > 0, f"on_s and off_s must be > 0, got {on_s} and {off_s}")
    _check(0 <= off_rate <= rate, f"off_rate must be in [0, rate], got {off_rate}")
    on_rate = (rate * (on_s + off_s) - off_rate * off_s) / on_s
    pieces, t, on = [], 0.0, True
    while t < duration_s:
        length = min(on_s if on else off_s, duration_s - t)
        level = on_rate if on else off_rate
        if level > 0:
            pieces.append(t + poisson_arrivals(level, length, rng))
        t, on = t + length, not on
    return np.concatenate(pieces) if pieces else np.empty(0)


def lognormal_lengths(mean: float, n: int, rng: np.random.Generator, sigma: float = 0.8) -> np.ndarray:
    """`n` whole token counts >= 1 from a lognormal with mean `mean`."""
    _check(mean >= 1, f"mean length must be >= 1, got {mean}")
    _check(sigma >= 0, f"length sigma must be >= 0, got {sigma}")
    mu = math.log(mean) - sigma**2 / 2  # E[lognormal] = exp(mu + sigma^2 / 2)
    # clipped at MAX_TOKENS: a wide distribution's far tail must not overflow int64
    return np.clip(np.rint(rng.lognormal(mu, sigma, n)), 1, MAX_TOKENS).astype(np.int64)


def synthesize(generator: str, *, rate: float, duration_s: float, seed: int = 0, cv: float = 1.0,
               amplitude: float = 0.5, period_s: float = 86_400.0, on_s: float = 5.0, off_s: float = 15.0,
               off_rate: float = 0.0, mean_prompt_tokens: float = 256.0, mean_output_tokens: float = 128.0,
               length_sigma: float = 0.8, domains: Mapping[str, float] | None = None, name: str = "") -> Trace:
    """A synthetic trace: arrivals from `generator`, lognormal lengths, domains drawn by weight.

    `domains` maps domain → relative weight (default: all chat). Arguments a generator does not use
    are ignored (cv is gamma's, amplitude and period_s diurnal's, on_s/off_s/off_rate onoff's).
    """
    _check(generator in GENERATORS, f"unknown generator {generator!r}; expected one of {', '.join(GENERATORS)}")
    _check(rate > 0 and math.isfinite(rate), f"rate must be > 0, got {rate}")
    _check(duration_s > 0 and math.isfinite(duration_s), f"duration_s must be > 0, got {duration_s}")
    _check(rate * duration_s <= MAX_REQUESTS, f"rate x duration_s asks for more than {MAX_REQUESTS:,} requests")
    rng = np.random.default_rng(seed)
    if generator == "poisson":
        arrivals = poisson_arrivals(rate, duration_s, rng)
    elif generator == "gamma":
        arrivals = gamma_arrivals(rate, cv, duration_s, rng)
    elif generator == "diurnal":
        arrivals = diurnal_arrivals(rate, duration_s, rng, amplitude=amplitude, period_s=period_s)
    else:
        arrivals = on_off_arrivals(rate, duration_s, rng, on_s=on_s, off_s=off_s, off_rate=off_rate)
    n = len(arrivals)
    prompt_len = lognormal_lengths(mean_prompt_tokens, n, rng, length_sigma)
    output_len = lognormal_lengths(mean_output_tokens, n, rng, length_sigma)
    return Trace.from_arrays(arrivals, prompt_len, output_len, _draw_domains(domains, n, rng),
                             name=name or f"synthetic-{generator}")


def _draw_domains(domains: Mapping[str, float] | None, n: int, rng: np.random.Generator) -> list[str]:
    if not domains:
        return ["chat"] * n
    names = sorted(domains)  # sorted: the draw must not depend on the order keys were written in
    weights = np.array([domains[d] for d in names], dtype=float)
    _check(bool(np.all(weights >= 0)) and weights.sum() > 0, "domain weights must be >= 0 and not all 0")
    return list(np.array(names, dtype=object)[rng.choice(len(names), size=n, p=weights / weights.sum())])


def _renewal(draw, rate: float, duration_s: float) -> np.ndarray:
    """Cumulative sums of inter-arrival draws, extended in chunks until they pass `duration_s`."""
    _check(rate > 0, f"rate must be > 0, got {rate}")
    expected = rate * duration_s
    chunk = int(expected + 5 * math.sqrt(expected) + 16)
    times = np.cumsum(draw(chunk))
    while times[-1] < duration_s:
        times = np.concatenate([times, times[-1] + np.cumsum(draw(chunk))])
    return times[times < duration_s]


def _check(condition: bool, message: str) -> None:
    # Arguments usually come from a workload spec, which validates them first; this guards direct calls.
    if not condition:
        raise ValueError(message)
