"""One replay setup: a workload trace → the serving loop's requests, its step settings and a fresh engine
per run, the same for every caller (`autospec evaluate`, each `autospec tune` trial and its
--confirm-top re-runs, benchmarks/sim_speed.py).

Written once so the callers cannot drift apart: a tune trial on a profile scores exactly the replay
`autospec evaluate --engine sim` runs on that profile (same engine construction — the vLLM step
structure of a vLLM profile included —, same requests, same settings, same SLO check).

* `trace_requests` — one `ServeRequest` per trace row: the given prompt token ids, or reproducible
  synthetic ids of the trace's prompt length (what the simulator replays: it reads only lengths).
* `step_settings` — the `StepSettings` of one strategy: K_max, temperature, the latency model policies
  consult, FASER's fitted models, the SLO's TPOT and the strategy's own SM split.
* `Replay` — requests + settings + `engine_for(seed)`; `run(strategy, seed)` serves the workload once,
  open loop or, with `max_concurrency`, at most that many requests in flight (`serving.loop.serve`).
* `closed_loop_requests` — the requests all ready at t=0: with a concurrency limit of N, N virtual users
  each send the next request as soon as theirs finishes (`autospec evaluate --closed-loop`).
  With `fit` (the run's `FitResult.policy_inputs`) every strategy is built with the fit's defaults
  (`autospec.strategy.apply_fit`: DSpark's calibrator and SPS(B) table); without, `uncalibrated` names the
  strategies that run on raw confidences.
* `sim_replay` — a `Replay` on a simulator: given one engine built from a run directory (reading the
  profile and fit is the slow part), every run gets a fresh engine over the same traces, costs and step
  structure, so runs share no clock or random state and cost only the replay.

Layering (tests/test_layers.py): this module sits in serving/ and reads no run directory — building
the simulator from profile/ and fit/ is the fit stage's (`autospec.fit.FittedSimEngine.from_dirs`),
and `autospec.evaluate.open_sim_replay` is the one function that does it for every caller, passing
the engine and the fit's FASER models in here.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence, cast

from autospec.contract import LatencyModel, StepClockFn
from autospec.engines.base import Engine
from autospec.engines.sim import SimEngine
from autospec.latency import FaserModels
from autospec.serving.loop import serve
from autospec.serving.metrics import Slo
from autospec.serving.records import ServeRecords, ServeRequest, SyntheticPrompt
from autospec.serving.step import StepSettings
from autospec.strategy import Strategy, StrategySpec, build_strategy, calibration_flags, uncalibrated_warnings
from autospec.workloads.trace import Trace, TraceRequest

__all__ = ["Replay", "closed_loop_requests", "sim_replay", "step_settings", "trace_requests"]


def trace_requests(trace: Trace, prompts: Sequence[Sequence[int]] | None = None, *,
                   vocab: int = 1) -> list[ServeRequest]:
    """The trace's requests for the serving loop: `prompts[i]` as request i's token ids, or (None)
    reproducible synthetic ids of its prompt length over `vocab` (seeded by the request id)."""
    rows = list(trace.requests())
    if prompts is None:
        prompts = [SyntheticPrompt(r.prompt_len, vocab, r.req_id) for r in rows]
    return [ServeRequest(r.req_id, r.arrival_s, p, r.output_len, r.domain, prompt_key=prompt_key(r))
            for r, p in zip(rows, prompts)]


def prompt_key(row: TraceRequest) -> str | None:
    """The name of the token ids a replay sends for a trace row with prompt text: its prompt's source and
    the length it is clipped or cyclically padded to (`autospec.serving.factory.sent_prompt_ids`). A
    profile that traced those ids (`autospec profile --workload`) names the trace so, and the simulator
    replays the row on it; None for a row without text."""
    if row.prompt is None:
        return None
    source = row.source_id or "sha256:" + hashlib.sha256(row.prompt.encode("utf-8")).hexdigest()[:16]
    return f"{source}@{row.prompt_len}"


def closed_loop_requests(requests: Sequence[ServeRequest]) -> list[ServeRequest]:
    """The same requests, every one ready at t=0 (a closed loop once a concurrency limit holds them back:
    each is sent as soon as a slot frees, in trace order)."""
    return [dataclasses.replace(r, arrival_s=0.0) for r in requests]


def step_settings(strategy: StrategySpec, *, k_max: int, temperature: float = 0.0,
                  latency_model: LatencyModel | None = None, faser: FaserModels | None = None,
                  slo: Slo | None = None) -> StepSettings:
    """The step settings a replay of `strategy` runs with (its SM split is the strategy's own)."""
    return StepSettings(k_max=k_max, temperature=temperature, latency_model=latency_model, faser=faser,
                        slo_tpot_s=None if slo is None else slo.tpot_s,
                        sm_split=strategy.execution.sm_split or None)


@dataclass
class Replay:
    """A workload ready to serve under any strategy; `engine_for(seed)` gives the engine of one run."""

    requests: list[ServeRequest]
    engine_for: Callable[[int], Engine]
    k_max: int
    temperature: float = 0.0
    latency_model: LatencyModel | None = None
    faser: FaserModels | None = None
    slo: Slo = field(default_factory=Slo)
    max_batch: int = 8
    kv_budget_tokens: int | None = None
    max_concurrency: int | None = None  # requests in flight at most (the client's); None = open loop
    # an engine of this replay, for capability checks before anything runs (the simulator's oracle
    # signal, its vocabulary); never served on
    probe: Any = None
    # what policies take from the run's fit by default (FitResult.policy_inputs); None = no fit
    fit: Mapping[str, Any] | None = None
    # a real engine's host-speed check (autospec.profile.HostSpeedCheck: now / profiled), run before and
    # after every run into ServeRecords.host_speed; None = no check (the simulator, no torch profile)
    speed_check: Callable[[], float] | None = None

    def build(self, strategy: StrategySpec) -> Strategy:
        """The strategy's policies as this replay runs them: with the fit's defaults (apply_fit)."""
        return build_strategy(strategy, self.fit)

    def calibration(self, strategies: Sequence[StrategySpec]) -> dict[str, dict[str, Any]]:
        """Per strategy that takes a calibrator: calibrated or not, its kind and source (the summary's
        flag); logs a warning line for each one that runs uncalibrated."""
        uncalibrated_warnings(list(strategies), self.fit)
        return calibration_flags(list(strategies), self.fit)

    def settings(self, strategy: StrategySpec) -> StepSettings:
        return step_settings(strategy, k_max=self.k_max, temperature=self.temperature,
                             latency_model=self.latency_model, faser=self.faser, slo=self.slo)

    def step_clock(self, strategy: StrategySpec) -> StepClockFn | None:
        """What the simulator charges a plain step under `strategy` (`engines.base.StepClock`: its
        clock, on the plain engine's for a strategy that never drafts, as the serving loop tells it), on
        an engine of its own; None unless this replay runs on the simulator. `metrics.step_speed` prices
        a real replay's steps with the simulator replay's clock."""
        if not isinstance(self.probe, SimEngine):
            return None
        engine = cast(SimEngine, self.engine_for(0))  # a simulator replay's engines are its probe's class
        engine.set_speculative(strategy.length.policy != "none")
        return engine.step_time_s

    def run(self, strategy: StrategySpec, seed: int, *, on_finish: Callable | None = None,
            requests: list[ServeRequest] | None = None) -> ServeRecords:
        """Serve the workload (or `requests`) once under `strategy` on the engine for `seed` (between two
        host-speed checks when the replay has one)."""
        # the check first: it drives the engine, and engine_for(seed) then seeds the run's random stream
        before = self.speed_check() if self.speed_check is not None else None
        engine = self.engine_for(seed)
        records = serve(engine, self.build(strategy), self.requests if requests is None else requests,
                        max_batch=self.max_batch, settings=self.settings(strategy),
                        kv_budget_tokens=self.kv_budget_tokens, on_finish=on_finish,
                        max_concurrency=self.max_concurrency)
        if self.speed_check is not None and before is not None:
            records.host_speed = [before, self.speed_check()]
        return records


def sim_replay(base: SimEngine, trace: Trace, *, faser: FaserModels | None = None, slo: Slo | None = None,
               max_batch: int = 8, kv_budget_tokens: int | None = None,
               fit: Mapping[str, Any] | None = None, max_concurrency: int | None = None) -> Replay:
    """`trace` on the simulator `base` (its K_max, temperature and latency model, which policies
    consult; `fit`: the policies' defaults from the fit). Every run gets a new engine of base's class
    with its traces, costs and step structure (`fused_prefill` for a vLLM profile) — exactly what built
    `base` — seeded with the run's seed; `base` itself is never served on."""

    def engine_for(run_seed: int) -> SimEngine:
        return type(base)(base.traces, base.costs, k_max=base.k_max, temperature=base.temperature, seed=run_seed,
                          fused_prefill=base.fused_prefill, padded_batches=base.padded_batches)

    return Replay(trace_requests(trace, vocab=getattr(base, "vocab_size", 1)), engine_for, k_max=base.k_max,
                  temperature=base.temperature, latency_model=base.latency_model, faser=faser,
                  slo=Slo() if slo is None else slo, max_batch=max_batch, kv_budget_tokens=kv_budget_tokens,
                  max_concurrency=max_concurrency, probe=base, fit=fit)
