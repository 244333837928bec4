"""Online (per-step) draft-length policies inside vLLM: the settings that travel to vLLM's engine core
and the vLLM-free driver `autospec.serving.vllm.scheduler.OnlineKScheduler` runs them with.

The serving loop drives a length policy as begin_step(ctx) → draft → verify → observe(ctx, outcome),
one step after the other (autospec/policies/base.py). vLLM cannot: its drafter proposes the tokens
step n+1 verifies inside step n's forward, with the one batch K the scheduler chose when it scheduled
step n. So the scheduler decides step n+1's lengths at schedule(n) — before step n's verification,
the previous decision, has been observed (docs/vllm.md, "The one-step lag"). Calls reach the policy as

    begin_step(D_n+1)   [schedule(n)]      observe(D_n)   [update_from_output(n)]
    begin_step(D_n+2)   [schedule(n+1)]    observe(D_n+1) [update_from_output(n+1)] ...

i.e. every decision is made with the feedback of all decisions but the one still in flight.
A policy keeps "the step in flight" (what begin_step decided, which its observe reads — GP-LCB's
(context, s_n), the targets) in attributes begin_step rebinds. `OnlineLength.decide` remembers, per
decision, the attributes begin_step rebound (identity changed) and `observe` puts them back around the
matching observe call, then restores the newer decision's: each observe sees exactly the state its own
begin_step left, as in the serving loop. Persistent state a policy updates in place or only in observe
(GP-LCB's GP windows and per-request acceptance, SmartSpec's α) is untouched. This holds for the
policies in ONLINE_LENGTH_POLICIES (checked by tests/vllm/test_vllm_config.py); a policy whose
begin_step rebinds state that observe must update is not one to add without checking.

Nothing here imports vLLM.
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from autospec.calibration import read_fit_models
from autospec.contract import LatencyModel, RequestView, StepContext, StepOutcome
from autospec.engines.base import offers
from autospec.errors import InputError
from autospec.policies import build_length
from autospec.policies.base import FixedLengthPolicy

__all__ = ["ONLINE_KEY", "ONLINE_LENGTH_POLICIES", "ONLINE_SCHEDULER_CLS", "OnlineLength", "needs_fit",
           "online_settings"]

ONLINE_KEY = "autospec_online"  # additional_config key (and the autospec-only key of speculative_config_for)
ONLINE_SCHEDULER_CLS = "autospec.serving.vllm.scheduler.OnlineKScheduler"
# Length policies the online scheduler runs: TargetLengthPolicy subclasses that need only what vLLM's
# scheduler hooks see — per-request drafted/accepted counts, step wall time — plus a fitted latency
# model (`needs_fit`). The decision table for every policy is in autospec/serving/vllm/speculative_config.py.
ONLINE_LENGTH_POLICIES = ("gp-lcb", "smartspec")


def needs_fit(policy: str, params: Mapping[str, Any]) -> bool:
    """Whether the online policy needs a fitted latency model: SmartSpec always (its goodput is
    T_draft + T_target), GP-LCB for its per-request refinement (Eq. 2, `refine`, default true)."""
    if policy == "smartspec":
        return True
    if policy == "gp-lcb":
        return bool(params.get("refine", True))
    return False


def online_settings(name: str, policy: str, params: Mapping[str, Any], *, k_max: int,
                    fit: str | Path | None, temperature: float = 0.0) -> dict[str, Any]:
    """The JSON-able `additional_config[ONLINE_KEY]` for one strategy (checked by building the driver,
    which builds the policy and loads the fit: a bad value fails here, not in vLLM's engine core)."""
    settings = {"strategy": name, "length": {"policy": policy, **dict(params)}, "k_max": int(k_max),
                "temperature": float(temperature), "fit": None if fit is None else str(Path(fit).resolve())}
    OnlineLength.from_settings(settings)
    return settings


_MISSING = object()


class OnlineLength:
    """A target-length policy run for an engine that decides step n+1 before it observes step n
    (module docstring). Decisions are numbered; each keeps its StepContext and the policy's
    in-flight state until `retain` drops it."""

    def __init__(self, policy: Any, k_max: int, temperature: float = 0.0,
                 latency_model: LatencyModel | None = None, name: str = ""):
        if not offers(policy, FixedLengthPolicy):
            raise InputError(f"length policy {type(policy).__name__} does not fix its lengths at the start "
                             "of a step; the vLLM online scheduler needs one that does", field="length.policy")
        self.policy, self.k_max, self.temperature = policy, int(k_max), float(temperature)
        self.latency_model, self.name = latency_model, name
        self._decisions: dict[int, tuple[StepContext, dict[str, Any]]] = {}
        self._ids = itertools.count(1)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> "OnlineLength":
        length = dict(settings["length"])
        policy_name = length.pop("policy")
        if policy_name not in ONLINE_LENGTH_POLICIES:
            raise InputError(f"length policy {policy_name!r} cannot run in vLLM's online scheduler "
                             f"(it runs {', '.join(ONLINE_LENGTH_POLICIES)})", field="length.policy")
        policy = build_length(policy_name, **length)
        fit = settings.get("fit")
        if needs_fit(policy_name, length) and fit is None:
            raise InputError(f"length policy {policy_name!r} needs a fitted latency model (fit/models.json)",
                             field="fit")
        model = None
        if fit is not None:  # fit/models.json, read as `autospec.fit.load_fit` reads it; its latency model
            model = read_fit_models(fit).linear.latency_model()
        return cls(policy, int(settings["k_max"]), float(settings.get("temperature", 0.0)), model,
                   str(settings.get("strategy", policy_name)))

    def decide(self, requests: Sequence[RequestView], now_s: float | None = None) -> tuple[int, list[int]]:
        """begin_step on `requests`; returns (decision id, each request's draft length in [0, k_max])."""
        ctx = StepContext(now_s=time.time() if now_s is None else now_s, requests=list(requests),
                          k_max=self.k_max, temperature=self.temperature, latency_model=self.latency_model)
        state = vars(self.policy)
        before = dict(state)
        self.policy.begin_step(ctx)
        lengths = [max(0, min(int(k), self.k_max)) for k in self.policy.fixed_lengths(ctx)]
        inflight = {k: v for k, v in state.items() if k not in before or before[k] is not v}
        decision = next(self._ids)
        self._decisions[decision] = (ctx, inflight)
        return decision, lengths

    def observe(self, decision: int, outcome: StepOutcome) -> None:
        """The policy's observe for `decision`, with that decision's in-flight state swapped in."""
        entry = self._decisions.get(decision)
        if entry is None:
            return
        ctx, inflight = entry
        state = vars(self.policy)
        current = {k: state.get(k, _MISSING) for k in inflight}
        state.update(inflight)
        try:
            self.policy.observe(ctx, outcome)
        finally:
            for k, v in current.items():
                if v is _MISSING:
                    state.pop(k, None)
                else:
                    state[k] = v

    def retain(self, live: set[int]) -> None:
        """Forget every decision not in `live` (its requests finished, were preempted or observed)."""
        for decision in [d for d in self._decisions if d not in live]:
            del self._decisions[decision]

    @property
    def pending(self) -> list[int]:
        return sorted(self._decisions)
