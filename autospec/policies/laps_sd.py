"""LAPS-SD: length- and acceptance-aware preemptive scheduling for SD (Li et al.; docs/policies.md §7).

K priority queues over attained service: Q_j holds [S_j^down, S_j^up) with S_j^up = M^(j−1)·S_1^up,
S_j^down = S_{j−1}^up, S_K^up = ∞. A request arrives non-perceptible (NP) in Q_1 and is demoted as its
attained service E_i grows (multi-level feedback, like LAS). E_i only grows, so in the paper a request
never climbs back to a higher queue; here S_1^up is measured (rounds' worth of the running mean round
time) and grows with the load, which would lift a demoted request — typically one waiting after a
preemption — back above requests that are running, and preempt them within one queue. So an NP
request's queue is the lowest it has reached (its level, kept across preemptions).
Stability is judged on the request's running acceptance rate, total accepted ÷ total verified drafts
so far (§4.3: "based on the total number of processed tokens and the number of accepted ones"): once
that running rate, taken after each of its last γ rounds, has moved by less than δ (max − min) the
request becomes perceptible (PC): A_i = the running rate and its time estimate
T̃_i = (n·L_i·T_SSM + L_i·T_LLM) / (n·A_i + 1) (Eq. 6) place it in the queue whose range holds T̃_i,
where it stays and is never preempted. A single round's rate moves in steps of 1/n (n drafts), so
testing the spread of per-round rates would almost never call a request stable; the running rate
settles as rounds accumulate.
Dispatch: lowest-index non-empty queue first; inside a queue PC requests by ascending remaining T̃
(SJF), then NP requests FCFS; slots are filled in this order [chosen: the paper shows batch 1]. Running
PC requests keep their slots, and so does a request (re-)admitted fewer than `min_rounds` rounds ago
[chosen; 1: the round its prefill was paid for] (policies/quantum.py).

E_i is RequestView.attained_service_s (the serving loop's account). T_SSM (per-token draft time) and
T_LLM (verify-pass time) are the running means of what the engine reported, unless configured.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Sequence

from pydantic import Field

from autospec.contract import RequestView, StepOutcome
from autospec.policies.base import Pick, PolicyParams, SchedulePolicyBase, register_schedule
from autospec.policies.output_length import OracleNoisePredictor, PredictedLengths
from autospec.policies.quantum import StintRounds


class LapsSdParams(PolicyParams):
    num_queues: int = Field(5, ge=1)  # K [chosen; paper's optima 4–6]
    growth: float = Field(2.0, gt=1.0)  # M [chosen]
    s1_up_rounds: float = Field(8.0, gt=0.0)  # S_1^up in SD rounds' worth of time [chosen]
    s1_up_s: float = Field(0.0, ge=0.0)  # S_1^up in seconds; 0 = s1_up_rounds × mean round time
    # γ: rounds over which the running acceptance rate must stay within δ [chosen]; a round that
    # verified no draft adds nothing to the running rate and is not counted [chosen]
    stability_rounds: int = Field(10, ge=1)
    stability_delta: float = Field(0.05, gt=0.0)  # δ, max − min of the running rate [chosen]
    draft_len: int = Field(4, ge=1)  # n of Eq. 6 (the strategy's static draft length) [chosen]
    t_ssm_s: float = Field(0.0, ge=0.0)  # per-token draft time; 0 = measured
    t_llm_s: float = Field(0.0, ge=0.0)  # verify-pass time; 0 = measured
    predictor_sigma: float = Field(0.07, ge=0.0)  # oracle-with-noise output-length predictor [chosen]
    predictor_seed: int = 0
    # rounds a (re-)admitted NP request runs before it may be preempted [chosen; 1 = preempt at any
    # round boundary after the first, the paper's round-granular preemption]
    min_rounds: int = Field(1, ge=1)


@dataclass
class _RequestState:
    rates: deque[float]  # the running acceptance rate after each of the last γ rounds
    accepted: int = 0  # totals since arrival (§4.3's running rate = accepted / verified)
    verified: int = 0
    perceptible: bool = False
    acceptance: float = 0.0  # A_i
    estimate_s: float = 0.0  # T̃_i
    queue: int = 0  # fixed once perceptible
    level: int = 0  # NP: the lowest queue its attained service has reached (never climbs back)


@dataclass
class _Mean:
    total: float = 0.0
    n: int = field(default=0)

    def add(self, x: float) -> None:
        self.total += x
        self.n += 1

    @property
    def value(self) -> float | None:
        return self.total / self.n if self.n else None


def estimated_time(length: float, acceptance: float, draft_len: int, t_ssm: float, t_llm: float) -> float:
    """Eq. 6: T̃ = (n·L·T_SSM + L·T_LLM) / (n·A + 1)."""
    return (draft_len * length * t_ssm + length * t_llm) / (draft_len * acceptance + 1.0)


def queue_bounds(num_queues: int, growth: float, s1_up: float) -> list[float]:
    """Upper bounds S_1^up..S_K^up (the last is ∞)."""
    return [s1_up * growth ** j for j in range(num_queues - 1)] + [math.inf]


def queue_index(value: float, bounds: Sequence[float]) -> int:
    """0-based index of the queue whose [S^down, S^up) holds `value`."""
    for j, up in enumerate(bounds):
        if value < up:
            return j
    return len(bounds) - 1


@register_schedule("laps-sd")
class LapsSdSchedule(SchedulePolicyBase):
    """LAPS-SD multi-level feedback queues with perceptible-request SJF."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = LapsSdParams
    params: LapsSdParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.lengths = PredictedLengths(OracleNoisePredictor(self.params.predictor_sigma,
                                                             self.params.predictor_seed))
        self._state: dict[int, _RequestState] = {}
        self._round = _Mean()
        self._t_ssm = _Mean()
        self._t_llm = _Mean()
        self._views: dict[int, RequestView] = {}
        self.stints = StintRounds(self.params.min_rounds)
        self.promoted = 0  # requests made perceptible so far (a diagnostic: benchmarks/scheduling_thrash.py)

    # --- estimates ------------------------------------------------------------------------------

    def bounds(self) -> list[float]:
        p = self.params
        s1 = p.s1_up_s or p.s1_up_rounds * (self._round.value or 0.0)
        return queue_bounds(p.num_queues, p.growth, s1)

    def t_ssm(self) -> float:
        return self.params.t_ssm_s or self._t_ssm.value or 0.0

    def t_llm(self) -> float:
        return self.params.t_llm_s or self._t_llm.value or 0.0

    def state(self, req_id: int) -> _RequestState:
        if req_id not in self._state:
            self._state[req_id] = _RequestState(deque(maxlen=self.params.stability_rounds))
        return self._state[req_id]

    def is_perceptible(self, req_id: int) -> bool:
        return req_id in self._state and self._state[req_id].perceptible

    def queue_of(self, request: RequestView, bounds: Sequence[float] | None = None) -> int:
        """Its queue: a PC request's is fixed; an NP request's is the lowest its E_i has reached
        (module docstring), so a threshold that grew since cannot lift it back."""
        st = self.state(request.req_id)
        if st.perceptible:
            return st.queue
        st.level = max(st.level, queue_index(request.attained_service_s, self.bounds() if bounds is None else bounds))
        return st.level

    def remaining_estimate(self, request: RequestView) -> float:
        """T̃_i scaled to the predicted tokens still to generate."""
        st = self.state(request.req_id)
        total = self.lengths.total(request)
        return 0.0 if total <= 0 else st.estimate_s * self.lengths.remaining(request) / total

    # --- the schedule policy --------------------------------------------------------------------

    def pick(self, now: float, waiting: Sequence[RequestView], running: Sequence[RequestView],
             slots: int) -> Pick:
        everyone = [*running, *waiting]
        for r in everyone:
            self._views[r.req_id] = r
        bounds = self.bounds()

        def key(r: RequestView) -> tuple[int, int, float, float, int]:
            if self.is_perceptible(r.req_id):
                return (self.queue_of(r), 0, self.remaining_estimate(r), r.arrival_s, r.req_id)
            return (self.queue_of(r, bounds), 1, r.arrival_s, 0.0, r.req_id)

        keys = {r.req_id: key(r) for r in everyone}
        order = sorted(keys, key=keys.__getitem__)
        # running PC requests are never preempted; nor is an NP one within its first min_rounds rounds
        protected = self.stints.protected(running) | {r.req_id for r in running if self.is_perceptible(r.req_id)}
        pinned = [rid for rid in order if rid in protected]
        pick = Pick.from_order(order, waiting, running, slots, pinned=pinned)
        self.stints.picked(pick, waiting)
        return pick

    def observe(self, outcome: StepOutcome) -> None:
        self.stints.observe(outcome)
        if outcome.batch_size == 0:
            return
        self._round.add(outcome.draft_time_s + outcome.verify_time_s + outcome.early_exit_time_s)
        max_drafted = max(outcome.drafted, default=0)
        if max_drafted > 0:
            self._t_ssm.add(outcome.draft_time_s / max_drafted)
        self._t_llm.add(outcome.verify_time_s)
        p = self.params
        for rid, verified, accepted, done in zip(outcome.req_ids, outcome.verified, outcome.accepted,
                                                 outcome.finished):
            if done:
                self._state.pop(rid, None)
                self._views.pop(rid, None)
                self.lengths.forget(rid)
                continue
            st = self.state(rid)
            if st.perceptible or verified <= 0:
                continue
            # The denominator is the verified drafts, the tokens the target processed ("processed
            # tokens", §4.3) [chosen]: a draft a verify policy cut was never judged. With `verify =
            # all` (the laps-sd preset) it equals the drafted tokens.
            st.accepted += accepted
            st.verified += verified
            st.rates.append(st.accepted / st.verified)
            if len(st.rates) == p.stability_rounds and max(st.rates) - min(st.rates) < p.stability_delta:
                self._promote(rid, st)

    def _promote(self, req_id: int, st: _RequestState) -> None:
        view = self._views.get(req_id)
        if view is None:
            return  # never seen by pick(): no length to estimate from, stay non-perceptible
        length = self.lengths.total(view)
        st.perceptible = True
        self.promoted += 1
        st.acceptance = st.accepted / st.verified  # the running rate that was found stable
        st.estimate_s = estimated_time(length, st.acceptance, self.params.draft_len, self.t_ssm(), self.t_llm())
        st.queue = queue_index(st.estimate_s, self.bounds())
