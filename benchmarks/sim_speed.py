"""Simulator speed: host wall seconds to replay a 20,000-request synthetic workload through the serving
loop on the sim engine under one strategy (static-k4). Goal (issue 4): <= 10 s on a 2-core CPU.

    python benchmarks/sim_speed.py [--run DIR] [--requests 20000] [--repeats 3] \
        [--out benchmarks/results/sim_speed.json]

The simulator needs a profile: `--run DIR` names a run directory from `autospec profile` (+ `autospec
fit`; fitted in memory when absent). Without it a quick profile of the bundled pair is made in a
temporary folder first (not timed). The workload is chat-like: Poisson arrivals, lognormal prompt
(mean 256) and output (mean 200) lengths. Its rate is set to 90% of the simulated engine's capacity at
the chosen batch size, measured by a short saturated replay on the simulator itself (not timed), so batches
stay nearly full without an unbounded queue. The replay is timed --repeats times (fresh engine and
strategy each time); wall_s is the median, as a shared machine's timings swing.

The replay is set up as `autospec evaluate --engine sim` and every `autospec tune` trial set it up
(`autospec.evaluate.open_sim_replay`: the same engine, requests and step settings), so what is timed is
the simulator those commands run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results"
MEAN_PROMPT = 256
MEAN_OUTPUT = 200
STRATEGY = "static-k4"
K = 4
CALIBRATION = 600  # requests in the saturated capacity replay (not timed)
LOAD = 0.9  # arrival rate as a fraction of the measured capacity


def ensure_profile(run: Path | None) -> tuple[Path, float | None]:
    if run is not None:
        return run, None
    tmp = Path(tempfile.mkdtemp(prefix="autospec-sim-speed-"))
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autospec", "profile", "--out", str(tmp), "--quick"], check=True,
                   stdout=subprocess.DEVNULL)
    return tmp, time.perf_counter() - t0


def chat_trace(n: int, rng: np.random.Generator, arrivals: np.ndarray | None = None):
    """n chat requests, lognormal prompt and output lengths; all at t=0 unless `arrivals` is given."""
    from autospec.workloads.synthetic import lognormal_lengths
    from autospec.workloads.trace import Trace

    prompt_len = lognormal_lengths(MEAN_PROMPT, n, rng)
    output_len = lognormal_lengths(MEAN_OUTPUT, n, rng)
    return Trace.from_arrays(np.zeros(n) if arrivals is None else arrivals, prompt_len, output_len, "chat")


def capacity_rate(run: Path, batch: int, seed: int) -> float:
    """Requests/s the simulated engine sustains at `batch` under the strategy: a saturated replay of
    CALIBRATION requests (all arriving at t=0, same length distributions) on a fresh engine, timed on the
    simulated clock. Measured rather than computed from the cost model, so the benchmark's load is
    below capacity by construction (an overloaded replay times a growing queue, not the simulator)."""
    from autospec.evaluate import open_sim_replay
    from autospec.strategy import load_preset

    trace = chat_trace(CALIBRATION, np.random.default_rng(seed + 1))
    replay = open_sim_replay(run, trace, seed=seed + 1, max_batch=batch)
    records = replay.run(load_preset(STRATEGY), seed + 1)
    # the tail (batch draining) under-uses the slots: count requests finished while the batch was full
    finish = np.sort([r.finish_s for r in records.requests])
    steady = finish[: CALIBRATION - batch]
    return (len(steady) - 1) / (steady[-1] - steady[0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path, default=None, help="run directory with profile/ (and fit/)")
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="timed replays; wall_s is their median")
    ap.add_argument("--out", type=Path, default=RESULTS / "sim_speed.json")
    args = ap.parse_args()

    from autospec.evaluate import open_sim_replay
    from autospec.serving.loop import serve
    from autospec.strategy import load_preset

    run, profile_s = ensure_profile(args.run)
    rng = np.random.default_rng(args.seed)
    n = args.requests
    rate = LOAD * capacity_rate(run, args.batch, args.seed)
    trace = chat_trace(n, rng, arrivals=np.cumsum(rng.exponential(1.0 / rate, n)))
    prompt_len, output_len = trace.column("prompt_len"), trace.column("output_len")
    t0 = time.perf_counter()
    replay = open_sim_replay(run, trace, seed=args.seed, max_batch=args.batch)
    load_s = time.perf_counter() - t0
    spec = load_preset(STRATEGY)
    settings = replay.settings(spec)
    walls = []
    for _ in range(args.repeats):  # the same replay on a fresh engine and strategy each time
        engine, strategy = replay.engine_for(args.seed), replay.build(spec)
        t0 = time.perf_counter()
        records = serve(engine, strategy, replay.requests, max_batch=args.batch, settings=settings)
        walls.append(time.perf_counter() - t0)
    wall = float(np.median(walls))
    steps = len(records.steps.batch)
    generated = int(sum(records.steps.committed) + n)  # + each request's prefill token
    result = {
        "benchmark": "sim_speed",
        "requests": n,
        "strategy": STRATEGY,
        "max_batch": args.batch,
        "mean_prompt_tokens": float(prompt_len.mean()),
        "mean_output_tokens": float(output_len.mean()),
        "arrival_rate_per_s": rate,
        "load_fraction_of_capacity": LOAD,
        "mean_queue_wait_s": float(np.mean([r.admitted_s - r.arrival_s for r in records.requests])),
        "wall_s": wall,  # median of the repeats
        "wall_s_repeats": walls,
        "goal_wall_s": 10.0,
        "meets_goal": wall <= 10.0,
        "engine_load_s": load_s,
        "profile_s": profile_s,
        "steps": steps,
        "mean_batch": float(np.mean(records.steps.batch)) if steps else 0.0,
        "generated_tokens": generated,
        "simulated_s": engine.now(),
        "steps_per_wall_s": steps / wall if wall else None,
        "request_steps_per_wall_s": float(np.sum(records.steps.batch)) / wall if wall else None,
        "profile_run": str(run),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
