"""Where a vLLM replay's steps part from the simulator's: each strategy's plain steps against the simulator's
clock, over several fresh engines and runs, beside the simulator's own replay of the same requests.

    python benchmarks/vllm_replay_steps.py --run-dir DIR [--strategies no-sd,static-k1,static-k2,static-k4]
        [--engines 3] [--runs 2] [--window 60] [--out benchmarks/results/vllm_replay_steps.json]

DIR is an `autospec run` directory on vLLM (`[engine] kind = "vllm"`: profiled and fitted there, e.g.
`benchmarks/verdict.py --engine vllm --keep DIR`'s); the window is its workload's first `--window` requests
(the verdict's), at the simulator's capacity of no-SD for it (the verdict's capacity point).
Per strategy, in turns (strategy after strategy, `--engines` rounds, so a slow spell of the host falls on
every strategy rather than on one): a fresh vLLM engine as `evaluate --engine vllm` starts it, `--runs`
replays on it, each bracketed by the host-speed probe. Per run: the plain steps' step speed
(`metrics.step_speed`: measured seconds over what the simulator's clock charges for those steps, each
request at its own context, drafting what it drafted), that ratio per batch size, and the mean TPOT;
on the simulator, one replay per strategy of the same requests (its step speed is 1 by construction).

Why (issue 16, docs/vllm.md, "The simulator against vLLM"): the verdict on vLLM found the simulator's mean-TPOT error
growing with K (run i: no-SD +4.4%, static-k4 −12.6%) while the tokens committed per step agreed within
1%, so the steps' seconds part. This says whether they part on every engine the strategy starts and at
every batch size (a cost the profile does not see), or by engine and run (noise the verdict's repeats
must carry). Per strategy the result has the median step speed over all runs, its spread between engines
(the engines' medians) and inside one (the largest gap between two runs of one engine, relative), and the
same for mean TPOT against the simulator's. No goal: a diagnostic. Run it alone on a quiet machine.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import OneLineParser, run, whole  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
STRATEGIES = "no-sd,static-k1,static-k2,static-k4"


def by_batch(steps, requests, clock) -> dict[str, float]:
    """The plain steps' step speed (`metrics.step_speed`) per batch size."""
    from autospec.serving.metrics import step_speed

    out = {}
    for batch in sorted(set(steps["batch"].astype(int))):
        kept = steps.copy()
        # a step of another batch size counts as admitting: step_speed then leaves it out, and keeps
        # every step's period (to the next step's start) as it is in the whole run
        kept.loc[kept["batch"] != batch, "admitted"] = 1
        speed = step_speed(kept, requests, clock)
        if speed is not None and batch > 0:
            out[str(batch)] = speed
    return out


def spread(values: list[float]) -> float | None:
    """(max − min) / median of `values`; None for fewer than two."""
    return None if len(values) < 2 else float((max(values) - min(values)) / np.median(values))


def measure(run_dir: Path, names: list[str], engines: int, runs: int, window: int) -> dict[str, Any]:
    from autospec.config import load_run_spec
    from autospec.errors import InputError
    from autospec.evaluate import open_sim_replay, open_vllm_replay
    from autospec.serving.capacity import CapacitySpec, replay_capacity, scaled_requests
    from autospec.serving.metrics import compute_metrics, step_speed
    from autospec.strategy import load_preset
    from autospec.workloads.spec import load_workload

    if not (run_dir / "config.toml").is_file():
        raise InputError("not an autospec run directory (no config.toml)", path=run_dir)
    run_spec = load_run_spec(run_dir / "config.toml")
    if run_spec.engine.kind != "vllm":
        raise InputError(f"its engine is {run_spec.engine.kind!r}: this compares vLLM replays with a vLLM profile",
                         path=run_dir / "config.toml", field="engine.kind")
    specs = {name: load_preset(name) for name in names}
    trace = load_workload(run_spec.workload).cap(window)
    sim = open_sim_replay(run_dir, trace, k_max=run_spec.profile.k_max, seed=0, slo=run_spec.slo,
                          max_batch=run_spec.max_batch)
    capacity = replay_capacity(sim, load_preset("no-sd"), 0, CapacitySpec())
    scale = capacity.scale
    requests = scaled_requests(sim.requests, scale)
    clocks = {name: sim.step_clock(spec) for name, spec in specs.items()}
    cells: dict[str, Any] = {}
    for name, spec in specs.items():
        records = sim.run(spec, 0, requests=requests)
        cells[name] = {"sim_tpot_mean_s": compute_metrics(records.requests_frame(), records.steps_frame(),
                                                          sim.slo)["tpot_mean"], "runs": []}
    for engine in range(engines):
        for name, spec in specs.items():
            real = open_vllm_replay(trace, run_spec.pair, profile=run_dir, k_max=sim.k_max, seed=0, slo=run_spec.slo,
                                    max_batch=run_spec.max_batch)
            try:
                for repeat in range(runs):
                    records = real.run(spec, repeat, requests=scaled_requests(real.requests, scale))
                    steps, frame = records.steps_frame(), records.requests_frame()
                    row = {"engine": engine, "run": repeat,
                           "step_speed": step_speed(steps, frame, clocks[name]),
                           "step_speed_by_batch": by_batch(steps, frame, clocks[name]),
                           "tpot_mean_s": compute_metrics(frame, steps, real.slo)["tpot_mean"],
                           "host_speed": list(getattr(records, "host_speed", None) or []),
                           "plain_batch_mean": float(steps.loc[steps["admitted"].fillna(0) == 0, "batch"].mean())}
                    cells[name]["runs"].append(row)
                    print(f"{name} engine {engine} run {repeat}: step speed {row['step_speed']:.3f}, "
                          f"TPOT {row['tpot_mean_s'] * 1e3:.2f} ms, probe {row['host_speed']}", flush=True)
            finally:
                real.close()
    for cell in cells.values():
        speeds = [r["step_speed"] for r in cell["runs"] if r["step_speed"] is not None]
        tpots = [r["tpot_mean_s"] for r in cell["runs"] if r["tpot_mean_s"] is not None]
        per_engine = [[r for r in cell["runs"] if r["engine"] == e] for e in range(engines)]
        batches = sorted({b for r in cell["runs"] for b in r["step_speed_by_batch"]})
        cell.update({
            "step_speed_median": float(np.median(speeds)) if speeds else None,
            "step_speed_between_engines": spread([float(np.median([r["step_speed"] for r in runs]))
                                                  for runs in per_engine if runs]),
            "step_speed_inside_engine_max": max((s for runs in per_engine
                                                 if (s := spread([r["step_speed"] for r in runs])) is not None),
                                                default=None),
            "step_speed_by_batch_median": {b: float(np.median([r["step_speed_by_batch"][b] for r in cell["runs"]
                                                               if b in r["step_speed_by_batch"]])) for b in batches},
            "tpot_mean_s_median": float(np.median(tpots)) if tpots else None,
            "tpot_spread": spread(tpots),
            "sim_over_real_tpot": (cell["sim_tpot_mean_s"] / float(np.median(tpots)) - 1.0) if tpots else None,
        })
    return {"window_requests": len(sim.requests),
            "scale": scale, "capacity_rps_sim_no_sd": capacity.rps, "cells": cells}


def main() -> None:
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--strategies", default=STRATEGIES, help="presets, comma-separated")
    ap.add_argument("--engines", type=whole(1, 10), default=3, help="fresh engines per strategy, in turns")
    ap.add_argument("--runs", type=whole(1, 10), default=2, help="replays on each engine")
    ap.add_argument("--window", type=whole(5, 1000), default=60, help="the workload's first requests")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_replay_steps.json")
    args = ap.parse_args()

    from autospec.artifacts import hardware_info, write_json
    from autospec.config import SCHEMA_VERSION

    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    load_at_start = os.getloadavg()
    result = {"schema_version": SCHEMA_VERSION, "benchmark": "vllm_replay_steps", "engines": args.engines,
              "runs": args.runs, **measure(args.run_dir, names, args.engines, args.runs, args.window),
              "load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg(),
              "hardware": hardware_info()}
    write_json(args.out, result)
    for name, cell in result["cells"].items():
        print(f"{name}: step speed {cell['step_speed_median']:.3f} (between engines "
              f"{cell['step_speed_between_engines']}, inside one {cell['step_speed_inside_engine_max']}); TPOT "
              f"sim/vLLM − 1 {cell['sim_over_real_tpot']:+.3f}, vLLM spread {cell['tpot_spread']}; by batch "
              f"{cell['step_speed_by_batch_median']}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    run(main)
