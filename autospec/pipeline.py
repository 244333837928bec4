"""`autospec run`: the stages in one go on a run config (docs/architecture.md, "Stages").

profile → fit → tune → evaluate → report, each the same function its own command calls, into one run
directory:

    DIR/profile/, DIR/fit/            the engine's measurements and models (or copies of `profile.reuse`)
    DIR/tune/, DIR/deploy/            the Optuna study's results, its real-engine confirmation
                                      (`[tune] confirm_top`, autospec.confirm) and the deployable configs
    DIR/eval-sim/eval/                every listed strategy + the tuned one (and deploy/'s, when the
                                      confirmation picked another) on the simulator
    DIR/eval-torch/eval/              `real_strategies` + the same tuned one(s) on the real torch engine
                                      (DIR/eval-vllm/ with `[engine] kind = "vllm"`: every stage on vLLM —
                                      its profile, the confirmation, this replay)
    DIR/report.html, DIR/summary.md   the report over all of it (simulator vs real included)

The embedded default (no config) is the bundled pair on the torch engine and the bundled bursty
workload, with the SLO of `autospec.config.SloSpec`; it is sized to finish in about ten minutes on a
2-core CPU (a quick profile, 40 simulated trials, a confirmation of the top two, the best static K and
no-SD on a 60-request window, one real replay of two strategies). `[tune] time_budget`
(`autospec run --time-budget`) caps the tune stage's search; the other stages are bounded by their
settings (a profile grid sized by the workload's longest request, the workload's requests × strategies × repeats).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable

from autospec.config import RunSpec
from autospec.deploy import vllm_config
from autospec.errors import InputError
from autospec.evaluate import EvaluateSpec, resolve_strategies, run_evaluate
from autospec.fit import (
    FitModels,
    fit_profile,
    load_fit,
    loose_clocks,
    loose_clocks_warning,
    profiled_engine,
    write_fit,
)
from autospec.profile import ProfileSettings, profile_pair
from autospec.progress import format_duration
from autospec.report.build import write_report
from autospec.strategy import load_preset
from autospec.tune import TuneSpec, candidate_specs, check_storage, run_tune
from autospec.workloads.spec import load_workload

Progress = Callable[[str, int], Callable[[int], None]]
Stage = Callable[[str, Callable[[], Any]], Any]  # runs one stage: named, timed and announced


def run_pipeline(spec: RunSpec, out_dir: Path, progress: Progress | None = None,
                 say: Callable[[str], None] = lambda _m: None) -> dict[str, Any]:
    """Run spec.stages (except `generate`, which the CLI runs) in order; returns what each produced."""
    out_dir = Path(out_dir)
    stages = [s for s in spec.stages if s != "generate"]
    if not spec.workload.is_file() and {"tune", "evaluate"} & set(stages):
        raise InputError("no such workload file", path=spec.workload, field="workload")
    if spec.engine.kind == "vllm" and set(stages) & {"profile", "tune", "evaluate"}:
        from autospec.serving.vllm.engine import VLLM_MISSING, vllm_available

        if not vllm_available():  # before any stage runs, not after the search
            raise InputError(VLLM_MISSING, field="engine.kind")
    check_before_any_stage(spec, stages, out_dir)
    done: dict[str, Any] = {"stages": {}}
    stage = _stage_runner(done["stages"], say)
    reuse = spec.profile.reuse
    if "profile" in stages:
        _profile(spec, out_dir, stage, progress, say)
    if "fit" in stages and (reuse is None or not (out_dir / "fit" / "models.json").is_file()):
        def fit() -> FitModels:
            return stage("fit", lambda: fit_profile(out_dir, seed=spec.engine.seed))

        retries = spec.profile.loose_fit_retries if "profile" in stages and reuse is None else 0
        models, reprofiled = fit_measured(fit, lambda: _profile(spec, out_dir, stage, progress, say), retries, say)
        write_fit(out_dir, models)
        done["fit"] = {"linear_mape": models.linear_mape, "loose_clocks": loose_clocks(models),
                       "reprofiled": reprofiled}
    if "tune" in stages:
        done["tune"] = _tune(spec, out_dir, stage, progress)
    tuned = [p for p in (out_dir / "tune" / "best.toml", _deployed_if_other(done.get("tune"), out_dir)) if p]
    if "evaluate" in stages:
        _evaluate(spec, out_dir, [p for p in tuned if p.is_file()], stage, progress, done, say)
    if "report" in stages:
        done["report"] = str(stage("report", lambda: write_report(out_dir)))
    return done


def fit_measured(fit: Callable[[], FitModels], reprofile: Callable[[], None], retries: int,
                 say: Callable[[str], None]) -> tuple[FitModels, list[dict[str, float]]]:
    """The fit of a profile this run measured, profiled again (`reprofile`, then `fit`) up to `retries`
    times while the fit misses its own profile (`fit.loose_clocks`; `[profile] loose_fit_retries`): a
    profile timed through a slow spell of the host makes every simulated figure after it wrong (docs/vllm.md,
    run l), and a later spell is usually quiet. Returns the last fit, which a still-loose fit leaves warned
    of (`say`), and the loose clocks of each profile given up on."""
    models = fit()
    given_up: list[dict[str, float]] = []
    while (loose := loose_clocks(models)) and len(given_up) < retries:
        given_up.append(loose)
        say(f"[profile] {loose_clocks_warning(models)}: profiling again ({len(given_up)} of {retries})")
        reprofile()
        models = fit()
    if loose:
        say(f"[fit] warning: {loose_clocks_warning(models)}")
    return models, given_up


def check_before_any_stage(spec: RunSpec, stages: list[str], out_dir: Path) -> None:
    """What the later stages read, checked before the first stage writes anything: the workload (built:
    a bad trace or spec), the tune candidates and the evaluate strategies (every preset loaded), and for
    a report-only run that there is something to report. A bad [evaluate] table used to surface after
    profile/ and fit/ were written, leaving a half-made run."""
    if "report" in stages and not {"profile", "fit", "tune", "evaluate"} & set(stages) and not any(
            (out_dir / part).is_dir() for part in ("profile", "fit", "tune", "eval", "eval-sim", "eval-torch",
                                                   "eval-vllm")):
        raise InputError("nothing to report: no profile/, fit/, tune/ or eval*/ in the run directory "
                         "(stages = [\"report\"] reports an earlier run's --out)", path=out_dir)
    needs_profile = [s for s in ("fit", "tune", "evaluate") if s in stages]
    if needs_profile and "profile" not in stages and not (out_dir / "profile" / "latency.parquet").is_file():
        raise InputError(f"stage {needs_profile[0]} needs a profile: add \"profile\" to stages (with [profile] "
                         "reuse to copy an earlier one), or point --out at a profiled run directory", path=out_dir,
                         field="stages")
    if {"tune", "evaluate"} & set(stages) or ("profile" in stages and spec.workload.is_file()):
        from autospec.serving.factory import check_workload_fits  # lazily: torch (~2 s), which a sim-only run skips

        trace = load_workload(spec.workload)
        # a request the pair cannot hold stops the real engine (profile, confirmation, real evaluate) minutes in
        if ("profile" in stages and spec.profile.reuse is None) or ("evaluate" in stages and spec.evaluate.real_engine):
            check_workload_fits(trace, spec.pair, spec.engine.k_max, path=spec.workload)
        elif "tune" in stages and spec.tune.confirm_top:  # the confirmation replays the first requests only
            check_workload_fits(trace.cap(spec.tune.confirm_requests), spec.pair, spec.engine.k_max,
                                path=spec.workload)
    if "tune" in stages:
        _with_prefix("tune.strategies", lambda: candidate_specs(spec.tune.strategies))
        if spec.tune.storage is not None:  # a journal that cannot hold the study, an RDB that does not answer
            try:
                check_storage(spec.tune.storage, connect=True)
            except InputError as exc:
                raise InputError(exc.problem, path=exc.path, line=exc.line, field="tune.storage") from None
    if "evaluate" in stages:
        for field, names in (("evaluate.strategies", spec.evaluate.strategies),
                             ("evaluate.real_strategies", spec.evaluate.real_strategies if spec.evaluate.real_engine
                              else ["no-sd"])):
            if not names and "tune" not in stages:  # tune would add its pick; without it nothing is evaluated
                raise InputError("lists no strategy, and no tune stage adds one", field=field)
        _with_prefix("evaluate.strategies", lambda: resolve_strategies(spec.evaluate.strategies))
        if spec.evaluate.real_engine:
            _with_prefix("evaluate.real_strategies", lambda: resolve_strategies(spec.evaluate.real_strategies))


def _with_prefix(field: str, check: Callable[[], Any]) -> None:
    """Run a check whose InputError names a CLI flag (--strategies) as the config field it came from."""
    try:
        check()
    except InputError as exc:
        if exc.field in (None, "strategies"):
            raise InputError(exc.problem, path=exc.path, line=exc.line, field=field) from None
        raise


def _stage_runner(walls: dict[str, Any], say: Callable[[str], None]) -> Stage:
    """A stage runner that announces each stage and records its wall time in `walls`."""
    timer = time.perf_counter

    def stage(name: str, fn: Callable[[], Any]) -> Any:
        say(f"[{name}] …")
        t0 = timer()
        result = fn()
        # a stage run again (a profile re-timed, fit_measured) adds its time
        walls[name] = {"wall_s": walls.get(name, {}).get("wall_s", 0.0) + timer() - t0}
        say(f"[{name}] done in {timer() - t0:.0f} s")
        return result

    return stage


def _profile(spec: RunSpec, out_dir: Path, stage: Stage, progress: Progress | None,
             say: Callable[[str], None]) -> None:
    """Measure the pair into DIR/profile/, or copy `profile.reuse`'s measurements."""
    reuse = spec.profile.reuse
    if reuse is not None:
        if not (reuse / "profile" / "latency.parquet").is_file():
            raise InputError("profile.reuse is not a profiled run directory (no profile/latency.parquet)",
                             path=reuse, field="profile.reuse")
        if profiled_engine(reuse) != spec.engine.kind:  # the simulator and the confirmation follow the profile
            raise InputError(f"profile.reuse measured the {profiled_engine(reuse)} engine, but [engine] kind is "
                             f"{spec.engine.kind!r}: profile on the engine the run serves with",
                             path=reuse, field="profile.reuse")
        stage("profile", lambda: _copy_measurements(reuse, out_dir))
        return
    settings = ProfileSettings.quick(spec.profile.k_max) if spec.profile.quick else \
        ProfileSettings(k_max=spec.profile.k_max)
    settings = settings.model_copy(update={"seed": spec.engine.seed})
    # the workload the run tunes / evaluates: trace the prompts its real replay sends (profile_pair)
    workload = spec.workload if spec.workload.is_file() else None
    result = stage("profile", lambda: profile_pair(out_dir, spec.pair, settings, device=spec.engine.device,
                                                   engine_kind=spec.engine.kind, progress=progress, workload=workload))
    for warning in result.warnings:  # as `autospec profile` prints them (the vLLM worker's OpenMP runtime)
        say(f"[profile] warning: {warning}")


def _tune(spec: RunSpec, out_dir: Path, stage: Stage, progress: Progress | None) -> dict[str, Any]:
    """The tune stage on the run's SLO (the [slo] table: config.SloSpec's default, as evaluate and tune)."""
    tune_spec = TuneSpec(workload=spec.workload, profile=out_dir, trials=spec.tune.trials,
                         objective=spec.tune.objective, scope=spec.tune.scope, slo=spec.slo,
                         min_attainment=spec.tune.min_attainment,
                         strategies=spec.tune.strategies, storage=spec.tune.storage, jobs=spec.tune.jobs,
                         max_batch=spec.max_batch,
                         seed=spec.engine.seed, pair=spec.pair, time_budget_s=spec.tune.time_budget,
                         confirm_top=spec.tune.confirm_top, confirm_repeats=spec.tune.confirm_repeats,
                         confirm_requests=spec.tune.confirm_requests)
    tick = progress("tune trials", spec.tune.trials) if progress else None
    state = {"n": 0}

    def advance(count: int, _total: int) -> None:
        if tick is not None and count > state["n"]:
            tick(count - state["n"])
            state["n"] = count

    return stage("tune", lambda: run_tune(tune_spec, out_dir, progress=advance))


def _deployed_if_other(tune: dict[str, Any] | None, out_dir: Path) -> Path | None:
    """deploy/'s strategy file when it is not the study's best (the best is not deployable, or the real
    engine's confirmation recommended another trial): evaluated beside it."""
    if not tune or (tune.get("deployed") or {}).get("number") == (tune.get("best") or {}).get("number"):
        return None
    return out_dir / "deploy" / "autospec_strategy.toml"


def _evaluate(spec: RunSpec, out_dir: Path, tuned: list[Path], stage: Stage, progress: Progress | None,
              done: dict[str, Any], say: Callable[[str], None]) -> None:
    """Every listed strategy and the tuned one(s) — the study's best, and deploy/'s when it is another —
    on the simulator (DIR/eval-sim/), then `real_strategies` and the tuned one(s) on the torch engine
    (DIR/eval-torch/); summaries into `done`."""
    extra = [str(p) for p in tuned]
    common = dict(workload=spec.workload, slo=spec.slo, max_batch=spec.max_batch, repeats=spec.evaluate.repeats,
                  seed=spec.engine.seed, profile=out_dir)
    # the simulator can replay at most the chain length the profile recorded
    sim_k_max = min(spec.engine.k_max, load_fit(out_dir).models.k_max)
    sim = EvaluateSpec(strategies=[*spec.evaluate.strategies, *extra], engine="sim", k_max=sim_k_max,
                       jobs=spec.evaluate.jobs, **common)
    done["evaluate_sim"] = stage("evaluate (simulator)",
                                 lambda: run_evaluate(sim, out_dir / "eval-sim", progress=progress).summary)
    if spec.evaluate.real_engine:
        kind = spec.engine.kind
        if kind == "vllm":  # vLLM replays only what it can express (tune --scope all may pick otherwise)
            extra = [p for p in extra if vllm_config(load_preset(p), spec.pair, spec.max_batch, k_max=sim_k_max,
                                                     fit=out_dir)["supported"]]
        real = EvaluateSpec(strategies=[*spec.evaluate.real_strategies, *extra], engine=kind,
                            pair=spec.pair, device=spec.engine.device, k_max=spec.engine.k_max, **common)
        if (estimate := real_replay_estimate(real, done["evaluate_sim"])) is not None:
            say(estimate)
        done["real_engine"] = kind
        done["evaluate_real"] = stage(f"evaluate ({kind} engine)",
                                      lambda: run_evaluate(real, out_dir / f"eval-{kind}", progress=progress).summary)


def real_replay_estimate(real: EvaluateSpec, sim_summary: dict[str, Any]) -> str | None:
    """How long the real engine's evaluation will take, said before it starts: the simulator's makespan of
    each strategy it replays (at the workload's own arrival times, so the idle gaps and the queue an
    overloaded replay builds count), times the repeats; a strategy the simulator did not replay counts
    as the mean of those it did. None when it replayed none of them. A raw trace of thousands of requests
    replays in real time for hours, and the progress bar's ETA, from the first requests' pace, cannot
    see the queue the later ones wait in."""
    names = [s.name for s in resolve_strategies(real.strategies)[0]]
    spans = [(sim_summary["strategies"].get(n) or {}).get("makespan_s", {}).get("mean") for n in names]
    known = [s for s in spans if isinstance(s, (int, float))]
    if not known:
        return None
    total = sum(known) / len(known) * len(names) * real.repeats
    requests = int(sim_summary["workload"]["requests"])
    return (f"[evaluate] the {real.engine} engine replays the workload's {requests} requests under {len(names)} "
            f"strateg{'y' if len(names) == 1 else 'ies'} x {real.repeats} repeat{'s' if real.repeats > 1 else ''}: "
            f"about {format_duration(total)} by the simulator's clock (a window bounds it: max_requests or "
            "duration_s in the workload)")


def _copy_measurements(source: Path, out_dir: Path) -> None:
    """profile/ (and fit/ when present) of an earlier run, so this run directory is self-contained."""
    for part in ("profile", "fit"):
        if (source / part).is_dir() and source.resolve() != out_dir.resolve():
            shutil.copytree(source / part, out_dir / part, dirs_exist_ok=True)
