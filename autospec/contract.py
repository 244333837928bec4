"""The data that flows between engines, the serving loop and policies.

Engines produce these records, policies read them, and only the serving loop (or the simple strategy
runner) imports both sides. Keeping the types here — and nothing else — is what lets engines never
import policies and policies never import engines (see DESIGN.md, "Where data flows").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol, Sequence


@dataclass(frozen=True)
class DraftToken:
    """One token proposed by the draft model for one request."""

    token: int
    confidence: float  # draft probability of the proposed token (its "confidence")
    entropy: float  # entropy (nats) of the draft distribution it was sampled from, before temperature at T=0


@dataclass
class DraftState:
    """Per request, the draft tokens proposed so far in the current step (read-only for policies)."""

    req_ids: list[int]
    tokens: list[list[int]]
    confidences: list[list[float]]
    entropies: list[list[float]]

    @classmethod
    def empty(cls, req_ids: Sequence[int]) -> "DraftState":
        n = len(req_ids)
        return cls(list(req_ids), [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)])

    def lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]

    def append(self, req_id: int, draft: DraftToken) -> None:
        index = self.__dict__.get("_index")
        if index is None or len(index) != len(self.req_ids):
            index = self.__dict__["_index"] = {rid: i for i, rid in enumerate(self.req_ids)}
        i = index[req_id]
        self.tokens[i].append(draft.token)
        self.confidences[i].append(draft.confidence)
        self.entropies[i].append(draft.entropy)


@dataclass(frozen=True)
class RoundRecord:
    """What happened to one request in one SD round."""

    drafted: int
    verified: int
    accepted: int


@dataclass
class RequestView:
    """A policy's read-only snapshot of one request."""

    req_id: int
    prompt_len: int
    generated_len: int
    max_tokens: int
    arrival_s: float = 0.0
    predicted_output_len: float | None = None
    attained_service_s: float = 0.0
    domain: str = ""
    rounds: list[RoundRecord] = field(default_factory=list)
    # Signals of the most recent verified positions (oldest first), kept by the loop for policies
    # such as DSDE (KLD windows) and AdaSpec (confidence means).
    kld_history: list[float] = field(default_factory=list)
    confidence_history: list[float] = field(default_factory=list)
    true_match_len: int | None = None  # only engines that know it (the simulator) fill this; the oracle reads it

    @property
    def context_len(self) -> int:
        return self.prompt_len + self.generated_len

    def acceptance_estimate(self, last_rounds: int = 8) -> float | None:
        """accepted / verified over this request's recent rounds; None before any verified draft."""
        recent = [r for r in self.rounds[-last_rounds:] if r.verified > 0]
        verified = sum(r.verified for r in recent)
        return None if verified == 0 else sum(r.accepted for r in recent) / verified


class LatencyModel(Protocol):
    """Predicted step times in seconds; fitted by `autospec fit`, consumed by model-based policies.

    `context_tokens` is the batch's total context (KV) tokens summed over its requests (AdaSpec's N_c);
    `steps` is the number of sequential one-token draft passes; `tokens_per_request` the positions
    each request sends through the target pass (drafts + 1). See autospec/latency.py.
    """

    def draft_time(self, batch: int, context_tokens: float, steps: int) -> float: ...

    def verify_time(self, batch: int, context_tokens: float, tokens_per_request: float) -> float: ...


@dataclass
class StepContext:
    """What every policy sees at the start of a step."""

    now_s: float
    requests: list[RequestView]
    k_max: int
    temperature: float = 0.0
    sm_split: float | None = None
    latency_model: LatencyModel | None = None
    slo_tpot_s: float | None = None

    @property
    def batch_size(self) -> int:
        return len(self.requests)

    @property
    def req_ids(self) -> list[int]:
        return [r.req_id for r in self.requests]


@dataclass
class StepOutcome:
    """What one verification call did, per request in the verified batch (same order as req_ids)."""

    req_ids: list[int]
    drafted: list[int]
    verified: list[int]
    accepted: list[int]
    committed: list[list[int]]  # tokens appended to each request's output (accepted drafts + bonus, clipped at stop)
    finished: list[bool]
    target_probs: list[list[float]]  # target probability of each verified draft token
    klds: list[list[float]]  # KL(p_target || p_draft) at each verified position
    draft_time_s: float = 0.0  # draft compute spent since the previous verify for these requests
    verify_time_s: float = 0.0
    early_exit_time_s: float = 0.0
    # Draft tokens per request that token-wise early exit removed from the target's remaining layers
    # (FASER §4.2); empty when the engine does no early exit.
    pruned: list[int] = field(default_factory=list)

    @property
    def batch_size(self) -> int:
        return len(self.req_ids)

    @property
    def early_exit_fraction(self) -> float:
        """Pruned / verified draft tokens this step (0 without early exit or without drafts)."""
        verified = sum(self.verified)
        return sum(self.pruned) / verified if self.pruned and verified else 0.0

    def committed_tokens(self) -> int:
        return sum(len(c) for c in self.committed)
