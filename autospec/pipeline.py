"""`autospec run`: the stages in one go on a run config (docs/architecture.md, "Stages").

profile → fit → tune → evaluate → report, each the same function its own command calls, into one run
directory:

    DIR/profile/, DIR/fit/            the engine's measurements and models (or copies of `profile.reuse`)
    DIR/tune/, DIR/deploy/            the Optuna study's results and the deployable configs
    DIR/eval-sim/eval/                every listed strategy + the tuned one on the simulator
    DIR/eval-torch/eval/              `real_strategies` + the tuned one on the real torch engine
    DIR/report.html, DIR/summary.md   the report over all of it (simulator vs real included)

The embedded default (no config) is the bundled pair on the torch engine and the bundled bursty
workload, with the SLO of `autospec.config.SloSpec`; it is sized to finish in about ten minutes on a
2-core CPU (a quick profile, 40 simulated trials, one real replay of two strategies). `[tune] time_budget`
(`autospec run --time-budget`) caps the tune stage's search; the other stages are bounded by their
settings (a fixed profile grid, the workload's requests × strategies × repeats).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable

from autospec.config import RunSpec
from autospec.errors import InputError

Progress = Callable[[str, int], Callable[[int], None]]


def run_pipeline(spec: RunSpec, out_dir: Path, progress: Progress | None = None,
                 say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Run spec.stages (except `generate`, which the CLI runs) in order; returns what each produced."""
    from autospec.evaluate import EvaluateSpec, run_evaluate
    from autospec.fit import fit_profile, write_fit
    from autospec.profile import ProfileSettings, profile_pair
    from autospec.tune import TuneSpec, run_tune

    out_dir = Path(out_dir)
    stages = [s for s in spec.stages if s != "generate"]
    if not spec.workload.is_file() and {"tune", "evaluate"} & set(stages):
        raise InputError("no such workload file", path=spec.workload, field="workload")
    slo = spec.slo  # the [slo] table (default: config.SloSpec's, the default of evaluate and tune too)
    done: dict[str, Any] = {"stages": {}}
    timer = time.perf_counter

    def stage(name: str, fn: Callable[[], Any]) -> Any:
        say(f"[{name}] …")
        t0 = timer()
        result = fn()
        done["stages"][name] = {"wall_s": timer() - t0}
        say(f"[{name}] done in {timer() - t0:.0f} s")
        return result

    reuse = spec.profile.reuse
    if "profile" in stages:
        if reuse is not None:
            if not (reuse / "profile" / "latency.parquet").is_file():
                raise InputError("profile.reuse is not a profiled run directory (no profile/latency.parquet)",
                                 path=reuse, field="profile.reuse")
            stage("profile", lambda: _copy_measurements(reuse, out_dir))
        else:
            settings = ProfileSettings.quick(spec.profile.k_max) if spec.profile.quick else \
                ProfileSettings(k_max=spec.profile.k_max)
            settings = settings.model_copy(update={"seed": spec.engine.seed})
            stage("profile", lambda: profile_pair(out_dir, spec.pair, settings, device=spec.engine.device,
                                                  progress=progress))
    if "fit" in stages and (reuse is None or not (out_dir / "fit" / "models.json").is_file()):
        models = stage("fit", lambda: fit_profile(out_dir, seed=spec.engine.seed))
        write_fit(out_dir, models)
        done["fit"] = {"linear_mape": models.linear_mape}

    tuned: Path | None = None
    if "tune" in stages:
        tune_spec = TuneSpec(workload=spec.workload, profile=out_dir, trials=spec.tune.trials,
                             objective=spec.tune.objective, slo=slo, min_attainment=spec.tune.min_attainment,
                             strategies=spec.tune.strategies, storage=spec.tune.storage, max_batch=spec.max_batch,
                             seed=spec.engine.seed, pair=spec.pair, time_budget_s=spec.tune.time_budget)
        tick = progress("tune trials", spec.tune.trials) if progress else None
        state = {"n": 0}

        def advance(count: int, _total: int) -> None:
            if tick is not None and count > state["n"]:
                tick(count - state["n"])
                state["n"] = count

        done["tune"] = stage("tune", lambda: run_tune(tune_spec, out_dir, progress=advance))
    if (out_dir / "tune" / "best.toml").is_file():
        tuned = out_dir / "tune" / "best.toml"

    if "evaluate" in stages:
        extra = [str(tuned)] if tuned is not None else []
        common = dict(workload=spec.workload, slo=slo, max_batch=spec.max_batch, repeats=spec.evaluate.repeats,
                      seed=spec.engine.seed, profile=out_dir)
        from autospec.fit import load_fit

        # the simulator can replay at most the chain length the profile recorded
        sim_k_max = min(spec.engine.k_max, load_fit(out_dir).models.k_max)
        sim = EvaluateSpec(strategies=[*spec.evaluate.strategies, *extra], engine="sim", k_max=sim_k_max, **common)
        done["evaluate_sim"] = stage("evaluate (simulator)",
                                     lambda: run_evaluate(sim, out_dir / "eval-sim", progress=progress).summary)
        if spec.evaluate.real_engine:
            real = EvaluateSpec(strategies=[*spec.evaluate.real_strategies, *extra], engine="torch",
                                pair=spec.pair, device=spec.engine.device, k_max=spec.engine.k_max, **common)
            done["evaluate_real"] = stage("evaluate (torch engine)",
                                          lambda: run_evaluate(real, out_dir / "eval-torch", progress=progress).summary)

    if "report" in stages:
        from autospec.report.build import write_report

        done["report"] = str(stage("report", lambda: write_report(out_dir)))
    return done


def _copy_measurements(source: Path, out_dir: Path) -> None:
    """profile/ (and fit/ when present) of an earlier run, so this run directory is self-contained."""
    for part in ("profile", "fit"):
        if (source / part).is_dir() and source.resolve() != out_dir.resolve():
            shutil.copytree(source / part, out_dir / part, dirs_exist_ok=True)
