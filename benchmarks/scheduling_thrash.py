"""Why preemptive schedules (LAS, LAPS-SD) lose time under load on the simulator: a deterministic
decomposition into the policy's decisions, the preemption cost model and the serving loop (issue 15).

    python benchmarks/scheduling_thrash.py [--run reports/ci-profile] [--start-s 2400] \
        [--duration-s 600] [--time-scale 0.6] [--requests 400] [--domains chat code] \
        [--out benchmarks/results/scheduling_thrash.json]

Workload: the bundled Azure 2023 code trace (`bundled:azure-code-2023`) from --start-s on — a window
no committed workload or tune run uses (workloads/azure-code-cpu.toml takes 1800–2100 s) — its first
--requests arrivals, re-timed by --time-scale so that bursts fill the batch and a queue forms; prompts
≤ 256 and outputs ≤ 64 tokens as in azure-code-cpu. The simulator reads only lengths, so each domain
(--domains) replays the same arrivals and lengths on that domain's acceptance traces. There is no
conversation trace on this machine: the chat runs are the code trace's arrivals on chat acceptance.

Simulator: `autospec.evaluate.open_sim_replay` of --run (profile/ + fit/), T = 0, seed 0, 8 slots, no
KV budget — `autospec evaluate --engine sim` of that workload. Deterministic: no timing is measured.

For each scheduler (no-sd, static-k2, adaspec, lp-sjf, las, laps-sd) it reports the serving metrics
(mean/p99 TPOT, mean E2E and TTFT, goodput at the default SLO) and an attribution of the lost time:

(a) policy — preemptions per request, rounds a preempted request had run since its admission, how
    many started-but-unfinished requests share each slot (`inflight_per_slot`), the queue (mean
    waiting requests per step) and the mean batch;
(b) cost model — seconds the engine charged for preemptions: `swap_s` (a SwapCost charge at
    preemption) and `reprefill_s` (the resumed requests' token share of their admissions' prefill:
    the recompute), both also as a share of the makespan;
(c) loop — events a correct loop never produces or that waste a prefill: a preemption charged both a
    swap and a re-prefill (`double_charged`), a request preempted before it ran a round since its
    admission (`preempted_unrun`), re-admitted in the iteration it was preempted in (`same_step_churn`),
    or preempted with at most one round's worth of tokens left (`preempted_near_done`); and how often a
    preempted request is back after a single step of others (`readmitted_after_one_step`, ping-pong).

Ablations, for the preemptive schedulers only, separate the three: the cost model (`cost`: "engine" =
the simulator as it is, "swap+recompute" = a switch cost of the target's per-token prefill × context
at preemption on top of the re-prefill — the pricing before issue 15 —, "recompute" = the re-prefill
only, "free" = preemption costs nothing) and the policy's quantum (`min_rounds`: rounds a
(re-)admitted request runs before it may be preempted; skipped on a tree whose policies lack it).
With `free`, what remains of the gap to FCFS/LP-SJF is the policy's order alone.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
SCHEDULERS = ("no-sd", "static-k2", "adaspec", "lp-sjf", "las", "laps-sd")
PREEMPTIVE = ("las", "laps-sd")
COSTS = ("engine", "swap+recompute", "recompute", "free")
QUANTA = (1, 4, 16)
MAX_BATCH = 8


def workload(domain: str, start_s: float, duration_s: float, time_scale: float, requests: int):
    from autospec.workloads.spec import workload_spec_from_dict

    spec = workload_spec_from_dict({
        "name": f"azure-code-heldout-{domain}", "trace": "bundled:azure-code-2023", "format": "azure",
        "domain": domain, "start_s": start_s, "duration_s": duration_s, "time_scale": time_scale,
        "max_requests": requests, "max_prompt_tokens": 256, "max_output_tokens": 64, "prompts": [], "seed": 0})
    return spec.build(REPO / "workloads")


def engine_class(base_cls: type, cost: str) -> type:
    """The simulator with the preemption priced as `cost` (module docstring); every variant records the
    seconds its `add` charged for resumed requests' tokens (`reprefill_s`)."""
    from autospec.engines.base import GenRequest, PrefillResult

    class Accounting(base_cls):  # type: ignore[misc, valid-type]
        reprefill_s = 0.0

        def add(self, requests: list[GenRequest]) -> PrefillResult:
            resumed = [i for i, r in enumerate(requests) if r.resumed_tokens]
            if cost == "free" and resumed:
                return self._add_resumed_free(requests, set(resumed))
            res = super().add(requests)
            if resumed:
                total = sum(len(r.prompt) for r in requests)
                self.reprefill_s += res.time_s * sum(len(requests[i].prompt) for i in resumed) / total
            return res

        def _add_resumed_free(self, requests: list[GenRequest], resumed: set[int]) -> PrefillResult:
            fresh_idx = [i for i in range(len(requests)) if i not in resumed]
            res_fresh = super().add([requests[i] for i in fresh_idx])
            priced = self.costs
            self.costs = dataclasses.replace(priced, prefill_target=(0.0, 0.0), prefill_draft=(0.0, 0.0),
                                             prefill_square=(0.0, 0.0))
            try:
                res_resumed = super().add([requests[i] for i in sorted(resumed)])
            finally:
                self.costs = priced
            by_index = {**dict(zip(fresh_idx, zip(res_fresh.req_ids, res_fresh.first_tokens, res_fresh.finished))),
                        **dict(zip(sorted(resumed), zip(res_resumed.req_ids, res_resumed.first_tokens,
                                                        res_resumed.finished)))}
            ids, first, finished = zip(*(by_index[i] for i in range(len(requests))))
            return PrefillResult(list(ids), list(first), list(finished), res_fresh.time_s + res_resumed.time_s)

    if cost == "swap+recompute":
        def swap_cost_s(self, context_tokens: int) -> float:
            return max(0.0, self.costs.prefill_target[0]) * max(0, context_tokens)
        Accounting.swap_cost_s = swap_cost_s  # type: ignore[attr-defined]
    elif cost in ("recompute", "free"):
        Accounting.swap_cost_s = None  # type: ignore[attr-defined]  # engines.base.offers: not offered
    return Accounting


def loop_events(records, max_tokens: dict[int, int]) -> dict[str, Any]:
    """Per preemption, from the step log: rounds run since the request's admission, tokens left, and
    when it was re-admitted: with no step logged in between (the iteration it was preempted in), or
    after one step."""
    s = records.steps
    events: dict[int, list[tuple[int, int, str, int]]] = {}
    for rid, before in zip(s.prefill_req, s.prefill_before):
        events.setdefault(rid, []).append((before, 0, "prefill", 1))
    for i, (ids, cs) in enumerate(zip(s.req_ids, s.c)):
        for rid, c in zip(ids, cs):
            events.setdefault(rid, []).append((i, 1, "step", c))
    rounds_before: list[int] = []
    left: list[int] = []
    same_step = next_step = 0
    tokens_per_round = float(np.mean([c for cs in s.c for c in cs])) if s.c else 0.0
    for rid, evs in events.items():
        evs.sort()
        generated, stint, seen, last_step = 0, 0, False, -1
        for when, _, kind, count in evs:
            if kind == "prefill":
                if seen:  # a re-admission: the request was preempted after its last step
                    rounds_before.append(stint)
                    left.append(max_tokens[rid] - generated)
                    same_step += int(when == last_step + 1)  # no step logged between the two
                    next_step += int(when == last_step + 2)  # back after one step of others
                seen, stint = True, 0
            else:
                stint += 1
                last_step = when
            generated += count
    rb, lt = np.asarray(rounds_before), np.asarray(left)
    return {
        "readmissions": int(len(rb)),
        "rounds_before_preemption": {"0": int((rb == 0).sum()), "1": int((rb == 1).sum()),
                                     "2-4": int(((rb >= 2) & (rb <= 4)).sum()), ">4": int((rb > 4).sum())},
        "preempted_unrun": int((rb == 0).sum()),
        "same_step_churn": same_step,
        "readmitted_after_one_step": next_step,
        "preempted_near_done": int((lt <= tokens_per_round).sum()),
        "tokens_per_round": tokens_per_round,
    }


def run_one(replay, base, spec, cost: str) -> dict[str, Any]:
    from autospec.serving.loop import serve
    from autospec.serving.metrics import compute_metrics

    cls = engine_class(type(base), cost)
    engine = cls(base.traces, base.costs, k_max=base.k_max, temperature=base.temperature, seed=0,
                 fused_prefill=base.fused_prefill, padded_batches=base.padded_batches)
    strategy = replay.build(spec)
    records = serve(engine, strategy, replay.requests, max_batch=replay.max_batch, settings=replay.settings(spec))
    req, steps = records.requests_frame(), records.steps_frame()
    m = compute_metrics(req, steps, replay.slo)
    arrival, finish, admitted = (req[c].to_numpy() for c in ("arrival_s", "finish_s", "admitted_s"))
    starts = steps["start_s"].to_numpy()
    batch = steps["batch"].to_numpy()
    present = (arrival[None, :] <= starts[:, None]) & (finish[None, :] > starts[:, None])
    started = present & (admitted[None, :] <= starts[:, None])
    makespan = float(finish.max() - arrival.min())
    swap_s = float(steps["swap_s"].sum())
    reprefill_s = float(engine.reprefill_s)
    preemptions = int(req["preemptions"].sum())
    round_s = float((steps["draft_s"] + steps["verify_s"]).mean())
    events = loop_events(records, dict(zip(req["req_id"], req["max_tokens"])))
    return {
        "metrics": {k: m[k] for k in ("tpot_mean", "tpot_p99", "e2e_mean", "e2e_p99", "ttft_mean", "goodput",
                                      "slo_attainment", "throughput_tok_s")},
        "makespan_s": makespan,
        "policy": {
            "preemptions_per_request": preemptions / len(req),
            "mean_batch": float(batch.mean()),
            "mean_queue": float((present.sum(axis=1) - batch).mean()),
            "inflight_per_slot": float(started.sum(axis=1).mean() / replay.max_batch),
            "rounds_before_preemption": events["rounds_before_preemption"],
            # LAPS-SD: the share of requests that became perceptible (PC) at some point
            **({"perceptible_share": strategy.schedule.promoted / len(req)}
               if hasattr(strategy.schedule, "promoted") else {}),
        },
        "cost_model": {
            "swap_s": swap_s, "reprefill_s": reprefill_s,
            "share_of_makespan": (swap_s + reprefill_s) / makespan if makespan else 0.0,
            "per_preemption_s": (swap_s + reprefill_s) / preemptions if preemptions else 0.0,
            "mean_round_s": round_s,
            "per_preemption_rounds": (swap_s + reprefill_s) / preemptions / round_s if preemptions else 0.0,
            "prefill_s": float(steps["prefill_s"].sum()),
        },
        "loop": {
            "double_charged": events["readmissions"] if swap_s > 0 else 0,
            "preempted_unrun": events["preempted_unrun"],
            "same_step_churn": events["same_step_churn"],
            "readmitted_after_one_step": events["readmitted_after_one_step"],
            "preempted_near_done": events["preempted_near_done"],
            "tokens_per_round": events["tokens_per_round"],
        },
    }


def with_min_rounds(spec, n: int):
    from autospec.policies.base import policy_class
    from autospec.strategy import spec_from_dict

    if "min_rounds" not in policy_class("schedule", spec.schedule.policy).Params.model_fields:
        return None
    data = spec.model_dump()
    data["schedule"] = {**data["schedule"], "min_rounds": n}
    data["strategy"] = {**data["strategy"], "name": f"{spec.name} (min_rounds {n})"}
    return spec_from_dict(data)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=REPO / "reports" / "ci-profile", help="profile/ + fit/")
    ap.add_argument("--start-s", type=float, default=2400.0)
    ap.add_argument("--duration-s", type=float, default=600.0)
    ap.add_argument("--time-scale", type=float, default=0.6)
    ap.add_argument("--requests", type=int, default=400)
    ap.add_argument("--domains", nargs="+", default=["chat", "code"])
    ap.add_argument("--out", type=Path, default=RESULTS / "scheduling_thrash.json")
    args = ap.parse_args()

    from autospec.evaluate import open_sim_replay
    from autospec.strategy import load_preset

    result: dict[str, Any] = {
        "benchmark": "scheduling_thrash", "max_batch": MAX_BATCH,
        "profile_run": str(args.run.resolve().relative_to(REPO) if args.run.resolve().is_relative_to(REPO)
                           else args.run),
        "workload": {"trace": "bundled:azure-code-2023", "start_s": args.start_s, "duration_s": args.duration_s,
                     "time_scale": args.time_scale, "max_requests": args.requests},
        "note": "no conversation trace on this machine: chat = the code trace's arrivals and lengths "
                "on the profile's chat acceptance traces",
        "domains": {},
    }
    for domain in args.domains:
        trace = workload(domain, args.start_s, args.duration_s, args.time_scale, args.requests)
        replay = open_sim_replay(args.run, trace, seed=0, max_batch=MAX_BATCH)
        base = replay.probe
        out: dict[str, Any] = {"trace": trace.stats(), "schedulers": {}, "ablations": {}}
        for name in SCHEDULERS:
            out["schedulers"][name] = run_one(replay, base, load_preset(name), "engine")
        for name in PREEMPTIVE:
            rows = {}
            for n in QUANTA:
                spec = load_preset(name) if n == 1 else with_min_rounds(load_preset(name), n)
                if spec is None:
                    continue
                for cost in COSTS:
                    rows[f"cost={cost} min_rounds={n}"] = run_one(replay, base, spec, cost)
            out["ablations"][name] = rows
        result["domains"][domain] = out
        print(f"== {domain}: {trace.stats()['requests']:.0f} requests, "
              f"{trace.stats()['mean_rate_per_s']:.2f} req/s", file=sys.stderr)
        for name, r in out["schedulers"].items():
            print(f"  {name:10s} tpot {r['metrics']['tpot_mean']:.4f} (p99 {r['metrics']['tpot_p99']:.3f}) "
                  f"e2e {r['metrics']['e2e_mean']:.2f} goodput {r['metrics']['goodput']:.2f} "
                  f"preempt/req {r['policy']['preemptions_per_request']:.2f} "
                  f"cost {r['cost_model']['swap_s'] + r['cost_model']['reprefill_s']:.1f}s "
                  f"batch {r['policy']['mean_batch']:.2f} queue {r['policy']['mean_queue']:.1f}", file=sys.stderr)
        for name, rows in out["ablations"].items():
            for label, r in rows.items():
                print(f"  {name:8s} {label:36s} tpot {r['metrics']['tpot_mean']:.4f} "
                      f"e2e {r['metrics']['e2e_mean']:.2f} goodput {r['metrics']['goodput']:.2f} "
                      f"preempt/req {r['policy']['preemptions_per_request']:.2f}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
