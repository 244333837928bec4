"""Per-request state the serving loop keeps between steps, and the view policies get.

Two ways to hand a request to policies:

* `view()` returns an independent snapshot (copies every list) — for callers that keep views around.
* `live_view()` returns one RequestView per request that is updated in place between steps and shares
  its history lists with this state. `sd_step` uses it: building a fresh view per request per step
  copied O(history) items each time, which dominated long simulated replays. Policies only read the
  view during the call they receive it in (the contract says read-only), so sharing is safe; a policy
  that wants to remember a history must copy it.

Only the signals in `signals` (contract.VIEW_SIGNALS; the serving loop passes the strategy's
`view_signals`) are kept: a strategy whose policies read no history costs no per-step history work.
Histories are trimmed in place: KLD/confidence signals keep the last SIGNAL_HISTORY positions, and
`rounds` keeps the last `history_rounds` rounds when that is set (the serving loop sets it; its own
records hold the full per-round history) or every round when it is None (the generate runner reports
per-request totals from it).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autospec.contract import VIEW_SIGNALS, DraftState, RequestView, RoundRecord, StepOutcome

SIGNAL_HISTORY = 64  # verified positions of KLD/confidence kept per request (DSDE needs 30)


_ROUNDS: dict[tuple[int, int, int], RoundRecord] = {}


def round_record(drafted: int, verified: int, accepted: int) -> RoundRecord:
    """An interned RoundRecord: they are immutable and take few distinct values, and building a frozen
    dataclass per request per step was a measurable share of a long simulated replay."""
    key = (drafted, verified, accepted)
    rr = _ROUNDS.get(key)
    if rr is None:
        rr = _ROUNDS[key] = RoundRecord(drafted, verified, accepted)
    return rr


@dataclass
class RequestState:
    req_id: int  # what policies see: stable for the life of the request, across preemptions
    prompt_len: int
    max_tokens: int
    arrival_s: float = 0.0
    domain: str = ""
    predicted_output_len: float | None = None
    generated: int = 0
    attained_service_s: float = 0.0
    rounds: list[RoundRecord] = field(default_factory=list)
    kld_history: list[float] = field(default_factory=list)
    confidence_history: list[float] = field(default_factory=list)
    finished: bool = False
    engine_id: int | None = None  # the engine's id for it while it holds a slot; None = same as req_id
    history_rounds: int | None = None  # keep only this many recent rounds (None = all)
    signals: frozenset[str] = VIEW_SIGNALS  # which RequestView signals to keep (module docstring)
    _view: RequestView | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._keep_rounds = "rounds" in self.signals
        self._keep_klds = "kld_history" in self.signals
        self._keep_confidences = "confidence_history" in self.signals
        # whether `record` has any signal history to keep (else `record_step` skips it)
        self.keeps_history = self._keep_rounds or self._keep_klds or self._keep_confidences

    @property
    def eid(self) -> int:
        """The id to use in engine calls."""
        return self.req_id if self.engine_id is None else self.engine_id

    @property
    def context_len(self) -> int:
        return self.prompt_len + self.generated

    def view(self) -> RequestView:
        """An independent snapshot."""
        return RequestView(
            req_id=self.req_id, prompt_len=self.prompt_len, generated_len=self.generated,
            max_tokens=self.max_tokens, arrival_s=self.arrival_s, predicted_output_len=self.predicted_output_len,
            attained_service_s=self.attained_service_s, domain=self.domain, rounds=list(self.rounds),
            kld_history=list(self.kld_history), confidence_history=list(self.confidence_history))

    def live_view(self) -> RequestView:
        """The shared view, kept current by `record`/`commit` (see the module docstring); O(1)."""
        v = self._view
        if v is None:
            v = self._view = RequestView(
                req_id=self.req_id, prompt_len=self.prompt_len, generated_len=self.generated,
                max_tokens=self.max_tokens, arrival_s=self.arrival_s,
                predicted_output_len=self.predicted_output_len, attained_service_s=self.attained_service_s,
                domain=self.domain, rounds=self.rounds, kld_history=self.kld_history,
                confidence_history=self.confidence_history)
        else:  # fields a caller may have set directly since the last step
            v.generated_len = self.generated
            v.attained_service_s = self.attained_service_s
        return v

    def commit(self, tokens: int) -> None:
        """Count tokens committed outside a verify (a prefill's first token)."""
        self.generated += tokens
        if self._view is not None:
            self._view.generated_len = self.generated

    def record(self, outcome: StepOutcome, i: int, drafts: DraftState, step_s: float) -> None:
        """Fold request i of a verify outcome (and of the step's drafts) into this state and its view."""
        verified = outcome.verified[i]
        if self._keep_rounds:
            rounds = self.rounds
            rounds.append(round_record(outcome.drafted[i], verified, outcome.accepted[i]))
            if self.history_rounds is not None and len(rounds) > self.history_rounds:
                del rounds[: len(rounds) - self.history_rounds]
        if verified:
            if self._keep_klds:
                klds = self.kld_history
                klds.extend(outcome.klds[i])
                if len(klds) > SIGNAL_HISTORY:
                    del klds[: len(klds) - SIGNAL_HISTORY]
            if self._keep_confidences:
                conf = self.confidence_history
                conf.extend(drafts.confidences_of(i, verified))
                if len(conf) > SIGNAL_HISTORY:
                    del conf[: len(conf) - SIGNAL_HISTORY]
        self._advance(len(outcome.committed[i]), step_s, outcome.finished[i])

    def _advance(self, committed: int, step_s: float, finished: bool) -> None:
        self.generated += committed
        self.attained_service_s += step_s
        self.finished = finished
        v = self._view
        if v is not None:
            v.generated_len = self.generated
            v.attained_service_s = self.attained_service_s


def record_step(states: list[RequestState], outcome: StepOutcome, drafts: DraftState, step_s: float) -> None:
    """`RequestState.record` for every request of a step (states aligned with the outcome), with the
    common case — no signal history to keep — in one loop."""
    if any(s.keeps_history for s in states):
        for i, state in enumerate(states):
            state.record(outcome, i, drafts, step_s)
        return
    for state, committed, finished in zip(states, outcome.committed, outcome.finished):
        # RequestState._advance, inlined: this runs per request per step of a long simulated replay
        state.generated += len(committed)
        state.attained_service_s += step_s
        state.finished = finished
        v = state._view
        if v is not None:
            v.generated_len = state.generated
            v.attained_service_s = state.attained_service_s
