"""Policy protocols, the schedule decision type, parameter models and the policy registries.

A strategy is a length policy, a verify policy and a schedule policy (docs/architecture.md, "The contract between
engines, loop and policies"). Each is a small class chosen by name from a registry and configured from
TOML through its `Params` pydantic model, so a preset file, a CLI flag and an Optuna trial are validated
the same way. Policies see read-only snapshots (autospec/contract.py) and return numbers; they never
import engines.

How the serving loop drives one step (the order every policy may rely on):

    pick = schedule.pick(now, waiting, running, slots)       # who runs
    length.begin_step(ctx)
    drafts = DraftState.empty(ctx.req_ids)
    while True:                                               # every policy answers False past K_max
        more = length.keep_drafting(ctx, drafts)              # one more token per request?
        if not any(more): break
        engine.draft([r for r, m in zip(drafts.req_ids, more) if m])   # appends to drafts
    n_verify = verify.select(ctx, drafts)                     # <= drafted, per request
    outcome = engine.verify(...)
    length.observe(ctx, outcome); verify.observe(ctx, outcome); schedule.observe(outcome)

Once `keep_drafting` answers False for a request it keeps answering False for the rest of the step.
Asking once more after the K_max-th token matters: AdaSpec's drafter learns the last token's
confidence in that call. A length policy that offers `FixedLengthPolicy` and answers lengths from
`fixed_lengths(ctx)` right after `begin_step` is not asked `keep_drafting`: the step drafts those
lengths in one engine call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Protocol, Sequence, TypeVar, runtime_checkable

from pydantic import BaseModel, ConfigDict, ValidationError

from autospec.contract import VIEW_SIGNALS, DraftState, LatencyModel, RequestView, StepContext, StepOutcome
from autospec.errors import InputError

__all__ = [
    "LengthPolicy", "FixedLengthPolicy", "UniformLengthPolicy", "TotalsLengthPolicy", "MatchLengthPolicy",
    "RequestLengthPolicy",
    "SmSplitChoice",
    "VerifyPolicy", "SchedulePolicy", "Pick",
    "PolicyParams", "Policy", "LengthPolicyBase", "TargetLengthPolicy", "VerifyPolicyBase", "SchedulePolicyBase",
    "require_latency_model", "batch_context_tokens",
    "LENGTH_POLICIES", "VERIFY_POLICIES", "SCHEDULE_POLICIES", "REGISTRIES",
    "register_length", "register_verify", "register_schedule",
    "policy_class", "build_policy", "build_length", "build_verify", "build_schedule",
]


class PolicyParams(BaseModel):
    """Base of every policy's parameter model: strict types, unknown keys rejected, immutable."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


@runtime_checkable
class LengthPolicy(Protocol):
    """How many tokens each request drafts this step, asked one token at a time."""

    def begin_step(self, ctx: StepContext) -> None: ...

    def keep_drafting(self, ctx: StepContext, drafts: DraftState) -> list[bool]: ...

    def observe(self, ctx: StepContext, outcome: StepOutcome) -> None: ...


@runtime_checkable
class FixedLengthPolicy(Protocol):
    """An optional capability of a length policy: it can tell, right after `begin_step`, every request's
    draft length this step (aligned with ctx.requests), or None when it decides token by token. The
    step then drafts all rounds in one engine call (`engines.base.BatchedDraftRounds`, or one `draft`
    call per round) instead of asking `keep_drafting` per token; without it the step asks per token.
    Every `LengthPolicyBase` has it (None by default; `TargetLengthPolicy` answers its targets)."""

    def fixed_lengths(self, ctx: StepContext) -> list[int] | None: ...


@runtime_checkable
class UniformLengthPolicy(Protocol):
    """An optional capability of a stateless length policy whose draft length depends on nothing but the
    step's batch size — the same for every request of the batch (static K, no-SD, a per-batch-size K
    schedule). `uniform_length(b)` is that length (before clipping to K_max), and `begin_step`'s targets
    must equal it for every request; `observe` must change nothing. The simulator's batch path
    (serving/batch.py) steps such a strategy's requests as arrays without calling the policy per step."""

    def uniform_length(self, batch_size: int) -> int: ...


@runtime_checkable
class TotalsLengthPolicy(Protocol):
    """An optional capability of a length policy that gives every request of a step one draft length,
    decided from the step's totals alone — batch size, Σ context tokens (`batch_context_tokens`), K_max and
    the latency model — and learns from the step's totals alone (Σ verified, Σ accepted): SmartSpec.
    `step_length(...)` is what `begin_step`'s targets would be for every request (before clipping to K_max;
    the same InputError where they would raise), `observe_totals(verified, accepted)` what `observe` does
    with that outcome. The simulator's batch path (serving/batch.py) replays such a policy's strategy as
    arrays, calling these two once per step."""

    def step_length(self, batch_size: int, context_tokens: float, k_max: int,
                    latency_model: LatencyModel | None) -> int: ...

    def observe_totals(self, verified: int, accepted: int) -> None: ...


@runtime_checkable
class MatchLengthPolicy(Protocol):
    """An optional capability of a stateless length policy that sets each request's draft length from
    nothing but its true match length (capped at K_max), its context and the engine's step clock: the
    oracles. `match_lengths(matches, contexts, clock)` — int64 arrays aligned with the step's requests,
    `clock(contexts, lengths)` the engine's `StepClock` on arrays — returns what `begin_step`'s targets
    are, as an int64 array. The simulator's batch path asks it once per step with the rows' arrays."""

    def match_lengths(self, matches: Any, contexts: Any, clock: Callable[[Any, Any], float]) -> Any: ...


@runtime_checkable
class RequestLengthPolicy(Protocol):
    """An optional capability of a length policy that decides each request's draft length from state it
    keeps per request id and the step's totals, and learns from each request's verified and accepted
    drafts, their KLDs and the step's seconds: GP-LCB, DSDE. `request_lengths(req_ids, context_tokens,
    k_max, latency_model, sm_split)` is what `begin_step`'s targets are, `observe_requests(req_ids,
    verified, accepted, finished, step_s, klds)` what `observe` does with that outcome (step_s = draft +
    verify + early-exit seconds; klds per request, of its verified drafts). The simulator's batch path
    asks both once per step, verify-all (verified = drafted)."""

    def request_lengths(self, req_ids: list[int], context_tokens: float, k_max: int,
                        latency_model: LatencyModel | None, sm_split: float | None) -> list[int]: ...

    def observe_requests(self, req_ids: Sequence[int], verified: Sequence[int], accepted: Sequence[int],
                         finished: Sequence[bool], step_s: float, klds: Sequence[Sequence[float]]) -> None: ...


@runtime_checkable
class SmSplitChoice(Protocol):
    """An optional capability of a length policy that picks the step's SM split r (FASER's GP-LCB over
    an `sm_pool`). Right after `begin_step` the step reads `step_sm_split()` — the r chosen for this
    step, or None for no choice (the engine keeps the execution config's split) — has the engine apply
    it (`engines.base.StepSmSplit`) and reports the split the engine applied with
    `sm_split_applied(r)` before drafting, so that `observe` attributes the step's cost to the split
    it really ran under. `chooses_sm_split` says up front whether it will choose (a non-empty pool):
    the serving step refuses an engine that cannot apply a split per step before the replay starts."""

    @property
    def chooses_sm_split(self) -> bool: ...

    def step_sm_split(self) -> float | None: ...

    def sm_split_applied(self, r: float | None) -> None: ...


@runtime_checkable
class VerifyPolicy(Protocol):
    """How many of each request's drafted tokens go to the target (a prefix, <= drafted)."""

    def select(self, ctx: StepContext, drafts: DraftState) -> list[int]: ...

    def observe(self, ctx: StepContext, outcome: StepOutcome) -> None: ...


@dataclass(frozen=True)
class Pick:
    """A schedule decision. `run` lists the requests that run this step (at most `slots`), in
    priority order; `admit` are those of them that were waiting; `preempt` are running requests
    that must give their slot up (the loop swaps their KV out and charges the switch cost)."""

    run: tuple[int, ...]
    admit: tuple[int, ...] = ()
    preempt: tuple[int, ...] = ()

    @classmethod
    def from_order(cls, order: Sequence[int], waiting: Sequence[RequestView],
                   running: Sequence[RequestView], slots: int,
                   pinned: Sequence[int] = ()) -> "Pick":
        """Run the `pinned` running requests, then fill the remaining slots in `order`.

        Running requests that are neither pinned nor chosen are preempted; this is the one place
        every schedule policy turns a priority order into admissions and preemptions.
        """
        running_ids = {r.req_id for r in running}
        waiting_ids = {r.req_id for r in waiting}
        chosen: list[int] = []
        for rid in list(pinned) + [r for r in order if r not in pinned]:
            if len(chosen) >= slots:
                break
            if (rid in running_ids or rid in waiting_ids) and rid not in chosen:
                chosen.append(rid)
        chosen_set = set(chosen)
        return cls(
            run=tuple(chosen),
            admit=tuple(r for r in chosen if r in waiting_ids),
            preempt=tuple(r.req_id for r in running if r.req_id not in chosen_set),
        )


@runtime_checkable
class SchedulePolicy(Protocol):
    """Which requests run this step. `slots` is the batch capacity (max requests per step).

    `waiting` is in arrival order (ties by req_id), preempted requests included at their arrival
    position, so a policy that admits in arrival order can read the head of the queue only."""

    def pick(self, now: float, waiting: Sequence[RequestView], running: Sequence[RequestView],
             slots: int) -> Pick: ...

    def observe(self, outcome: StepOutcome) -> None: ...


class Policy:
    """Common base: validated params in `self.params`; no-op hooks a policy may override.

    `reads` names the RequestView signals (contract.VIEW_SIGNALS: rounds, kld_history,
    confidence_history, true_match_len) the policy reads; the serving loop keeps only those some
    policy of the strategy reads. The default is all of them, so a policy that does not say still gets
    everything; every built-in policy states exactly what it reads."""

    Params: ClassVar[type[PolicyParams]] = PolicyParams
    name: ClassVar[str] = ""
    reads: ClassVar[frozenset[str]] = VIEW_SIGNALS

    def __init__(self, **params: Any) -> None:
        self.params = self.Params(**params)


class LengthPolicyBase(Policy):
    def begin_step(self, ctx: StepContext) -> None:
        pass

    def fixed_lengths(self, ctx: StepContext) -> list[int] | None:
        """Each request's draft length this step when `begin_step` already decided it (aligned with
        ctx.requests), else None (`FixedLengthPolicy`). The step then asks the engine for all rounds
        at once (`autospec.engines.base.BatchedDraftRounds`) instead of one keep_drafting call per token."""
        return None

    def observe(self, ctx: StepContext, outcome: StepOutcome) -> None:
        pass


class TargetLengthPolicy(LengthPolicyBase, ABC):
    """A length policy that fixes each request's draft length in `begin_step` (static, GP-LCB, DSDE,
    SmartSpec, oracle). Subclasses implement `targets(ctx) -> list[int]` (aligned with ctx.requests)."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self._ids: list[int] = []
        self._lengths: list[int] = []  # this step's targets, aligned with the step's requests
        self._by_id: dict[int, int] | None = None
        self._ctx: StepContext | None = None  # the context begin_step decided for

    @abstractmethod
    def targets(self, ctx: StepContext) -> list[int]:
        """Draft length per request this step, aligned with ctx.requests (clipped to [0, k_max])."""

    def begin_step(self, ctx: StepContext) -> None:
        k_max = ctx.k_max
        self._ids = [r.req_id for r in ctx.requests]
        self._lengths = [k if type(k) is int and 0 <= k <= k_max else max(0, min(int(k), k_max))
                         for k in self.targets(ctx)]
        self._by_id = None
        self._ctx = ctx

    @property
    def step_targets(self) -> dict[int, int]:
        """req_id -> this step's draft length."""
        if self._by_id is None:
            self._by_id = dict(zip(self._ids, self._lengths))
        return self._by_id

    def keep_drafting(self, ctx: StepContext, drafts: DraftState) -> list[bool]:
        targets = self.step_targets
        return [n < targets.get(rid, 0) for rid, n in zip(drafts.req_ids, drafts.lengths())]

    def fixed_lengths(self, ctx: StepContext) -> list[int]:
        if ctx is self._ctx:  # the usual call, right after begin_step(ctx)
            return list(self._lengths)
        targets = self.step_targets
        return [targets.get(r.req_id, 0) for r in ctx.requests]


class VerifyPolicyBase(Policy):
    def observe(self, ctx: StepContext, outcome: StepOutcome) -> None:
        pass


class SchedulePolicyBase(Policy):
    def observe(self, outcome: StepOutcome) -> None:
        pass


def require_latency_model(ctx: StepContext, policy: str) -> LatencyModel:
    if ctx.latency_model is None:
        raise InputError(f"the {policy} policy needs a fitted latency model (run `autospec fit`)",
                         field="latency_model")
    return ctx.latency_model


def batch_context_tokens(ctx: StepContext) -> float:
    """N_c for the time model: the batch's context tokens, summed over requests."""
    return float(sum(r.context_len for r in ctx.requests))


# --- registries -------------------------------------------------------------------------------------

LENGTH_POLICIES: dict[str, type[LengthPolicyBase]] = {}
VERIFY_POLICIES: dict[str, type[VerifyPolicyBase]] = {}
SCHEDULE_POLICIES: dict[str, type[SchedulePolicyBase]] = {}

REGISTRIES: dict[str, dict[str, type[Policy]]] = {
    "length": LENGTH_POLICIES,  # type: ignore[dict-item]
    "verify": VERIFY_POLICIES,  # type: ignore[dict-item]
    "schedule": SCHEDULE_POLICIES,  # type: ignore[dict-item]
}

P = TypeVar("P", bound=type[Policy])


def _register(kind: str, name: str) -> Callable[[P], P]:
    def deco(cls: P) -> P:
        registry = REGISTRIES[kind]
        if name in registry and registry[name] is not cls:
            raise ValueError(f"{kind} policy {name!r} registered twice")
        registry[name] = cls
        if not cls.name:
            cls.name = name
        return cls
    return deco


def register_length(name: str) -> Callable[[P], P]:
    return _register("length", name)


def register_verify(name: str) -> Callable[[P], P]:
    return _register("verify", name)


def register_schedule(name: str) -> Callable[[P], P]:
    return _register("schedule", name)


def policy_class(kind: str, name: str) -> type[Policy]:
    """The class registered as `name` for `kind` (length | verify | schedule); InputError if none."""
    _load_builtin_policies()
    registry = REGISTRIES[kind]
    if name not in registry:
        raise InputError(f"unknown {kind} policy {name!r}; known: {', '.join(sorted(registry))}",
                         field=f"{kind}.policy")
    return registry[name]


def build_policy(kind: str, name: str, **params: Any) -> Policy:
    cls = policy_class(kind, name)
    try:
        return cls(**params)
    except ValidationError as err:
        raise InputError.from_validation(err, prefix=kind) from None


def build_length(name: str, **params: Any) -> LengthPolicy:
    return build_policy("length", name, **params)  # type: ignore[return-value]


def build_verify(name: str, **params: Any) -> VerifyPolicy:
    return build_policy("verify", name, **params)  # type: ignore[return-value]


def build_schedule(name: str, **params: Any) -> SchedulePolicy:
    return build_policy("schedule", name, **params)  # type: ignore[return-value]


def _load_builtin_policies() -> None:
    # Importing the package registers every built-in policy (its __init__ imports each module).
    import autospec.policies  # noqa: F401

