"""Does autospec notice a busy host? One real-engine replay of a short workload on a quiet host, then
the same replay beside one CPU-bound process per core; both summaries' measurement health recorded.

    python benchmarks/measurement_health.py [--engine torch|vllm] [--profile DIR] \
        [--out benchmarks/results/measurement_health.json | measurement_health_vllm.json]

Each replay is `autospec evaluate --engine torch|vllm` of no-SD and static K=2, 40 requests of a
Poisson workload, over a profile of that engine, so its host-speed probe applies: `--profile DIR` or,
without it, a fresh `autospec profile --engine torch|vllm --quick` of this host made first in a temporary
folder (not timed; ~1 min on torch, ~3 min on vLLM) [why fresh: the probe compares the host with its
profile, and a profile made on another day of a shared VM once read 1.07-1.11x on a quiet host — that
is a real drift the probe must report, but not what this benchmark asks]. The CPU-bound processes are
plain Python busy loops, started a second before the replay and stopped after it. Goals (issue 17): the
busy replay's summary says `disturbed` (and why: host_load's other-process share, host_speed's probe
ratio); the quiet one's says not disturbed (neither host_load nor host_speed). Run it alone on a quiet
machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from autospec.artifacts import hardware_info, write_json
from autospec.config import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
WORKLOAD = """\
[workload]
name = "health"
format = "synthetic"
generator = "poisson"
rate = 4.0
duration_s = 10.0
max_requests = 40
mean_prompt_tokens = 96
mean_output_tokens = 32
max_prompt_tokens = 192
max_output_tokens = 64
seed = 0
"""


def _spin() -> None:
    while True:
        pass


def replay(folder: Path, hogs: int, engine: str, profile: Path) -> dict[str, Any]:
    """One evaluate run with `hogs` busy processes beside it; the summary's health fields."""
    workers = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(hogs)]
    for w in workers:
        w.start()
    try:
        time.sleep(1.0 if hogs else 0.0)
        t0 = time.perf_counter()
        res = subprocess.run([sys.executable, "-m", "autospec", "evaluate", "--workload", str(folder / "w.toml"),
                              "--strategies", "static-k2", "--engine", engine, "--profile", str(profile),
                              "--out", str(folder / f"run-{hogs}"), "--no-capacity", "--no-shift"],
                             capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
    finally:
        for w in workers:
            w.terminate()
            w.join()
    if res.returncode != 0:
        raise SystemExit(f"evaluate failed ({res.returncode}): {res.stderr.strip()[-2000:]}")
    summary = json.loads((folder / f"run-{hogs}" / "eval" / "summary.json").read_text())
    warnings = [line for line in res.stdout.splitlines() if line.startswith("warning:")]
    return {"cpu_bound_processes": hogs, "wall_s": round(wall, 1), "disturbed": summary.get("disturbed"),
            "host_load": summary.get("host_load"), "host_speed": summary.get("host_speed"),
            "tpot_mean_static_k2": summary["strategies"]["static-k2"]["tpot_mean"]["mean"],
            "cli_warnings": warnings}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=["torch", "vllm"], default="torch")
    parser.add_argument("--profile", type=Path, default=None, help="a run directory profiled on --engine")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    name = "measurement_health.json" if args.engine == "torch" else "measurement_health_vllm.json"
    out = args.out or RESULTS / name
    cores = os.cpu_count() or 1
    with tempfile.TemporaryDirectory(prefix="health_") as tmp:
        folder = Path(tmp)
        (folder / "w.toml").write_text(WORKLOAD)
        profile = args.profile or folder / "profiled"
        if args.profile is None:
            for stage in (["profile", "--engine", args.engine, "--quick", "--out", str(profile)],
                          ["fit", str(profile)]):
                subprocess.run([sys.executable, "-m", "autospec", *stage], check=True, capture_output=True, cwd=ROOT)
        load_start = list(os.getloadavg())
        quiet = replay(folder, 0, args.engine, profile)
        busy = replay(folder, cores, args.engine, profile)
    goals = {"busy_flagged_disturbed": bool(busy["disturbed"]),
             "quiet_not_disturbed": quiet["disturbed"] is False,
             "quiet_host_load_not_disturbed": not (quiet["host_load"] or {}).get("disturbed", True)}
    result = {"schema_version": SCHEMA_VERSION, "benchmark": "measurement_health", "engine": args.engine,
              "profile": f"fresh --quick {args.engine} profile of this host" if args.profile is None
              else str(profile.relative_to(ROOT) if profile.is_relative_to(ROOT) else profile),
              "quiet": quiet, "busy": busy,
              "goals_met": goals, "load_average_at_start": load_start, "hardware": hardware_info()}
    write_json(out, result)
    for name, run in (("quiet", quiet), ("busy", busy)):
        load = run["host_load"] or {}
        print(f"{name}: disturbed={run['disturbed']} others_cpu_share={load.get('others_cpu_share')} "
              f"host_speed={(run['host_speed'] or {}).get('range')} tpot_mean={run['tpot_mean_static_k2']:.4f}")
    print(f"goals: {goals} -> {out}")


if __name__ == "__main__":
    main()
