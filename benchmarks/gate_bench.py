"""The CI performance gate's benchmark: a small simulated evaluation that `autospec gate` compares with
the committed baseline, `reports/baseline.json`.

    python benchmarks/gate_bench.py [--out runs/gate-bench] [--write-baseline]

It runs `autospec evaluate --engine sim` on the bundled bursty workload (workloads/bursty.toml) with
no-sd, static-k2, static-k4 and adaspec, 3 repeats, seed 0, over the committed profile
`reports/ci-profile/`: a real `autospec profile --quick` + `autospec fit` of the bundled pair on a quiet
2-core CPU (its manifest.json records the command: `--quick --prompts-per-domain 24` on the default
prompt sets, so code requests replay traces of held-out stdlib code, chat and math requests traces of
the project's own chat and math prompts). Profile on a quiet machine: under a load average of ~8 on 2
cores the fitted latency model's held-out error was 80-110% instead of 9-17%. The summary lands in
OUT/eval/summary.json (~15-20 s on 2 cores); --write-baseline also copies it to reports/baseline.json
(do that only on purpose, and commit it with the change that moves the numbers — a changed workload
file or profile moves them too, and the gate's verdict then notes that the workload differs).

Why the simulator and a committed profile: CI machines differ and are noisy, so a real-engine timing
or a profile measured on the CI runner would move with the runner, not with the code. The simulator
given a profile, a workload and a seed is deterministic, so on an unchanged tree the run reproduces the
baseline (up to floating-point last digits across platforms, which the gate's noise floor absorbs),
and a change to the serving loop, a policy, the simulator, the fit or the metrics that moves capacity, goodput
or acceptance shows up as a change of the summary. What it cannot see is a change in real engine
speed: that is `benchmarks/engine_speed.py`'s job, gated by hand on one machine.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROFILE = Path("reports/ci-profile")  # relative to REPO, so the summary carries no machine's paths
WORKLOAD = Path("workloads/bursty.toml")
STRATEGIES = "no-sd,static-k2,static-k4,adaspec"
REPEATS = 3
SEED = 0
BASELINE = REPO / "reports" / "baseline.json"


def run_bench(out: Path) -> Path:
    """Run the evaluation into `out`; returns the summary's path."""
    out = Path(out).resolve()
    cmd = [sys.executable, "-m", "autospec", "evaluate", "--engine", "sim", "--profile", str(PROFILE),
           "--workload", str(WORKLOAD), "--strategies", STRATEGIES, "--repeats", str(REPEATS),
           "--seed", str(SEED), "--no-shift", "--out", str(out)]  # the gate reads no shift table
    subprocess.run(cmd, cwd=REPO, check=True)
    return out / "eval" / "summary.json"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=REPO / "runs" / "gate-bench", help="run directory to write")
    ap.add_argument("--write-baseline", action="store_true", help=f"copy the summary to {BASELINE}")
    args = ap.parse_args()
    t0 = time.perf_counter()
    summary = run_bench(args.out)
    print(f"gate bench: {summary} in {time.perf_counter() - t0:.1f} s")
    if args.write_baseline:
        shutil.copyfile(summary, BASELINE)
        print(f"baseline written to {BASELINE}")


if __name__ == "__main__":
    main()
