"""What a replay takes in and gives back: the requests (`ServeRequest`, with `SyntheticPrompt` for
prompts known only by their length) and the records the serving loop writes (`ServeRecords`: one
`RequestRecord` per request and the per-step columns of `StepLog`).

The loop (`autospec.serving.loop.serve`) fills these; metrics, evaluate, tune, the report and the vLLM
runner read them, so they live apart from the loop that writes them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import chain
from typing import Iterator, Sequence

import numpy as np
import pandas as pd

from autospec.errors import InputError

__all__ = ["SyntheticPrompt", "ServeRequest", "RequestRecord", "StepLog", "ServeRecords", "flatten_steps"]


# one step's per-request values: a list from the per-request path, an int64 array from the batch path
StepRow = list[int] | np.ndarray


def flatten_steps(column: Sequence[StepRow]) -> np.ndarray:
    """A per-request step column (one entry per step, one value per request of its batch) as one int64
    array, in step order. The per-request path logs lists, the batch path (serving/batch.py) arrays,
    which are joined without a Python loop over their values."""
    # the first entry by iteration: `column` may be a pandas Series of a filtered frame, whose index does
    # not start at 0 (column[0] raised KeyError on one repeat's steps)
    if isinstance(next(iter(column), None), np.ndarray):
        return np.concatenate(list(column)).astype(np.int64, copy=False)
    return np.fromiter(chain.from_iterable(column), dtype=np.int64)


class SyntheticPrompt(Sequence[int]):
    """`length` reproducible pseudo-random token ids in [0, vocab), materialised only when iterated.

    Trace replays without prompt text (and every simulated replay) need prompts of a given length;
    20,000 requests × thousands of tokens as Python lists would cost gigabytes, while the simulator
    only asks for `len(prompt)`.
    """

    def __init__(self, length: int, vocab: int, seed: int):
        if length < 1:
            raise InputError(f"a prompt needs at least one token, got {length}", field="prompt_len")
        self.length, self.vocab, self.seed = int(length), max(int(vocab), 1), int(seed)

    def tokens(self) -> list[int]:
        return np.random.default_rng([self.seed, self.length]).integers(0, self.vocab, self.length).tolist()

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[int]:
        return iter(self.tokens())

    def __getitem__(self, index):
        return self.tokens()[index]


@dataclass(frozen=True)
class ServeRequest:
    """One request of a replay: when it arrives (seconds from the start), its prompt and token budget."""

    req_id: int
    arrival_s: float
    prompt: Sequence[int]
    max_tokens: int
    domain: str = ""
    predicted_output_len: float | None = None
    prompt_key: str | None = None  # the prompt it was built from (`autospec.serving.replay.prompt_key`)


@dataclass
class RequestRecord:
    """What happened to one request; times are seconds since the start of `serve`. Its per-token
    times and per-round counts are derived from the step log (`ServeRecords.requests_frame`).

    `arrival_s` is the trace's time; `sent_s` when the client actually sent the request, the time its
    latencies count from (`autospec.serving.metrics`). Open loop they are equal; under a concurrency
    limit (`serve(max_concurrency=N)`) a request is sent only once a slot is free, so `sent_s` may be
    later — and the sent times are the load the engine was really offered."""

    req_id: int
    arrival_s: float
    prompt_len: int
    max_tokens: int
    domain: str
    sent_s: float = math.nan  # NaN here = sent at its arrival (set so in __post_init__)
    admitted_s: float = math.nan  # first admission (prefill start)
    first_token_s: float = math.nan
    finish_s: float = math.nan
    preemptions: int = 0
    # what its preemptions cost: its token share of each re-admission's prefill (recompute), plus an
    # engine's SwapCost charge if it offers one (serving/loop.py, step 4)
    preempt_cost_s: float = 0.0
    output: list[int] | None = None  # token ids, when serve(keep_outputs=True)

    def __post_init__(self) -> None:
        if math.isnan(self.sent_s):
            self.sent_s = self.arrival_s


@dataclass
class StepLog:
    """Per-step columns (one entry per SD step). k = drafted, l = verified per request, in batch order:
    lists of ints from the per-request path, int64 arrays from the batch path (serving/batch.py) — read
    them with `flatten_steps`, or as sequences."""

    start_s: list[float] = field(default_factory=list)
    end_s: list[float] = field(default_factory=list)
    batch: list[int] = field(default_factory=list)
    req_ids: list[StepRow] = field(default_factory=list)
    k: list[StepRow] = field(default_factory=list)
    l: list[StepRow] = field(default_factory=list)  # noqa: E741 — ℓ, the verified count, as in the papers
    accepted: list[StepRow] = field(default_factory=list)
    c: list[StepRow] = field(default_factory=list)  # tokens committed per request (accepted + 1, clipped)
    committed: list[int] = field(default_factory=list)
    draft_s: list[float] = field(default_factory=list)
    verify_s: list[float] = field(default_factory=list)
    early_exit: list[float] = field(default_factory=list)  # pruned / verified draft tokens (FASER early exit)
    prefill_s: list[float] = field(default_factory=list)  # prefill of requests admitted before this step
    admitted: list[int] = field(default_factory=list)
    preempted: list[int] = field(default_factory=list)
    swap_s: list[float] = field(default_factory=list)
    kv_tokens: list[int] = field(default_factory=list)  # Σ context of the batch after the step
    # Prefill events (a request's first token, or the next token of a resumed one); `prefill_before`
    # is the number of steps logged before it, which orders it among the request's step tokens.
    prefill_req: list[int] = field(default_factory=list)
    prefill_t: list[float] = field(default_factory=list)
    prefill_before: list[int] = field(default_factory=list)


@dataclass
class ServeRecords:
    strategy: str
    requests: list[RequestRecord]
    steps: StepLog
    wall_s: float  # host time the replay took (not the engine's clock)
    findings: list[str] = field(default_factory=list)  # the strategy's, after the replay (Strategy.findings)
    # the host's speed before and after the run relative to the profile's (autospec.profile.HostSpeedCheck);
    # empty when the replay had no check (the simulator, vLLM)
    host_speed: list[float] = field(default_factory=list)
    # vLLM only: the host's prefill speed before and after the run relative to the profile's target prefill
    # row (serving/vllm/speed_check.py, VllmSpeedReference.prefill_ratio); reported, never a disturbance rule
    prefill_speed: list[float] = field(default_factory=list)

    def _per_request(self) -> dict[str, list[np.ndarray]]:
        """Token times and per-round counts of each request (in `self.requests` order), from the step
        log: one vectorised pass instead of per-token appends inside the loop."""
        s = self.steps
        ids = pd.Index([r.req_id for r in self.requests])
        n = len(ids)
        sizes = np.asarray(s.batch, dtype=np.int64)

        step_owner = ids.get_indexer(flatten_steps(s.req_ids))
        step_no = np.repeat(np.arange(len(sizes), dtype=np.float64), sizes)
        by_owner = np.argsort(step_owner, kind="stable")  # keeps step order within a request
        bounds = np.searchsorted(step_owner[by_owner], np.arange(n + 1))
        rounds = {name: np.split(flatten_steps(col)[by_owner], bounds[1:-1])
                  for name, col in (("rounds_drafted", s.k), ("rounds_verified", s.l),
                                    ("rounds_accepted", s.accepted))}
        # Token events: prefills (1 token, just before the step that followed them) and steps.
        owner = np.concatenate([ids.get_indexer(np.asarray(s.prefill_req, dtype=np.int64)), step_owner])
        when = np.concatenate([np.asarray(s.prefill_before, dtype=np.float64) - 0.5, step_no])
        times = np.concatenate([np.asarray(s.prefill_t, dtype=np.float64),
                                np.repeat(np.asarray(s.end_s, dtype=np.float64), sizes)])
        counts = np.concatenate([np.ones(len(s.prefill_req), dtype=np.int64), flatten_steps(s.c)])
        order = np.lexsort((when, owner))
        token_owner = np.repeat(owner[order], counts[order])
        token_times = np.repeat(times[order], counts[order])
        token_bounds = np.searchsorted(token_owner, np.arange(n + 1))
        return {"token_times": np.split(token_times, token_bounds[1:-1]), **rounds}

    def requests_frame(self) -> pd.DataFrame:
        """One row per request; list columns hold its token times and per-round counts."""
        rows = self.requests
        derived = self._per_request()
        frame = pd.DataFrame({
            "req_id": [r.req_id for r in rows],
            "domain": [r.domain for r in rows],
            "arrival_s": [r.arrival_s for r in rows],
            "sent_s": [r.sent_s for r in rows],
            "prompt_len": [r.prompt_len for r in rows],
            "max_tokens": [r.max_tokens for r in rows],
            "output_len": [len(t) for t in derived["token_times"]],
            "admitted_s": [r.admitted_s for r in rows],
            "first_token_s": [r.first_token_s for r in rows],
            "finish_s": [r.finish_s for r in rows],
            "preemptions": [r.preemptions for r in rows],
            "preempt_cost_s": [r.preempt_cost_s for r in rows],
            **derived,
        })
        if rows and rows[0].output is not None:
            frame["output"] = [r.output for r in rows]
        return frame

    def steps_frame(self) -> pd.DataFrame:
        s = self.steps
        return pd.DataFrame({
            "step": np.arange(len(s.start_s)), "start_s": s.start_s, "end_s": s.end_s, "batch": s.batch,
            "req_ids": s.req_ids, "k": s.k, "l": s.l, "accepted": s.accepted, "c": s.c, "committed": s.committed,
            "draft_s": s.draft_s, "verify_s": s.verify_s, "early_exit_fraction": s.early_exit,
            "prefill_s": s.prefill_s, "admitted": s.admitted,
            "preempted": s.preempted, "swap_s": s.swap_s, "kv_tokens": s.kv_tokens,
        })
