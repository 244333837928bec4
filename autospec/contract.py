"""The data that flows between engines, the serving loop and policies.

Engines produce these records, policies read them, and only the serving loop (or the simple strategy
runner) imports both sides. Keeping the types here — and nothing else — is what lets engines never
import policies and policies never import engines (see docs/architecture.md, "Where data flows").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

__all__ = ["DraftToken", "DraftState", "RoundRecord", "VIEW_SIGNALS", "CONTEXT_SIGNALS", "StepClockFn", "RequestView",
           "LatencyModel", "StepContext", "StepOutcome"]


@dataclass(frozen=True)
class DraftToken:
    """One token proposed by the draft model for one request."""

    token: int
    confidence: float  # draft probability of the proposed token (its "confidence")
    entropy: float  # entropy (nats) of the draft distribution it was sampled from, before temperature at T=0


class DraftState:
    """Per request, the draft tokens proposed so far in the current step (read-only for policies).

    `tokens`, `confidences` and `entropies` are per-request lists aligned with `req_ids`. A step whose
    lengths were fixed up front gets every request's drafts from the engine in one call
    (`from_rows`); the three lists are then built from those DraftTokens only when a policy first
    reads one of them — verify-all reads `lengths()` only, and building them per request per step
    was a measurable share of a long simulated replay."""

    __slots__ = ("req_ids", "_rows", "_tokens", "_confidences", "_entropies", "_index")

    def __init__(self, req_ids: list[int], tokens: list[list[int]], confidences: list[list[float]],
                 entropies: list[list[float]]):
        self.req_ids = req_ids
        self._rows: Sequence[Sequence[DraftToken]] | None = None
        self._tokens, self._confidences, self._entropies = tokens, confidences, entropies
        self._index: dict[int, int] | None = None

    @classmethod
    def empty(cls, req_ids: Sequence[int]) -> "DraftState":
        n = len(req_ids)
        return cls(list(req_ids), [[] for _ in range(n)], [[] for _ in range(n)], [[] for _ in range(n)])

    @classmethod
    def from_rows(cls, req_ids: Sequence[int], rows: Sequence[Sequence[DraftToken]]) -> "DraftState":
        """Each request's drafts as DraftTokens (aligned with req_ids); the lists are built lazily."""
        state = cls(list(req_ids), [], [], [])
        state._rows = rows
        return state

    def _materialize(self) -> None:
        rows, self._rows = self._rows, None
        if rows is not None:
            self._tokens = [[t.token for t in row] for row in rows]
            self._confidences = [[t.confidence for t in row] for row in rows]
            self._entropies = [[t.entropy for t in row] for row in rows]

    @property
    def tokens(self) -> list[list[int]]:
        self._materialize()
        return self._tokens

    @property
    def confidences(self) -> list[list[float]]:
        self._materialize()
        return self._confidences

    @property
    def entropies(self) -> list[list[float]]:
        self._materialize()
        return self._entropies

    def lengths(self) -> list[int]:
        return [len(t) for t in (self._rows if self._rows is not None else self._tokens)]

    def confidences_of(self, i: int, n: int) -> list[float]:
        """The first n confidences of request i (without building every request's lists)."""
        if self._rows is not None:
            return [t.confidence for t in self._rows[i][:n]]
        return self._confidences[i][:n]

    def append(self, req_id: int, draft: DraftToken) -> None:
        self._materialize()
        index = self._index
        if index is None or len(index) != len(self.req_ids):
            index = self._index = {rid: i for i, rid in enumerate(self.req_ids)}
        i = index[req_id]
        self._tokens[i].append(draft.token)
        self._confidences[i].append(draft.confidence)
        self._entropies[i].append(draft.entropy)


@dataclass(frozen=True)
class RoundRecord:
    """What happened to one request in one SD round."""

    drafted: int
    verified: int
    accepted: int


# The RequestView fields that cost the serving loop work per request per step to keep. A policy names
# the ones it reads in `Policy.reads`; the loop maintains only those some policy of the strategy reads
# (the others stay empty / None), which is most of a long simulated replay's time otherwise.
VIEW_SIGNALS = frozenset({"rounds", "kld_history", "confidence_history", "true_match_len"})
# A StepContext signal filled only for a strategy with a policy that reads it (`Policy.reads`): the
# engine's own step clock (engines.base.StepClock), which only the cost-aware oracle uses.
CONTEXT_SIGNALS = frozenset({"step_clock"})

# seconds of one plain step for requests with these contexts drafting these lengths (StepClock)
StepClockFn = Callable[[Sequence[int], Sequence[int]], float]


@dataclass
class RequestView:
    """A policy's read-only snapshot of one request. `rounds`, `kld_history`, `confidence_history`
    and `true_match_len` are filled only for strategies with a policy that reads them (VIEW_SIGNALS)."""

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
    step_clock: StepClockFn | None = None  # CONTEXT_SIGNALS: the engine's StepClock, when a policy reads it

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
        return sum(map(len, self.committed))
