"""The Engine contract every engine (torch, vllm, sim) implements; see docs/architecture.md.

The serving loop drives an engine with a handful of calls: `add` (prefill, returns the first token),
`draft` (one more draft token for each of some requests), `verify` (run the target over a per-request
number of drafted tokens and commit what the acceptance rule keeps), `remove`, and a clock. Engines never
import policies; they exchange the plain records of `autospec.contract`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from autospec.contract import DraftToken, StepOutcome


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


@dataclass(frozen=True)
class PrefillResult:
    req_ids: list[int]
    first_tokens: list[int]
    finished: list[bool]
    time_s: float


class Engine(Protocol):
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


def draft_rounds(engine: Engine, req_ids: Sequence[int], lengths: Sequence[int]) -> list[list[DraftToken]]:
    """Draft `lengths[i]` tokens for request `req_ids[i]`: round j drafts one token for every request
    with lengths > j — exactly the calls the one-token-at-a-time loop makes for lengths decided up
    front. An engine may provide a batched `draft_rounds(req_ids, lengths)` with the same result and
    timing (the simulator does; it is most of a long replay's time otherwise)."""
    own = getattr(engine, "draft_rounds", None)
    if callable(own):
        return own(req_ids, lengths)
    out: list[list[DraftToken]] = [[] for _ in req_ids]
    for j in range(max(lengths, default=0)):
        chosen = [i for i, k in enumerate(lengths) if k > j]
        for i, tok in zip(chosen, engine.draft([req_ids[i] for i in chosen])):
            out[i].append(tok)
    return out
