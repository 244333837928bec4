"""Sim picks, the real engine confirms: `autospec tune --confirm-top N` (and `autospec run`'s tune stage).

The simulator ranks; before a configuration is recommended it is re-run on the real engine the profile
measured — the torch engine, or vLLM for a vLLM profile (`tune.confirm_on_real_engine`; on vLLM one
engine per candidate serves all its runs) — where the simulator is known to err by 5-20% in TPOT
(benchmarks/sim_fidelity.py) — enough to swap two close candidates. The confirmation:

1. Candidates: the best `top` distinct configurations vLLM can deploy, in the study's ranking, plus the
   best static K and no-SD among the trials when they are not among them: a recommendation must beat
   them on the real engine, not only on the simulator (and no-SD may win: then SD does not pay there).
2. A bounded window: the workload's first `max_requests` requests [chosen: 120], so a confirmation costs
   minutes, not the whole trace.
3. The load: the simulator's capacity at the SLO of the top candidate on that window
   (`autospec.serving.capacity`, target = tune's `min_attainment`), as a scale s* of the window's own
   arrival rate, and `loads` around it [chosen: 0.9, 1.0, 1.1 × s*] — where the candidates'
   differences decide whether the SLO holds.
4. Every candidate at every load, `repeats` times [chosen: 2] (engine seed + repeat), on the real
   engine; the simulator replays the same points for the sim-vs-real comparison.
5. Score: SLO attainment averaged over the loads, per repeat; its mean and a 95% bootstrap CI across
   repeats (`metrics.bootstrap_ci`). The recommendation is the candidate with the best mean; every
   one whose CI overlaps the best's is a tie, and a tie goes to the simplest configuration
   (`simplicity`: no-SD, then one static K, then a per-batch-size K schedule, then an online length
   policy; among equals, the study's ranking). No-SD added as a *reference* (the simulator did not rank
   it among the top) is not a candidate for ties [chosen]: it is recommended only when its CI lies
   wholly above every candidate's — the real engine refutes the simulator's case for SD. A tie with it
   keeps the simulator's SD pick (not refuted) and the reason says so: on a small window with few
   repeats the CIs are wide (attainment moves in steps of 1/window), and "no difference shown" is not
   "no difference".

With one repeat the CIs are points and only exact ties are ties. A disturbed host makes every real
figure worse: on the torch engine each run is bracketed by the host-speed check
(`autospec.profile.HostSpeedCheck`), each row keeps its ratios (`real_host_speed`), and a confirmation
whose host ran outside 1 ± HOST_SPEED_TOLERANCE of its profiled speed says so in its reason. The probes
see the host only before and after a run, so each real run's speed inside it is kept too
(`real_step_speed`: `metrics.step_speed` against the simulator's step clock, per load and repeat); repeats
of one candidate at one load that disagree by more than the same tolerance (`metrics.uneven_repeats`)
are named in `uneven_repeats` and in the reason.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Callable, Protocol, Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from autospec.profile import HOST_SPEED_TOLERANCE, off_profile
from autospec.serving.capacity import CapacitySpec, attainment, replay_capacity, scaled_requests
from autospec.serving.metrics import bootstrap_ci, compute_metrics, step_speed, uneven_repeats
from autospec.serving.replay import Replay
from autospec.strategy import StrategySpec

__all__ = ["ConfirmSettings", "confirm", "pick_candidates", "recommend", "simplicity"]


class ConfirmSettings(BaseModel):
    """How a confirmation runs (module docstring; every default is [chosen])."""

    model_config = ConfigDict(extra="forbid")
    top: int = Field(2, ge=1)  # simulator candidates confirmed (plus the best static K)
    loads: list[float] = Field(default_factory=lambda: [0.9, 1.0, 1.1], min_length=1)  # × the sim capacity
    repeats: int = Field(2, ge=1)
    max_requests: int = Field(120, ge=2)  # the bounded window: the workload's first requests


REFERENCE = "no-SD reference"


@dataclasses.dataclass
class Candidate:
    spec: StrategySpec
    trial: int  # the tune trial it came from
    why: str  # "tune rank 1", "best static K"


def simplicity(spec: StrategySpec) -> int:
    """Lower is simpler to deploy and reason about: no-SD 0, one static K 1, a per-batch-size K
    schedule 2, any other length policy 3."""
    return {"none": 0, "static": 1, "batch-schedule": 2}.get(spec.length.policy, 3)


def pick_candidates(ranked: Sequence[Any], deployable: Callable[[StrategySpec], bool], top: int) -> list[Candidate]:
    """The best `top` distinct deployable trials of `ranked` (best first), then the best static-K trial
    and the best no-SD trial when they are not among them."""
    seen: set[str] = set()
    out: list[Candidate] = []
    references: dict[int, Candidate] = {}  # simplicity 1 (static K) and 0 (no-SD): the first of each
    for trial in ranked:
        spec = StrategySpec.model_validate(trial.user_attrs["spec"])
        key = json.dumps(trial.user_attrs["spec"], sort_keys=True)
        if key in seen or not deployable(spec):
            continue
        seen.add(key)
        if len(out) < top:
            out.append(Candidate(spec, trial.number, f"tune rank {len(out) + 1}"))
        level = simplicity(spec)
        if level in (0, 1) and level not in references:
            references[level] = Candidate(spec, trial.number, "best static K" if level == 1 else REFERENCE)
    for level in (1, 0):
        ref = references.get(level)
        if ref is not None and all(c.trial != ref.trial for c in out):
            out.append(ref)
    return out


class WindowReplay(Protocol):
    """What a confirmation replays on: a `Replay` (simulator, torch engine) or vLLM's
    `VllmWindowReplay` — a request window, its SLO, one run of a strategy on (a rescaling of) it."""

    requests: list[Any]
    slo: Any

    def run(self, strategy: StrategySpec, seed: int, *, requests: Any = None) -> Any: ...


def confirm(candidates: list[Candidate], sim: Replay, real: WindowReplay, settings: ConfirmSettings,
            target: float, seed: int, on_run: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the confirmation (module docstring) on `sim` and `real`, replays of the same window."""
    capacity = replay_capacity(sim, candidates[0].spec, seed, CapacitySpec(target=target))
    if capacity.scale <= 0:
        return {"status": "no load meets the SLO on the simulator", "capacity_scale": 0.0,
                "candidates": [], "recommended": None}
    scales = [capacity.scale * load for load in settings.loads]
    rows = []
    for cand in candidates:
        real_att = np.zeros((settings.repeats, len(scales)))
        sim_att, sim_tpot, real_tpot = [], [], []
        speeds: list[float] = []  # the host's speed around each real run (profile.HostSpeedCheck), when checked
        step_speeds: list[list[float | None]] = []  # per load, each repeat's speed inside its run (metrics.step_speed)
        clock = sim.step_clock(cand.spec)  # the simulator's price of each real plain step (step_speed)
        for j, scale in enumerate(scales):
            records = sim.run(cand.spec, seed, requests=scaled_requests(sim.requests, scale))
            sim_att.append(attainment(records, sim.slo))
            sim_tpot.append(compute_metrics(records.requests_frame(), records.steps_frame(), sim.slo)["tpot_mean"])
            tpots, inside = [], []
            for r in range(settings.repeats):
                if on_run is not None:
                    on_run(f"{cand.spec.name} at {scale:.3g}x, repeat {r + 1}/{settings.repeats}")
                records = real.run(cand.spec, seed + r, requests=scaled_requests(real.requests, scale))
                real_att[r, j] = attainment(records, real.slo)
                speeds.extend(getattr(records, "host_speed", None) or [])
                steps = records.steps_frame()
                requests = records.requests_frame()
                inside.append(None if clock is None else step_speed(steps, requests, clock))
                tpots.append(compute_metrics(requests, steps, real.slo)["tpot_mean"])
            step_speeds.append(inside)
            real_tpot.append(float(np.mean([t for t in tpots if t is not None])) if any(
                t is not None for t in tpots) else None)
        score = bootstrap_ci(list(real_att.mean(axis=1)), seed=seed)
        rows.append({"strategy": cand.spec.name, "trial": cand.trial, "why": cand.why,
                     "simplicity": simplicity(cand.spec), "spec": cand.spec.model_dump(mode="json"),
                     "real_attainment": score, "real_attainment_by_load": real_att.mean(axis=0).tolist(),
                     "sim_attainment": float(np.mean(sim_att)), "sim_attainment_by_load": sim_att,
                     "real_tpot_mean_by_load": real_tpot, "sim_tpot_mean_by_load": sim_tpot,
                     "real_host_speed": speeds, "real_step_speed": step_speeds})
    chosen, best, versus_no_sd = recommend(rows)
    every = [x for row in rows for x in row["real_host_speed"]]
    off = off_profile(every)
    host = (f"; the host ran {min(every):.2f}-{max(every):.2f}x its profiled step time during the confirmation "
            f"(outside 1 ± {HOST_SPEED_TOLERANCE:.2f}): re-run it on a quiet host") if off else ""
    # identical repeats whose steps ran at other speeds: the host changed inside a run (the probes miss that)
    uneven = [f"{row['strategy']} at {scale:.3g}x" for row in rows
              for scale, inside in zip(scales, row["real_step_speed"]) if uneven_repeats(inside, HOST_SPEED_TOLERANCE)]
    if uneven:
        host += (f"; repeats of {', '.join(uneven)} ran their steps at speeds more than "
                 f"{HOST_SPEED_TOLERANCE:.0%} apart (the host changed inside a run): re-run it on a quiet host")
    return {"status": "confirmed", "target": target, "capacity_scale": capacity.scale,
            "capacity_rps_sim": capacity.rps, "loads": settings.loads, "scales": scales,
            "repeats": settings.repeats, "window_requests": len(real.requests), "candidates": rows,
            "recommended": chosen["strategy"], "recommended_trial": chosen["trial"],
            "best_on_real_engine": best["strategy"],
            "host_speed": {"range": [min(every), max(every)], "disturbed": off} if every else None,
            "uneven_repeats": uneven,
            "reason": (f"{chosen['strategy']}: real SLO attainment {_ci_text(chosen['real_attainment'])} over "
                       f"{', '.join(f'{s:.3g}' for s in scales)}x the window's rate"
                       + ("" if chosen is best else f"; tied with {best['strategy']} "
                          f"({_ci_text(best['real_attainment'])}), the simpler one recommended") + versus_no_sd + host)}


def recommend(rows: list[dict[str, Any]]) -> tuple[dict, dict, str]:
    """(recommended row, best row, the reason's no-SD clause) by the rule of the module docstring (step
    5); marks each row's `tied_with_best`."""
    reference = next((row for row in rows if row["why"] == REFERENCE), None)
    ranked = [row for row in rows if row is not reference]
    if not ranked or (reference is not None and all(
            reference["real_attainment"]["ci_low"] > row["real_attainment"]["ci_high"] for row in ranked)):
        chosen = best = reference  # the real engine refutes SD at this load
    else:
        best = max(ranked, key=lambda row: row["real_attainment"]["mean"])
        ties = [row for row in ranked if row["real_attainment"]["ci_high"] >= best["real_attainment"]["ci_low"]]
        chosen = min(ties, key=lambda row: row["simplicity"])  # min is stable: the study's ranking among equals
    assert chosen is not None and best is not None
    for row in rows:  # its CI reaches the best's
        row["tied_with_best"] = row is best or row["real_attainment"]["ci_high"] >= best["real_attainment"]["ci_low"]
    no_sd = next((row for row in rows if row["simplicity"] == 0), None)
    versus_no_sd = ""
    if no_sd is not None and chosen is not no_sd:
        shown = chosen["real_attainment"]["ci_low"] > no_sd["real_attainment"]["ci_high"]
        versus_no_sd = (f"; no-SD {_ci_text(no_sd['real_attainment'])}: "
                        + ("SD's gain is outside the noise" if shown else
                           "SD's gain is not shown outside the noise on this window (kept: not refuted)"))
    return chosen, best, versus_no_sd


def _ci_text(ci: dict) -> str:
    return f"{ci['mean']:.3f} [{ci['ci_low']:.3f}, {ci['ci_high']:.3f}]"
