"""Per-request state the serving loop keeps between steps, and the read-only view policies get."""

from __future__ import annotations

from dataclasses import dataclass, field

from autospec.contract import RequestView, RoundRecord, StepOutcome

SIGNAL_HISTORY = 64  # verified positions of KLD/confidence kept per request (DSDE needs 30)


@dataclass
class RequestState:
    req_id: int
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

    def view(self) -> RequestView:
        return RequestView(
            req_id=self.req_id, prompt_len=self.prompt_len, generated_len=self.generated,
            max_tokens=self.max_tokens, arrival_s=self.arrival_s, predicted_output_len=self.predicted_output_len,
            attained_service_s=self.attained_service_s, domain=self.domain, rounds=list(self.rounds),
            kld_history=list(self.kld_history), confidence_history=list(self.confidence_history))

    def record(self, outcome: StepOutcome, i: int, confidences: list[float], step_s: float) -> None:
        """Fold request i of a verify outcome into this state."""
        self.rounds.append(RoundRecord(outcome.drafted[i], outcome.verified[i], outcome.accepted[i]))
        self.kld_history = (self.kld_history + list(outcome.klds[i]))[-SIGNAL_HISTORY:]
        self.confidence_history = (self.confidence_history + confidences[: outcome.verified[i]])[-SIGNAL_HISTORY:]
        self.generated += len(outcome.committed[i])
        self.attained_service_s += step_s
        self.finished = outcome.finished[i]
