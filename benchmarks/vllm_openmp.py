"""Does Intel OpenMP make vLLM's SD faster on this host? Times vLLM's latency profile (the grid
`autospec profile --engine vllm --quick` times, on the bundled pair) three times back to back — on GNU
libgomp (what vLLM preloads itself), with Intel's libiomp5 preloaded, on GNU again: a bracket — under each
thread binding (`--bind`), and compares them row by row; `--brackets N` alternates N such brackets.

    python benchmarks/vllm_openmp.py [--bind auto --bind 0-1] [--brackets 1] [--grid quick|tiny]
        [--out benchmarks/results/vllm_openmp.json]

Why (issue 16, docs/vllm.md, "Install"): vLLM's CPU guide asks for libiomp5 in LD_PRELOAD, and vLLM measured
SD ~2x faster with it on a Xeon 8580 (vllm-project/vllm#44191); autospec profiles vLLM as `vllm serve`
runs in the same environment, records the runtime its worker ran on and warns when SD was priced on
several GNU threads. This measures what the choice is worth here. A binding is VLLM_CPU_OMP_THREADS_BIND
("auto": vLLM's own, which on a 2-CPU host leaves one CPU to the worker, so one OpenMP thread; "0-1": both
CPUs, two threads). Each profile runs in its own process, started with the runtime's LD_PRELOAD, and
its worker's record (`openmp.worker_runtime`) must read the runtime it was given, else the run is refused.

Per binding and phase (model, phase) it reports the median over the rows of Intel's time over the
geometric mean of its two GNU neighbours (`intel_over_gnu`, with a bootstrap 95% CI over the rows: a
drift linear in time cancels) and of the second GNU run's time over the first's (`gnu_drift`: the host's
drift across the bracket). An effect counts (`beyond_drift`) only when Intel's ratio is further from 1
than the whole drift and its CI excludes 1. That is a screen, not a test: the CI is over rows timed within
the same three runs, and one bracket cannot rule out a host that sped up and slowed down again within it
(on the 2-CPU host, two brackets at one thread read opposite per-phase effects, each "beyond the drift":
benchmarks/results/vllm_openmp.json and vllm_openmp_repeat.json). `--brackets N` (N ≥ 2) is the test: it
alternates 2N + 1 runs (GNU, Intel, GNU, Intel, ..., GNU), compares each Intel run with its own two GNU
neighbours, and reports per bind and phase the brackets' ratios (`across_brackets`: their median and
range, `shown_by_every_bracket` when every bracket's ratio lies on the same side of 1 and beyond its own
drift). Act only on an effect every bracket shows [chosen: unanimity rather than a test over N brackets
— N is 2 or 3 at ~5 min a profile, too few for a significance level to mean much]. No goal: a
diagnostic, one host's answer. Run it alone on a quiet machine (a quick grid is ~4.5-6 min a profile on
2 cores: 2N + 1 profiles a binding, ~30 min for the default two bindings and one bracket).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.stats import bootstrap

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import OneLineParser, run  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ROW_KEYS = ["model", "phase", "batch", "tokens", "context"]
ORDER = ("gnu", "intel", "gnu")  # the bracket: Intel between two GNU runs
BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"
# what VLLM_CPU_OMP_THREADS_BIND takes: CPU ids and ranges, "|" between ranks' sets; "auto" is vLLM's own
BIND_PATTERN = re.compile(r"auto|[0-9]+(-[0-9]+)?([,|][0-9]+(-[0-9]+)?)*")


def grid(name: str):
    """The profile settings timed: `quick` is `autospec profile --quick`'s latency grid; `tiny` a grid of
    a few shapes for the test."""
    from autospec.calibration import ProfileSettings

    if name == "quick":
        return ProfileSettings.quick()
    return ProfileSettings(k_max=2, batches=[1, 2], contexts=[32], prefill_tokens=[32], repeats=3, warmup=1)


def child(out: Path, grid_name: str) -> None:
    """One profile in this process (started with its runtime's LD_PRELOAD): latency rows to out/latency.parquet,
    the worker's record and the wall time to out/worker.json."""
    from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET
    from autospec.serving.vllm.latency_profile import profile_latency

    worker: dict = {}
    start = time.perf_counter()
    rows = profile_latency(BUNDLED_TARGET, BUNDLED_DRAFT, grid(grid_name), worker=worker)
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_parquet(out / "latency.parquet")
    (out / "worker.json").write_text(json.dumps({**worker, "wall_s": time.perf_counter() - start}))


def run_profile(runtime: str, bind: str, grid_name: str, out: Path) -> tuple[pd.Series, dict[str, Any]]:
    """A child profile on `runtime` under `bind`: its rows' median_s by ROW_KEYS and its worker record,
    checked to have run on `runtime`."""
    from autospec.errors import InputError
    from autospec.serving.vllm.openmp import intel_openmp_library

    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", BIND_ENV)}
    if runtime == "intel":
        env["LD_PRELOAD"] = str(intel_openmp_library())
    if bind != "auto":
        env[BIND_ENV] = bind
    # its own session, so that the vLLM processes it leaves behind (they would share the CPUs with the next
    # profile) are ended by process group, and nobody else's vLLM is touched
    profile = subprocess.Popen([sys.executable, __file__, "--child", str(out), "--grid", grid_name], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True)
    _, stderr = profile.communicate()
    try:
        os.killpg(profile.pid, signal.SIGKILL)
    except ProcessLookupError:  # none left
        pass
    if profile.returncode != 0:
        raise RuntimeError(f"the {runtime} profile under bind {bind} failed:\n{stderr[-3000:]}")
    worker = json.loads((out / "worker.json").read_text())
    if worker.get("openmp") != runtime:
        raise InputError(f"the profile started for {runtime} OpenMP ran on {worker.get('openmp')} "
                         f"(LD_PRELOAD {worker.get('ld_preload')!r}): nothing is compared")
    rows = pd.read_parquet(out / "latency.parquet").set_index(ROW_KEYS)["median_s"]
    return rows, worker


def compare(gnu_first: pd.Series, intel: pd.Series, gnu_second: pd.Series) -> dict[str, Any]:
    """Per (model, phase) and over all rows shared by the three runs: the median of Intel's time over the
    geometric mean of its GNU neighbours (with a bootstrap 95% CI over the rows), and of the second GNU run's
    over the first's. `beyond_drift`: Intel's median is further from 1 than the drift and its CI excludes 1."""
    both = pd.concat({"g1": gnu_first, "i": intel, "g2": gnu_second}, axis=1, join="inner")
    ratios = pd.DataFrame({"intel_over_gnu": both["i"] / np.sqrt(both["g1"] * both["g2"]),
                           "gnu_drift": both["g2"] / both["g1"]})

    def summary(frame: pd.DataFrame) -> dict[str, Any]:
        intel_ratio, drift = float(frame["intel_over_gnu"].median()), float(frame["gnu_drift"].median())
        low, high = intel_ratio, intel_ratio
        if len(frame) > 2:  # the rows' spread: shapes timed at other moments of the same runs
            ci = bootstrap((frame["intel_over_gnu"].to_numpy(),), np.median, confidence_level=0.95,
                           n_resamples=2000, method="percentile", random_state=0).confidence_interval
            low, high = float(ci.low), float(ci.high)
        return {"rows": len(frame), "intel_over_gnu": intel_ratio, "intel_over_gnu_ci95": [low, high],
                "gnu_drift": drift, "beyond_drift": abs(intel_ratio - 1) > abs(drift - 1) and not low <= 1 <= high}

    phases = {f"{model}/{phase}": summary(group) for (model, phase), group in ratios.groupby(level=["model", "phase"])}
    return {"all_rows": summary(ratios), "phases": phases}


def run_order(brackets: int) -> list[str]:
    """The runtimes of the 2N + 1 runs of N brackets: GNU, Intel, GNU, ..., GNU (bracket b is runs 2b..2b+2,
    so neighbouring brackets share a GNU run)."""
    return [ORDER[0], *[runtime for _ in range(brackets) for runtime in ORDER[1:]]]


def across(brackets: list[dict[str, Any]]) -> dict[str, Any]:
    """Per phase (and over all rows) what `compare`'s brackets read: the median and range of their Intel ratios
    and of their drifts, and `shown_by_every_bracket`: every bracket counted the effect (`beyond_drift`) on the
    same side of 1. Phases that not every bracket has are left out."""
    def summary(parts: list[dict[str, Any]]) -> dict[str, Any]:
        ratios, drifts = [p["intel_over_gnu"] for p in parts], [p["gnu_drift"] for p in parts]
        same_side = all(r < 1 for r in ratios) or all(r > 1 for r in ratios)
        return {"brackets": len(parts), "intel_over_gnu": float(np.median(ratios)),
                "intel_over_gnu_range": [min(ratios), max(ratios)], "gnu_drift_range": [min(drifts), max(drifts)],
                "shown_by_every_bracket": same_side and all(p["beyond_drift"] for p in parts)}

    shared = [phase for phase in brackets[0]["phases"] if all(phase in b["phases"] for b in brackets)]
    return {"all_rows": summary([b["all_rows"] for b in brackets]),
            "phases": {phase: summary([b["phases"][phase] for b in brackets]) for phase in shared}}


def bind_result(bind: str, runs: list[tuple[pd.Series, dict[str, Any]]]) -> dict[str, Any]:
    """One binding's record from its runs in `run_order`: with one bracket its `compare`; with more, each
    bracket's `compare` and what they read together (`across`)."""
    workers = [worker for _, worker in runs]
    brackets = [compare(*(rows for rows, _ in runs[2 * b:2 * b + 3])) for b in range(len(runs) // 2)]
    if len(brackets) == 1:
        return {"bind": bind, "workers": workers, **brackets[0]}
    return {"bind": bind, "workers": workers, "brackets": brackets, "across_brackets": across(brackets)}


def verdict_line(result: dict[str, Any]) -> str:
    """What one binding's record reads over all rows, in a line."""
    if "across_brackets" not in result:
        overall = result["all_rows"]
        return (f"Intel over GNU {overall['intel_over_gnu']:.3f} (GNU drift across the bracket "
                f"{overall['gnu_drift']:.3f}; {'beyond' if overall['beyond_drift'] else 'within'} the drift)")
    overall = result["across_brackets"]["all_rows"]
    low, high = overall["intel_over_gnu_range"]
    shown = "shown by every bracket" if overall["shown_by_every_bracket"] else "not shown by every bracket"
    return (f"Intel over GNU {overall['intel_over_gnu']:.3f} over {overall['brackets']} brackets "
            f"({low:.3f}-{high:.3f}; {shown})")


def main() -> None:
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--bind", action="append", help="a VLLM_CPU_OMP_THREADS_BIND to compare under, repeatable "
                    "(default: auto, then 0-1); auto: vLLM's own binding")
    ap.add_argument("--brackets", type=int, default=1, help="Intel runs per binding, each between two GNU runs "
                    "(2N + 1 profiles a binding); more than one reports whether every bracket shows the effect")
    ap.add_argument("--grid", choices=("quick", "tiny"), default="quick")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_openmp.json")
    ap.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.grid)
        return

    from autospec.artifacts import hardware_info, write_json
    from autospec.config import SCHEMA_VERSION
    from autospec.errors import InputError
    from autospec.serving.vllm.openmp import intel_openmp_library

    binds = args.bind or ["auto", "0-1"]
    if args.brackets < 1:
        ap.error(f"argument --brackets: {args.brackets} is not a count of brackets (1 or more)")
    for bind in binds:
        if not BIND_PATTERN.fullmatch(bind):
            ap.error(f"argument --bind: {bind!r} is neither auto nor CPU ids and ranges (e.g. 0-1)")
    if intel_openmp_library() is None:
        raise InputError("libiomp5.so is not in this environment (pip install intel-openmp): nothing to compare")

    order = run_order(args.brackets)
    load_at_start = os.getloadavg()
    results = []
    with tempfile.TemporaryDirectory(prefix="vllm_openmp_") as tmp:
        for bind in binds:
            runs = [run_profile(runtime, bind, args.grid, Path(tmp) / f"{bind}-{i}-{runtime}")
                    for i, runtime in enumerate(order)]
            result = bind_result(bind, runs)
            results.append(result)
            print(f"bind {bind}: {runs[0][1]['omp_threads']} thread(s); {verdict_line(result)}")
    write_json(args.out, {"schema_version": SCHEMA_VERSION, "benchmark": "vllm_openmp", "grid": args.grid,
                          "order": order, "binds": results, "load_average_at_start": load_at_start,
                          "load_average_at_end": os.getloadavg(), "hardware": hardware_info()})
    print(f"-> {args.out}")


if __name__ == "__main__":
    run(main)
