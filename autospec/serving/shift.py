"""What a strategy choice loses if the load or the prompt mix shifts by ±30%: each strategy re-measured on
the simulator at shifted workloads, and the recommendation's regret against the best strategy there.

A recommendation is made for one workload; the traffic it meets will not be exactly that. This module
re-measures every strategy of an evaluation at five shifted workloads so a report can say how much the
recommended strategy gives up once the workload moves away from the one it was picked on.

Shifts (`FACTORS` = 0.7, 1.0, 1.3 [chosen: ±30%, the issue's figure; 1.0 is the unshifted workload]):
* Load — the workload's own arrival process at factor × its rate (`capacity.scaled_requests`: arrival
  times divided by the factor; lengths, order and burstiness kept) [chosen: the user's planned traffic
  is the workload's own rate]. Per strategy: SLO attainment (`capacity.attainment`), mean TPOT and
  goodput (`metrics.compute_metrics`'s `tpot_mean`, `goodput`) of one replay.
* Prompt mix — [chosen] the mix is the workload's length distribution: every request's prompt length
  and output length (`max_tokens`) × the factor, rounded, at least 1 (`shifted_lengths`); arrivals
  unchanged. Domains are not re-weighted (the simulator's acceptance traces per domain stay as they
  are): "longer or shorter prompts and answers" is the shift. Per strategy: capacity at the SLO
  (`capacity.replay_capacity`) on the shifted workload — the number that moves with the lengths (at a
  fixed rate, attainment mostly says whether the engine still keeps up). Only simulated prompts
  (`SyntheticPrompt`, known by their length) can be resized; real token ids have no defined longer or
  shorter version, so a real engine's replay is refused (ValueError).

Cost: one seed only (evaluate passes repeat 0's); per strategy 2 load replays (the 1.0 point reuses the
caller's run) and 2 capacity searches of ~8–12 replays each (the 1.0 point reuses the caller's capacity).

Regret (`regret`) of a named recommendation at each shift point: the best strategy there (highest
attainment, or highest capacity; a tie goes to the recommendation, so a recommendation that is as good
as any has regret 0), and
* load: (best's attainment − the recommendation's) in percentage points;
* prompt mix: 1 − the recommendation's capacity / the best's (0 when no strategy has any capacity).
Oracle strategies (`strategy.reads_the_future`; the caller names them) are measured and shown but are
not candidates for "best" — neither a point's `best` nor the regret's [chosen]: they are a bound, not a
choice a user could switch to, and the regret asks what a different choice would have kept.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from autospec.serving.capacity import Capacity, CapacitySpec, attainment, replay_capacity, scaled_requests
from autospec.serving.metrics import compute_metrics
from autospec.serving.records import ServeRecords, ServeRequest, SyntheticPrompt

if TYPE_CHECKING:  # the report imports this module for `regret`: it need not load every policy
    from autospec.serving.replay import Replay
    from autospec.strategy import StrategySpec

__all__ = ["FACTORS", "regret", "shift_table", "shifted_lengths"]

FACTORS = (0.7, 1.0, 1.3)
# the metric each shift ranks strategies by: attainment at a load, capacity on a length mix
_METRIC = {"load": "slo_attainment", "mix": "capacity_rps"}


def shifted_lengths(requests: Sequence[ServeRequest], factor: float) -> list[ServeRequest]:
    """The same requests (same arrivals, ids, domains) with prompt and output lengths × `factor`, rounded,
    at least 1. The prompts must be `SyntheticPrompt`s (a simulator's replay): they are rebuilt at the new
    length with their own vocabulary and seed. A predicted output length, when a request carries one,
    scales with the output it predicts."""
    def scaled(n: float) -> int:
        return max(1, round(n * factor))

    out = []
    for r in requests:
        if not isinstance(r.prompt, SyntheticPrompt):
            raise ValueError("a prompt-mix shift needs simulated prompts (known by their length); request "
                             f"{r.req_id} has real token ids, which have no longer or shorter version")
        p = r.prompt
        predicted = None if r.predicted_output_len is None else r.predicted_output_len * factor
        out.append(dataclasses.replace(r, prompt=SyntheticPrompt(scaled(p.length), p.vocab, p.seed),
                                       max_tokens=scaled(r.max_tokens), predicted_output_len=predicted))
    return out


def _at_load(records: ServeRecords, replay: "Replay") -> dict[str, float | None]:
    m = compute_metrics(records.requests_frame(), records.steps_frame(), replay.slo)
    return {"slo_attainment": attainment(records, replay.slo), "tpot_mean": m["tpot_mean"], "goodput": m["goodput"]}


def _capacity(found: Capacity) -> dict[str, Any]:
    return {"capacity_rps": found.rps, "capacity_scale": found.scale, "status": found.status}


def shift_table(replay: "Replay", strategies: Sequence["StrategySpec"], seed: int,
                spec: CapacitySpec = CapacitySpec(), *, oracles: Sequence[str] = (),
                at_own_load: Mapping[str, ServeRecords] | None = None,
                own_capacity: Mapping[str, Capacity] | None = None, jobs: int = 1) -> dict[str, Any]:
    """Every strategy at the load and prompt-mix shifts of `FACTORS` on `replay` (a simulator's) with
    engine seed `seed` (module docstring), and the best strategy at each point; JSON-serialisable.
    `oracles`: the names of strategies that read the future (`strategy.reads_the_future`), never the best.
    `at_own_load` / `own_capacity`: per strategy name, the caller's unshifted run and capacity with the
    same seed, reused for the 1.0 points. `jobs`: processes per capacity search (`replay_capacity`).
    Raises ValueError on a replay whose prompts are real token ids (a prompt mix cannot be shifted)."""
    at_own_load, own_capacity = at_own_load or {}, own_capacity or {}
    mixes = {f: shifted_lengths(replay.requests, f) for f in FACTORS if f != 1.0}  # fails before any replay
    load_points, mix_points = [], []
    for factor in FACTORS:
        values = {}
        for s in strategies:
            records = at_own_load.get(s.name) if factor == 1.0 else None
            if records is None:
                records = replay.run(s, seed, requests=scaled_requests(replay.requests, factor))
            values[s.name] = _at_load(records, replay)
        load_points.append({"factor": factor, "strategies": values,
                            "best": _best(values, _METRIC["load"], set(oracles))})
    for factor in FACTORS:
        values = {}
        for s in strategies:
            found = own_capacity.get(s.name) if factor == 1.0 else None
            if found is None:
                shifted = replay if factor == 1.0 else dataclasses.replace(replay, requests=mixes[factor])
                found = replay_capacity(shifted, s, seed, spec, jobs=jobs)
            values[s.name] = _capacity(found)
        mix_points.append({"factor": factor, "strategies": values,
                           "best": _best(values, _METRIC["mix"], set(oracles))})
    return {"factors": list(FACTORS), "seed": seed, "target": spec.target, "oracles": list(oracles),
            "load": load_points, "mix": mix_points}


def _best(strategies: Mapping[str, Mapping[str, Any]], metric: str, oracles: set[str],
          prefer: str | None = None) -> str | None:
    """The strategy with the highest `metric` at one shift point, oracles aside; on a tie `prefer` (the
    recommendation: as good as any means regret 0), else the first listed. None when no value is known."""
    values: dict[str, float] = {n: v[metric] for n, v in strategies.items()
                                if (n not in oracles or n == prefer) and v.get(metric) is not None}
    ordered = sorted(values, key=lambda n: n != prefer)
    return max(ordered, key=lambda n: values[n]) if ordered else None


def regret(table: Mapping[str, Any], recommended: str) -> list[dict[str, Any]]:
    """Per shift point of `table` (`shift_table`'s): {shift, factor, metric, value (the recommendation's),
    best, best_value, regret} — regret in attainment points for a load shift, as a fraction of the best's
    capacity for a prompt-mix shift (module docstring); a load point also carries the recommendation's
    tpot_mean and goodput. Raises KeyError when `recommended` is not in the table."""
    oracles = set(table.get("oracles") or [])
    rows = []
    for shift, metric in _METRIC.items():
        for point in table[shift]:
            mine_all = point["strategies"][recommended]
            best = _best(point["strategies"], metric, oracles, prefer=recommended)
            mine, top = mine_all.get(metric), None if best is None else point["strategies"][best][metric]
            if mine is None or top is None:
                loss = None
            elif shift == "load":
                loss = 100.0 * (top - mine)
            else:
                loss = 1.0 - mine / top if top > 0 else 0.0
            extra = {k: mine_all.get(k) for k in ("tpot_mean", "goodput")} if shift == "load" else {}
            rows.append({"shift": shift, "factor": point["factor"], "metric": metric, "value": mine, "best": best,
                         "best_value": top, "regret": loss, **extra})
    return rows
