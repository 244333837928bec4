"""Simulator fidelity: the same workload replayed on the torch engine (wall clock) and on the simulator
calibrated from a profile of that engine; per strategy the relative error of sim vs torch.

    python benchmarks/sim_fidelity.py [--out benchmarks/results/sim_fidelity.json] [--full-profile]
                                      [--time-scale 0.5] [--strategies no-sd,static-k2,static-k4,adaspec]
                                      [--run-dir DIR] [--reuse-profile]

Goal (issue 4): |sim − torch| / torch <= 0.05 for mean TPOT and throughput (output tokens/s), <= 0.10
for p99 TPOT, for every strategy. The profile is taken inside the script (`autospec profile --quick`
unless --full-profile, then `autospec fit`) on the same machine, right before the replays, so the
simulator is calibrated on exactly the engine it is compared with, and its acceptance traces are
recorded on the prompts the torch replay sends (`autospec profile --workload`: the workload's texts,
cyclically padded to each request's prompt length, as `autospec evaluate` builds them, 24 of them; the
simulator replays those requests on their own traces, the others on one of them). Traced as decoded
text instead, 17 of 24 came back as other ids and the traces accepted 0.83 of K=2 drafts where the
replay of the same requests accepted 0.71 (exact ids: 0.70). The workload is
workloads/azure-code-cpu.toml (200 requests of the Azure 2023 code trace) with its arrivals re-timed
by --time-scale so one replay takes under a minute.
Torch replays every strategy --repeats times (2); the largest gap of one torch repeat from the torch
mean is reported as `torch_noise_*`, the floor the sim errors should be read against. Run it on an
otherwise idle machine (the script records the load average it started at); ~9 minutes on 2 cores.

A disturbed measurement never judges the simulator (issue 16): every torch replay is bracketed by the
host-speed check (`autospec.profile.HostSpeedCheck`: a few verify calls at one profiled shape over the
profile's median), and when any ratio lies outside 1 ± 0.10 the host ran at another speed than when it
was profiled — on the shared 2-core VMs this runs on it drifts by that much within minutes (one run
here replayed at 0.86–0.92x the profile's step time, three minutes after profiling, and every strategy's
sim error came out 8–16% pessimistic). Then profile and replays are taken again, up to
--quiet-retries times (1); `host_speed` records every try's ratios, and `judges_the_simulator` is false
when the kept try was still disturbed (its errors are then the host's, not the simulator's).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
WORKLOAD = ROOT / "workloads" / "azure-code-cpu.toml"
GOALS = {"tpot_mean": 0.05, "throughput_tok_s": 0.05, "tpot_p99": 0.10}


def autospec(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "autospec.cli", *args], check=True, env={**os.environ, "COLUMNS": "160"})


def workload_variant(src: Path, dst: Path, **overrides) -> Path:
    """Write `src`'s `[workload]` table with `overrides` replacing (or adding) keys to `dst`; a trace
    file named relative to `src` is made absolute so the copy reads the same trace from anywhere
    (`bundled:` traces are found by name). Keys are checked when the copy is loaded (`load_workload`)."""
    import tomllib

    import tomli_w

    table = {**tomllib.loads(src.read_text())["workload"], **overrides}
    trace = table.get("trace")
    if isinstance(trace, str) and not trace.startswith("bundled:"):
        table["trace"] = str((src.parent / trace).resolve())
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(tomli_w.dumps({"workload": table}))
    return dst


def scaled_workload(run_dir: Path, time_scale: float) -> Path:
    """The bundled Azure code workload with `time_scale` replaced."""
    return workload_variant(WORKLOAD, run_dir / "workload.toml", time_scale=time_scale)


def workload_limits(workload: Path) -> dict[str, int]:
    """The longest prompt and output of the workload's requests (tokens)."""
    from autospec.workloads.spec import load_workload

    requests = list(load_workload(workload).requests())
    return {"max_prompt_tokens": max(r.prompt_len for r in requests),
            "max_output_tokens": max(2, max(r.output_len for r in requests))}


def per_repeat(result, slo) -> dict[str, list[dict]]:
    """Metrics of every (strategy, repeat) of an EvalResult."""
    from autospec.serving.metrics import compute_metrics

    out: dict[str, list[dict]] = {}
    for (name, _), req in result.requests.groupby(["strategy", "repeat"], sort=False):
        steps = result.steps[(result.steps["strategy"] == name) & (result.steps["repeat"] == _)]
        out.setdefault(name, []).append(compute_metrics(req, steps, slo))
    return out


def rel_err(sim: float, real: float) -> float:
    return abs(sim - real) / abs(real)


def fidelity_rows(real_result, sim_summary: dict, slo, engine: str, keys, also=()) -> list[dict]:
    """Per strategy: the real engine's and the simulator's mean of each metric in `keys`, the sim's
    relative error, the real engine's value per repeat, and its noise — the largest relative gap of one
    repeat from the repeats' mean (the floor the sim errors are read against); `also` adds both
    engines' means of more metrics. Columns are prefixed with `engine` (torch, vllm) and "sim"."""
    real = real_result.summary
    runs_of = per_repeat(real_result, slo)
    rows = []
    for name in real["strategies"]:
        r, s = real["strategies"][name], sim_summary["strategies"][name]
        row = {"strategy": name}
        for key in keys:
            row[f"{engine}_{key}"] = r[key]["mean"]
            row[f"sim_{key}"] = s[key]["mean"]
            row[f"err_{key}"] = round(rel_err(s[key]["mean"], r[key]["mean"]), 4)
            runs = [m[key] for m in runs_of[name]]
            row[f"{engine}_{key}_repeats"] = runs
            row[f"{engine}_noise_{key}"] = round(max(rel_err(v, r[key]["mean"]) for v in runs), 4)
        for key in also:
            row[f"{engine}_{key}"] = r[key]["mean"]
            row[f"sim_{key}"] = s[key]["mean"]
        rows.append(row)
        print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=RESULTS / "sim_fidelity.json")
    ap.add_argument("--strategies", default="no-sd,static-k2,static-k4,adaspec")
    ap.add_argument("--time-scale", type=float, default=0.5, help="replaces the workload's time_scale")
    ap.add_argument("--full-profile", action="store_true", help="the default profile grid instead of --quick")
    ap.add_argument("--run-dir", type=Path, default=None, help="keep the profile here (default: a temp dir)")
    ap.add_argument("--reuse-profile", action="store_true", help="skip `autospec profile` if --run-dir has one")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--quiet-retries", type=int, default=1, help="profile and replay again when the host-speed "
                    "check says the host ran off its profiled speed")
    ap.add_argument("--repeats", type=int, default=2, help="torch replays per strategy (their spread is the "
                    "noise floor the sim errors are read against)")
    ap.add_argument("--profile-prompts", type=int, default=24, help="workload prompts to record traces on")
    args = ap.parse_args()

    from autospec.artifacts import hardware_info, read_json, write_json
    from autospec.evaluate import EvaluateSpec, run_evaluate
    from autospec.profile import HOST_SPEED_TOLERANCE, off_profile

    load_at_start = os.getloadavg()
    tmp = None
    if args.run_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="sim_fidelity_")
        run_dir = Path(tmp.name)
    else:
        run_dir = args.run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
    workload = scaled_workload(run_dir, args.time_scale)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    # at the workload's own load on both engines: capacity is searched on the simulator only (evaluate)
    common = dict(workload=workload, strategies=strategies, profile=run_dir, max_batch=args.max_batch,
                  capacity=None)
    tries: list[dict] = []
    for attempt in range(args.quiet_retries + 1):
        t0 = time.perf_counter()
        if attempt or not (args.reuse_profile and (run_dir / "profile" / "latency.parquet").is_file()):
            # traces as long as the workload's outputs (a shorter trace wraps: the simulator would replay
            # early positions' acceptance late in a request), on the ids the torch replay sends (--workload)
            limits = workload_limits(workload)
            autospec("profile", "--out", str(run_dir), "--workload", str(workload),
                     "--prompts-per-domain", str(args.profile_prompts),
                     "--trace-tokens", str(limits["max_output_tokens"]),
                     *([] if args.full_profile else ["--quick"]))
        profile_s = time.perf_counter() - t0
        autospec("fit", str(run_dir))
        t1 = time.perf_counter()
        real_result = run_evaluate(EvaluateSpec(engine="torch", repeats=args.repeats, **common), run_dir / "torch")
        torch_s = time.perf_counter() - t1
        ratios = (real_result.summary.get("host_speed") or {}).get("ratios") or {}
        every = [r for runs in ratios.values() for r in runs]
        tries.append({"attempt": attempt, "ratios": ratios, "range": [min(every), max(every)] if every else None,
                      "disturbed": off_profile(every)})
        print(f"try {attempt}: host-speed ratios {tries[-1]['range']} (disturbed: {tries[-1]['disturbed']})",
              flush=True)
        if not tries[-1]["disturbed"]:
            break
    fit = read_json(run_dir / "fit" / "models.json")
    real = real_result.summary
    sim_spec = EvaluateSpec(engine="sim", **common)
    sim = run_evaluate(sim_spec, run_dir / "sim").summary

    rows = fidelity_rows(real_result, sim, sim_spec.slo, "torch", GOALS,
                         ("acceptance_rate", "accepted_per_step", "mean_batch", "throughput_vs_no_sd", "ttft_mean"))
    max_err = {key: max(row[f"err_{key}"] for row in rows) for key in GOALS}
    max_noise = {key: max(row[f"torch_noise_{key}"] for row in rows) for key in GOALS}
    result = {
        "benchmark": "sim_fidelity",
        "rows": rows,
        "max_errors": max_err,
        "goals": GOALS,
        "torch_noise_max": max_noise,
        "torch_repeats": args.repeats,
        "judges_the_simulator": not tries[-1]["disturbed"],
        "host_speed": {"tolerance": HOST_SPEED_TOLERANCE, "tries": tries},
        "met": {key: max_err[key] <= GOALS[key] for key in GOALS},
        "profile": {"quick": not args.full_profile, "wall_s": round(profile_s, 1),
                    "linear": fit["linear"], "linear_mape": fit["linear_mape"], "prefill": fit["prefill"],
                    "traces_on": "workload prompts" if not args.reuse_profile else "as found in --run-dir"},
        "workload": {"spec": "workloads/azure-code-cpu.toml", "time_scale": args.time_scale, **real["workload"],
                     "path": None},
        "engine": {"max_batch": args.max_batch, "k_max": real["engine"]["k_max"], "temperature": 0.0,
                   "torch_replay_s": round(torch_s, 1)},
        "load_average_at_start": load_at_start,
        "hardware": hardware_info(),
    }
    write_json(args.out, result)
    print(f"max errors {max_err} (goals {GOALS}) -> {args.out}")
    if tries[-1]["disturbed"]:
        print(f"the host ran {tries[-1]['range']} x its profiled step time in the replays (outside 1 ± "
              f"{HOST_SPEED_TOLERANCE}): these errors do not judge the simulator; re-run on a quiet host")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
