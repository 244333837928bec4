"""The Engine contract: what the serving loop calls on an engine, and what it may offer besides.

The serving loop (`autospec.serving.loop.serve`, with its step `autospec.serving.step.sd_step`) drives
any object that implements `Engine`; see docs/architecture.md, "Engines". Engines never import
policies; they exchange the plain records of `autospec.contract`.

Required — the `Engine` protocol; an engine that has only these runs every strategy:

* `k_max`, `temperature` — the most drafts a step may ask of one request, and the sampling temperature.
* `add(requests)` — prefill `GenRequest`s together; a `PrefillResult` with the engine's ids for them,
  each one's first token (the next token of a resumed request) and whether that finished it.
* `draft(req_ids)` — one more draft token for each of these requests (one draft pass), in order.
* `verify(plan)` — run the target over `plan[id]` of each request's drafts and commit what the
  acceptance rule keeps; a `StepOutcome` in the plan's order. The round's drafts are spent.
* `remove(req_ids)` — free requests (finished, or preempted: the loop re-adds those later).
* `output(req_id)` — the tokens a request committed since its `add`.
* `now()` — the engine's clock in seconds; every time the loop records is read from it.
* `idle_until(t)` — let time pass until `now()` reaches `t` (nothing to run until the next arrival, or
  a preemption's switch cost): a real engine sleeps, the simulator jumps its clock. [chosen] Required,
  not optional: only the engine knows what its clock is — a loop that slept on its own would never
  move a simulated clock.

Optional capabilities — each a runtime-checkable Protocol below. The loop resolves them once per
replay with `offers(engine, Capability)` and calls no member of one the engine does not offer:

* `BatchedDraftRounds` — `draft_rounds(req_ids, lengths)`: every round of a step whose lengths are
  fixed up front, in one call. Without it: `draft_round_by_round`, one `draft` call per round (the
  same tokens and clock; the simulator offers it because those calls are most of a long replay).
* `FrontierStep` — `frontier_chunk` and `frontier_step(lengths, chunk)`: FASER's frontier overlap
  (docs/policies.md §4). Without it: every step drafts, then verifies (a strategy's chunk_size has
  no effect).
* `ExecutionConfig` — `configure_execution(execution, faser)`: the strategy's execution config
  (early exit, frontier chunk, SM split) applied before the replay. Without it: not applied.
* `DraftSampling` — `set_draft_sampling(mode)`: sampled or greedy proposals at T>0 as the strategy
  says. Without it: the engine keeps its own proposal rule.
* `SpeculativeSwitch` — `set_speculative(enabled)`: told that a strategy never drafts (the simulator
  then prices a plain engine's passes). Without it: nothing changes.
* `FusedPrefill` — `fused_prefill`: True when, as in vLLM, admitted requests are prefilled inside
  the running requests' step and draft from the next one. Without it: False (prefill, then the step).
* `TrueMatchLength` — `true_match_len(req_id)`: how many of the request's next chain drafts
  verification would accept (the oracles' signal; at T>0 the simulator's realised acceptance). Without
  it: `RequestView.true_match_len` stays None, and `evaluate` refuses the oracle strategies up front.
* `StepClock` — `step_time_s(contexts, lengths)`: the seconds a plain step (draft rounds of these
  lengths, then one verify of every draft) would take now for requests with these contexts — the
  engine's own clock, which the cost-aware oracle maximises tokens per second against. Without it:
  `StepContext.step_clock` stays None and the cost-aware oracle refuses to run.
* `SwapCost` — `swap_cost_s(context_tokens)`: the KV switch cost of preempting a request, charged
  to the clock. Without it: a preemption costs only the recompute prefill at re-admission.
* `StepSmSplit` — `set_step_sm_split(r)`: run the next step's passes under SM split r, chosen per
  step by a length policy (GP-LCB's `sm_pool`); returns the split applied. Without it: the split
  stays the execution config's, and the loop refuses a strategy that asks to choose one
  (`serving.step.StepCapabilities.of`). The simulator offers it; the torch engine only on CUDA (a
  CPU has no SMs to split: a CPU engine has no such method).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from autospec.contract import DraftToken, StepOutcome
from autospec.latency import FaserModels

__all__ = [
    "GenRequest", "PrefillResult", "Engine",
    "BatchedDraftRounds", "FrontierStep", "ExecutionConfig", "DraftSampling", "SpeculativeSwitch",
    "FusedPrefill", "TrueMatchLength", "StepClock", "SwapCost", "StepSmSplit", "CAPABILITIES",
    "offers", "capabilities_of", "draft_round_by_round",
]


@dataclass(frozen=True)
class GenRequest:
    """One generation request as engines see it: token ids in, a token budget, a stop rule."""

    prompt: Sequence[int]
    max_tokens: int
    ignore_eos: bool = False
    # Optional context for engines that replay recorded behaviour (the simulator); others ignore it.
    domain: str = ""  # the request's prompt domain (code, chat, math, ...)
    trace_id: int | None = None  # the serving loop's stable id: the same across a preemption and re-add
    resumed_tokens: int = 0  # how many trailing tokens of `prompt` this request generated before a preemption
    # the prompt it was built from, as `autospec.serving.replay.prompt_key` names it: the simulator
    # replays that prompt's own acceptance trace when the profile recorded one
    prompt_key: str | None = None


@dataclass(frozen=True)
class PrefillResult:
    req_ids: list[int]
    first_tokens: list[int]
    finished: list[bool]
    time_s: float


@runtime_checkable
class Engine(Protocol):
    """The required members (module docstring)."""

    k_max: int
    temperature: float

    def add(self, requests: Sequence[GenRequest]) -> PrefillResult: ...

    def draft(self, req_ids: Sequence[int]) -> list[DraftToken]: ...

    def verify(self, plan: Mapping[int, int]) -> StepOutcome: ...

    def remove(self, req_ids: Sequence[int]) -> None: ...

    def output(self, req_id: int) -> list[int]: ...

    def now(self) -> float: ...

    def idle_until(self, t: float) -> None:
        """Let time pass until `now()` reaches `t` (nothing to run): the simulator jumps its clock, a
        real engine sleeps."""
        ...


# --- optional capabilities (module docstring: what the loop does without each) ---------------------


@runtime_checkable
class BatchedDraftRounds(Protocol):
    def draft_rounds(self, req_ids: Sequence[int], lengths: Sequence[int]) -> list[list[DraftToken]]:
        """`lengths[i]` drafts for request `req_ids[i]` in one call, with exactly the tokens and clock of
        `draft_round_by_round` (round j drafts one token for every request with lengths > j)."""
        ...


@runtime_checkable
class FrontierStep(Protocol):
    # the chunk size (an int), "auto" (the serving step picks it per step from the fit's FASER
    # models) or None / 0 (no overlap); set by `configure_execution` or directly
    frontier_chunk: int | str | None

    def frontier_step(self, lengths: Mapping[int, int], chunk: int) -> StepOutcome:
        """One step drafting up to `lengths[id]` tokens per request in chunks of `chunk`, verifying
        chunk c while chunk c+1 is drafted; every draft made is verified (verify policy `all`)."""
        ...


@runtime_checkable
class ExecutionConfig(Protocol):
    def configure_execution(self, execution: Any, faser: FaserModels | None = None) -> None:
        """Apply a strategy's `ExecutionSpec` (typed Any: engines do not import strategies) with the
        fit's FASER models when the replay has them."""
        ...


@runtime_checkable
class DraftSampling(Protocol):
    def set_draft_sampling(self, mode: str) -> None:
        """At T>0, draw each proposal ("sample") or propose the draft's argmax ("greedy")."""
        ...


@runtime_checkable
class SpeculativeSwitch(Protocol):
    def set_speculative(self, enabled: bool) -> None:
        """Whether the engine serves with speculative decoding configured (False: a no-SD strategy)."""
        ...


@runtime_checkable
class FusedPrefill(Protocol):
    fused_prefill: bool  # vLLM's step structure: prefills run inside the running requests' step


@runtime_checkable
class TrueMatchLength(Protocol):
    def true_match_len(self, req_id: int) -> int | None:
        """How many drafts the target would accept at the request's position (None: unknown id)."""
        ...


@runtime_checkable
class StepClock(Protocol):
    def step_time_s(self, contexts: Sequence[int], lengths: Sequence[int]) -> float:
        """Seconds one plain step would take now: draft rounds of `lengths[i]` tokens for requests with
        `contexts[i]` tokens of KV, then one target pass verifying every draft."""
        ...


@runtime_checkable
class SwapCost(Protocol):
    def swap_cost_s(self, context_tokens: int) -> float:
        """Seconds a preemption of a request with this context costs (its KV switched out)."""
        ...


@runtime_checkable
class StepSmSplit(Protocol):
    def set_step_sm_split(self, r: float | None) -> float | None:
        """Run the next step's draft and target passes with the draft on r of the SMs (None or 0: no
        split) until told otherwise; returns the split the engine applied (None: none)."""
        ...


CAPABILITIES: tuple[type, ...] = (BatchedDraftRounds, FrontierStep, ExecutionConfig, DraftSampling,
                                  SpeculativeSwitch, FusedPrefill, TrueMatchLength, StepClock, SwapCost,
                                  StepSmSplit)


@cache
def _methods(protocol: type) -> tuple[str, ...]:
    return tuple(name for name, value in vars(protocol).items() if callable(value) and not name.startswith("_"))


def offers(obj: object, capability: type) -> bool:
    """Whether `obj` offers `capability` (a runtime-checkable Protocol): `isinstance(obj, capability)`,
    with the typing rule that a method set to None is not offered.

    Python 3.12's isinstance applies that rule to every protocol; 3.11's skips it for a protocol of
    methods only when the object's class defines them, so it is applied here (a test hides the
    simulator's `draft_rounds` by setting it to None on the instance). An isinstance check on a
    runtime protocol costs microseconds: callers on a hot path resolve once per replay."""
    return isinstance(obj, capability) and all(getattr(obj, m) is not None for m in _methods(capability))


def capabilities_of(obj: object) -> frozenset[type]:
    """Every capability in CAPABILITIES that `obj` offers."""
    return frozenset(c for c in CAPABILITIES if offers(obj, c))


def draft_round_by_round(engine: Engine, req_ids: Sequence[int], lengths: Sequence[int]) -> list[list[DraftToken]]:
    """`BatchedDraftRounds.draft_rounds` on any Engine: draft `lengths[i]` tokens for request
    `req_ids[i]`, round j drafting one token for every request with lengths > j — exactly the `draft`
    calls the one-token-at-a-time step makes for lengths decided up front."""
    out: list[list[DraftToken]] = [[] for _ in req_ids]
    for j in range(max(lengths, default=0)):
        chosen = [i for i, k in enumerate(lengths) if k > j]
        for i, tok in zip(chosen, engine.draft([req_ids[i] for i in chosen])):
            out[i].append(tok)
    return out
