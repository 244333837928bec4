"""Replay speed on a real trace: how many times faster than the trace's own (time-scaled) duration the
simulator replays a whole real request trace at a load below capacity (issue 18: >= 1,000x).

    python benchmarks/trace_replay_speed.py [--trace $AUTOSPEC_DATA_DIR/azure_llm_2023_code.csv] [--format azure] \
        [--run reports/ci-profile] [--strategies static-k4,no-sd,adaspec,dsde,adaedl] [--load 0.8] \
        [--repeats 3] [--out benchmarks/results/trace_replay_speed.json]

The trace is read as a user's workload would read it (`[workload] trace = ..., format = ...`, any
format the loader accepts), whole, with prompts clipped to 1,792 tokens and outputs to 256 so every
request fits the bundled pair's 2,048-token context (`--max-prompt`, `--max-output`). The simulator is
the one `--run` profiled and fitted (default: the committed CI profile).

The load: the trace's own arrival process, time-scaled so its mean rate is `--load` (default 0.8) of
the capacity at the SLO of the first strategy (static-k4: `autospec.serving.capacity`, searched on
the same simulator, not timed) — so the replay is below capacity by construction and its duration is
the trace's, not a growing queue's. Each strategy then replays the scaled trace `--repeats` times on a
fresh engine (`Replay.run`, what `autospec evaluate --engine sim` runs per strategy; the batch path
where the strategy has one, the per-request path otherwise); `speedup` = the scaled trace's duration
(first to last arrival) / the median wall seconds. Goal: >= 1,000x for every strategy. Without the
trace file (AUTOSPEC_DATA_DIR, default ../shared/data, lacks it) the benchmark says so and exits 0 without writing.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import OneLineParser, between, run, whole  # noqa: E402

from autospec.workloads.spec import TRACE_FORMATS  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DATA = Path(os.environ.get("AUTOSPEC_DATA_DIR", REPO.parent / "shared" / "data"))
DEFAULT_TRACE = DATA / "azure_llm_2023_code.csv"
GOAL = 1000.0


def main() -> None:
    ap = OneLineParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--format", default="azure", choices=TRACE_FORMATS)
    ap.add_argument("--run", type=Path, default=REPO / "reports" / "ci-profile")
    ap.add_argument("--strategies", default="static-k4,no-sd,adaspec,dsde,adaedl")
    ap.add_argument("--load", type=between(0.0, 1.0), default=0.8,
                    help="mean rate as a fraction of the first strategy's capacity, in (0, 1]")
    ap.add_argument("--max-prompt", type=whole(1, 1_000_000), default=1792)
    ap.add_argument("--max-output", type=whole(1, 1_000_000), default=256)
    ap.add_argument("--max-batch", type=whole(1, 4096), default=32)
    ap.add_argument("--repeats", type=whole(1, 100), default=3)
    ap.add_argument("--seed", type=whole(0, 2**32 - 1), default=0)
    ap.add_argument("--out", type=Path, default=RESULTS / "trace_replay_speed.json")
    args = ap.parse_args()
    if args.trace.exists() and not args.trace.is_file():
        ap.error(f"--trace {args.trace} is not a file")
    if not args.trace.is_file():  # the default trace lives in the data folder, which a clone may not have
        print(f"no trace at {args.trace}: nothing measured", file=sys.stderr)
        return

    from autospec.evaluate import open_sim_replay
    from autospec.serving.capacity import CapacitySpec, attainment, mean_rate, replay_capacity, scaled_requests
    from autospec.strategy import load_preset
    from autospec.workloads.spec import load_workload

    with tempfile.TemporaryDirectory() as tmp:
        spec = Path(tmp) / "trace.toml"
        spec.write_text(f'[workload]\nname = "{args.trace.stem}"\ntrace = {json.dumps(str(args.trace.resolve()))}\n'
                        f'format = "{args.format}"\nmax_prompt_tokens = {args.max_prompt}\n'
                        f"max_output_tokens = {args.max_output}\n")
        t0 = time.perf_counter()
        trace = load_workload(spec)
        load_s = time.perf_counter() - t0
    replay = open_sim_replay(args.run, trace, seed=args.seed, max_batch=args.max_batch)
    names = [n.strip() for n in args.strategies.split(",") if n.strip()]
    if not names:
        ap.error("--strategies names no strategy")
    for name in names:
        load_preset(name)  # an unknown preset: one line before any replay
    first = load_preset(names[0])
    t0 = time.perf_counter()
    capacity = replay_capacity(replay, first, args.seed, CapacitySpec())
    capacity_s = time.perf_counter() - t0
    scale = args.load * capacity.scale
    requests = scaled_requests(replay.requests, scale)
    arrivals = [r.arrival_s for r in requests]
    duration = max(arrivals) - min(arrivals)
    rows = {}
    for name in names:
        strategy = load_preset(name)
        walls = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            records = replay.run(strategy, args.seed, requests=requests)
            walls.append(time.perf_counter() - t0)
        wall = float(np.median(walls))
        steps = records.steps
        rows[name] = {
            "wall_s": wall, "wall_s_repeats": walls, "speedup": duration / wall,
            "simulated_s": max(r.finish_s for r in records.requests),
            "steps": len(steps.batch), "request_steps": int(np.sum(steps.batch)),
            "mean_batch": float(np.mean(steps.batch)) if len(steps.batch) else 0.0,
            "slo_attainment": attainment(records, replay.slo),
        }
        print(f"{name}: {wall:.2f} s for {duration:.0f} s of trace ({duration / wall:.0f}x)", file=sys.stderr)
    result = {
        "benchmark": "trace_replay_speed",
        "trace": args.trace.name, "format": args.format, "requests": len(requests),
        "trace_duration_s": max(r.arrival_s for r in replay.requests) - min(r.arrival_s for r in replay.requests),
        "trace_rate_per_s": mean_rate(replay.requests),
        "clip": {"max_prompt_tokens": args.max_prompt, "max_output_tokens": args.max_output},
        "mean_prompt_tokens": float(np.mean([len(r.prompt) for r in requests])),
        "mean_output_tokens": float(np.mean([r.max_tokens for r in requests])),
        "max_batch": args.max_batch, "slo": replay.slo.model_dump(),
        "capacity": {"strategy": first.name, "scale": capacity.scale, "rps": capacity.rps,
                     "status": capacity.status, "search_wall_s": capacity_s},
        "load_fraction_of_capacity": args.load, "time_scale": 1.0 / scale,
        "scaled_duration_s": duration, "scaled_rate_per_s": mean_rate(requests),
        "strategies": rows,
        "min_speedup": min(r["speedup"] for r in rows.values()),
        "goal_speedup": GOAL,
        "meets_goal": min(r["speedup"] for r in rows.values()) >= GOAL,
        "workload_load_s": load_s, "profile_run": str(args.run.relative_to(REPO) if args.run.is_relative_to(REPO)
                                                      else args.run),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("requests", "scaled_duration_s", "min_speedup", "meets_goal")}))


if __name__ == "__main__":
    run(main)
