"""Capacity at the SLO: the highest arrival rate at which a strategy still serves the workload within it.

The metric serving papers and `vllm bench sweep serve_sla` report, and the one that tells a user what
SD buys at *their* SLO: an open-loop replay's throughput is set by the arrival rate, so at a load the
engine keeps up with every strategy "has" the same throughput, and goodput at one overloaded rate
rewards whoever drops the fewest requests. Capacity asks instead how far the load can rise.

Definition:
* The load is a scale s of the workload's own arrival process: request i arrives at arrival_s[i] / s
  (s = 2 is the same trace twice as fast; burstiness, lengths and order are kept). Its rate is
  s × the trace's mean rate (requests / time from 0 to the last arrival).
* attainment(s) = the fraction of requests that meet the SLO (`metrics.meets_slo`) in one replay at s.
* capacity = the highest s with attainment(s) ≥ `target` (default 0.9), reported as requests/s and as
  the scale, with its bracket: `scale` passes and `scale_fail` (the next rate probed above it) does not.

Search [chosen]: bracket, then bisect in log-rate. From s = 1 the scale doubles while attainment
passes (or halves while it fails) until the bracket [pass, fail] is found, then is bisected until
fail/pass ≤ 1 + `rel_tol` (default 0.02). Every probe (s, attainment) is kept: the attainment-vs-rate
points a report plots.

Attainment on a finite trace is not strictly monotone in the rate (a burst may land differently), and
this search does not smooth it: it brackets one crossing — the one reached from the trace's own rate
— and reports the last scale that passed below a scale that failed. A rate above the bracket may pass
again by chance; the probes show it when the search met one.

Limits [chosen]: scales from 1/`max_scale` to `max_scale` (default 64). When even the lowest load
fails, the capacity is 0 with `status = "below_range"` (the SLO is out of reach at any load this
search tried: e.g. one request alone exceeds the TPOT SLO); when the highest passes, the capacity is
reported as that rate with `status = "above_range"` (a lower bound). A probe is one full replay, so
one capacity costs ~8–12 replays; it runs on the simulator (`Replay` of `autospec.serving.replay`).

Parallel probes (`jobs` > 1, issue 18): the search is a chain of decisions, each waiting on a replay,
but the next few probes it *could* ask for are known in advance — after a probe at s the next is one
scale if s passes and another if it fails. With N processes, every round replays the N probes nearest
the search's current point in that tree of outcomes (breadth first: the probe it needs now, then both
possible next ones, …) at once, and the search then walks on through the answers it has, exactly as a
serial one would: the capacity, bracket and `probes` (the probes on the search's path, in order) are
the same for any N, and the probes of the branch not taken are dropped. Two levels of the tree per
round need 3 processes, so 2 cores save little on the bisection but a probe of each direction at s = 1;
the processes are forked (no pickling of the replay), and where the platform cannot fork the search
runs serially.
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from typing import TYPE_CHECKING, Callable, Literal, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autospec.serving.metrics import Slo, meets_slo, per_request_latencies
from autospec.serving.records import ServeRecords, ServeRequest

if TYPE_CHECKING:
    from autospec.serving.replay import Replay
    from autospec.strategy import StrategySpec

__all__ = ["Capacity", "CapacitySpec", "attainment", "capacity_search", "mean_rate", "replay_capacity",
           "scaled_requests"]


class CapacitySpec(BaseModel):
    """How capacity at the SLO is searched (module docstring)."""

    model_config = ConfigDict(extra="forbid")
    target: float = Field(0.9, gt=0.0, le=1.0)  # SLO attainment the load must keep
    rel_tol: float = Field(0.02, gt=0.0, le=1.0)  # bisect until fail/pass ≤ 1 + rel_tol
    max_scale: float = Field(64.0, gt=1.0)  # search scales 1/max_scale .. max_scale of the trace's rate


class Capacity(BaseModel):
    """One strategy's capacity at the SLO on one replay seed."""

    rps: float | None  # requests/s at `scale` (0 when no load passes; None when every request arrives at 0)
    scale: float  # highest scale of the trace's arrival rate found to pass (0 when none did)
    scale_fail: float | None  # the lowest scale above `scale` found to fail (None: none did, above_range)
    target: float
    status: Literal["found", "below_range", "above_range"]
    probes: list[tuple[float, float]]  # (scale, attainment) in the order probed


def scaled_requests(requests: Sequence[ServeRequest], scale: float) -> list[ServeRequest]:
    """The same requests arriving `scale` times as fast (arrival times divided by `scale`)."""
    return [dataclasses.replace(r, arrival_s=r.arrival_s / scale) for r in requests]


def attainment(records: ServeRecords, slo: Slo) -> float:
    """Fraction of a replay's requests that meet the SLO (1.0 for an empty replay)."""
    frame = records.requests_frame()
    if not len(frame):
        return 1.0
    lat = per_request_latencies(frame)
    return float(np.mean(meets_slo(lat["ttft_s"].to_numpy(), lat["tpot_s"].to_numpy(), slo)))


def mean_rate(requests: Sequence[ServeRequest]) -> float:
    """Requests per second of the unscaled trace: count / time from 0 to the last arrival (`Trace.stats`'s
    mean_rate_per_s; scaling divides every arrival by s, so the scaled rate is s times this)."""
    last = max((r.arrival_s for r in requests), default=0.0)
    return len(requests) / last if last > 0 else float("nan")  # every request at 0: no rate to scale


def capacity_search(attainment_at: Callable[[float], float], base_rate_rps: float,
                    spec: CapacitySpec = CapacitySpec(), *,
                    attainments: Callable[[list[float]], list[float]] | None = None, width: int = 1) -> Capacity:
    """Bracket and bisect the highest passing scale (module docstring); `attainment_at(scale)` replays.
    With `attainments` (scales -> their attainments, replayed at once) and `width` > 1, each round asks it
    for the `width` probes nearest the search's point in its tree of outcomes (`_speculate`); the result
    is the serial search's."""
    known: dict[float, float] = {}
    while True:
        needed, result = _walk(known, spec)
        if result is not None:
            return _result(spec, base_rate_rps, *result)
        assert needed is not None
        if attainments is None or width <= 1:
            known[needed] = attainment_at(needed)
            continue
        scales = _speculate(known, spec, width)
        known.update(zip(scales, attainments(scales)))


class _Unknown(Exception):
    """The serial search needs the attainment at `scale`, which is not known yet."""

    def __init__(self, scale: float):
        self.scale = scale


_Outcome = tuple[float, "float | None", Literal["found", "below_range", "above_range"], list[tuple[float, float]]]


def _walk(known: dict[float, float], spec: CapacitySpec) -> tuple[float, None] | tuple[None, _Outcome]:
    """The serial search run on the attainments `known` (scale -> attainment): (the first scale it needs
    that is not known, None), or (None, its result: scale, scale_fail, status, the probes on its path)."""
    probes: list[tuple[float, float]] = []

    def passes(scale: float) -> bool:
        if scale not in known:
            raise _Unknown(scale)
        probes.append((scale, known[scale]))
        return known[scale] >= spec.target

    try:
        return None, _search(passes, spec, probes)
    except _Unknown as need:
        return need.scale, None


def _search(passes: Callable[[float], bool], spec: CapacitySpec, probes: list[tuple[float, float]]) -> _Outcome:
    lo, hi = 1.0, 1.0  # lo passes, hi fails, once bracketed
    if passes(1.0):
        while True:
            if hi >= spec.max_scale:
                return hi, None, "above_range", probes
            lo, hi = hi, min(hi * 2.0, spec.max_scale)
            if not passes(hi):
                break
    else:
        while True:
            if lo <= 1.0 / spec.max_scale:
                return 0.0, lo, "below_range", probes
            hi, lo = lo, max(lo / 2.0, 1.0 / spec.max_scale)
            if passes(lo):
                break
    while hi / lo > 1.0 + spec.rel_tol:
        mid = math.sqrt(lo * hi)
        if passes(mid):
            lo = mid
        else:
            hi = mid
    return lo, hi, "found", probes


def _speculate(known: dict[float, float], spec: CapacitySpec, width: int) -> list[float]:
    """Up to `width` scales to replay now: the one the search needs next, then, breadth first, those it
    would need after each possible outcome (pass: attainment 1, fail: 0) of the ones before."""
    scales: list[float] = []
    frontier = [known]
    while frontier and len(scales) < width:
        assumed = frontier.pop(0)
        needed, _ = _walk(assumed, spec)
        if needed is None:
            continue
        if needed not in scales:
            scales.append(needed)
        frontier += [{**assumed, needed: 1.0}, {**assumed, needed: 0.0}]
    return scales


def _result(spec: CapacitySpec, base_rate_rps: float, scale: float, scale_fail: float | None,
            status: Literal["found", "below_range", "above_range"], probes: list[tuple[float, float]]) -> Capacity:
    rps = scale * base_rate_rps if math.isfinite(base_rate_rps) else None
    return Capacity(rps=rps, scale=scale, scale_fail=scale_fail, target=spec.target,
                    status=status, probes=probes)


def replay_capacity(replay: "Replay", strategy: "StrategySpec", seed: int,
                    spec: CapacitySpec = CapacitySpec(), at_own_load: ServeRecords | None = None,
                    jobs: int = 1) -> Capacity:
    """Capacity of `strategy` on `replay` (a simulator's: every probe is a full replay at its scale).
    `at_own_load`: the records of the same replay at 1x (same seed), when the caller ran it already —
    the first probe then reuses them instead of replaying again. `jobs` > 1: probes replayed in that many
    forked processes at once (module docstring, "Parallel probes"), the same result."""
    base = replay.requests

    def attainment_at(scale: float) -> float:
        if scale == 1.0 and at_own_load is not None:
            return attainment(at_own_load, replay.slo)
        return attainment(replay.run(strategy, seed, requests=scaled_requests(base, scale)), replay.slo)

    if jobs <= 1 or "fork" not in multiprocessing.get_all_start_methods():
        return capacity_search(attainment_at, mean_rate(base), spec)
    global _PROBE
    _PROBE = attainment_at  # the forked processes inherit it: nothing is pickled but scales and attainments
    try:
        with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("fork")) as pool:

            def attainments(scales: list[float]) -> list[float]:
                return list(pool.map(_probe, scales))

            return capacity_search(attainment_at, mean_rate(base), spec, attainments=attainments, width=jobs)
    finally:
        _PROBE = None


_PROBE: Callable[[float], float] | None = None  # the search's attainment_at, in its forked probe processes


def _probe(scale: float) -> float:
    assert _PROBE is not None
    return _PROBE(scale)
