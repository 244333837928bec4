"""The Trace: a table of requests (when each arrives, how long its prompt and output are, its domain).

A Trace wraps a pandas DataFrame with one row per request, sorted by arrival:

| column | type | meaning |
|---|---|---|
| arrival_s | float | seconds since the start of the trace |
| prompt_len | int | prompt tokens (the trace's figure; replaying with real text may tokenize differently) |
| output_len | int | tokens to generate (>= 1) |
| domain | str | prompt set the request draws from (code, chat, math, ...) |
| prompt | str or None | prompt text, once `assign_prompts` has run |
| source_id | str or None | where the prompt text came from |

Traces are values: every operation returns a new Trace and leaves the old one alone, so a spec can
be applied step by step (window → scale → cap → clip → prompts) without copies leaking between steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import numpy as np
import pandas as pd

from autospec.workloads.prompts import Prompt

COLUMNS = ("arrival_s", "prompt_len", "output_len", "domain", "prompt", "source_id")


@dataclass(frozen=True)
class TraceRequest:
    """One row of a trace, for code that walks requests one by one (the serving loop)."""

    req_id: int
    arrival_s: float
    prompt_len: int
    output_len: int
    domain: str
    prompt: str | None = None
    source_id: str | None = None


class Trace:
    """An immutable table of requests; see the module docstring for the columns."""

    def __init__(self, requests: pd.DataFrame, name: str = ""):
        self._df = _normalise(requests)
        self.name = name

    # --- construction --------------------------------------------------------------------------

    @classmethod
    def from_arrays(cls, arrival_s: Sequence[float], prompt_len: Sequence[int], output_len: Sequence[int],
                    domain: str | Sequence[str] = "chat", name: str = "") -> "Trace":
        """A trace from parallel arrays (a single `domain` string labels every request)."""
        n = len(arrival_s)
        domains = [domain] * n if isinstance(domain, str) else list(domain)
        frame = pd.DataFrame({"arrival_s": np.asarray(arrival_s, dtype=float),
                              "prompt_len": np.asarray(prompt_len), "output_len": np.asarray(output_len),
                              "domain": domains})
        return cls(frame, name=name)

    def _with(self, frame: pd.DataFrame) -> "Trace":
        return Trace(frame, name=self.name)

    # --- reading ------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._df)

    def __repr__(self) -> str:
        return f"Trace({self.name or 'unnamed'}: {len(self)} requests over {self.duration_s:.1f} s)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Trace) and self._df.equals(other._df)

    __hash__ = None  # equal by content, like the DataFrame inside; so not hashable

    def to_frame(self) -> pd.DataFrame:
        """A copy of the request table (changing it does not change the trace)."""
        return self._df.copy()

    def column(self, name: str) -> np.ndarray:
        """A copy of one column as a numpy array."""
        return self._df[name].to_numpy(copy=True)

    def requests(self) -> Iterator[TraceRequest]:
        """The rows in arrival order, numbered from 0."""
        for i, row in enumerate(self._df.itertuples(index=False)):
            yield TraceRequest(i, float(row.arrival_s), int(row.prompt_len), int(row.output_len), str(row.domain),
                               None if pd.isna(row.prompt) else str(row.prompt),
                               None if pd.isna(row.source_id) else str(row.source_id))

    @property
    def duration_s(self) -> float:
        """Time from 0 to the last arrival."""
        return float(self._df["arrival_s"].iloc[-1]) if len(self) else 0.0

    @property
    def has_prompts(self) -> bool:
        return len(self) > 0 and bool(self._df["prompt"].notna().all())

    def stats(self) -> dict[str, float]:
        """Summary numbers for reports: size, rate, burstiness (inter-arrival CV) and mean lengths."""
        gaps = np.diff(self._df["arrival_s"].to_numpy())
        mean_gap = float(gaps.mean()) if len(gaps) else 0.0
        return {
            "requests": float(len(self)),
            "duration_s": self.duration_s,
            "mean_rate_per_s": len(self) / self.duration_s if self.duration_s > 0 else 0.0,
            "interarrival_cv": float(gaps.std() / mean_gap) if mean_gap > 0 else 0.0,
            "mean_prompt_len": float(self._df["prompt_len"].mean()) if len(self) else 0.0,
            "mean_output_len": float(self._df["output_len"].mean()) if len(self) else 0.0,
        }

    # --- operations (each returns a new Trace) -------------------------------------------------

    def window(self, start_s: float, duration_s: float | None = None) -> "Trace":
        """Requests arriving in [start_s, start_s + duration_s), re-timed so the window starts at 0."""
        _require(start_s >= 0, f"window start must be >= 0, got {start_s}")
        _require(duration_s is None or duration_s > 0, f"window duration must be > 0, got {duration_s}")
        t = self._df["arrival_s"]
        keep = t >= start_s
        if duration_s is not None:
            keep &= t < start_s + duration_s
        frame = self._df[keep].copy()
        frame["arrival_s"] -= start_s
        return self._with(frame)

    def time_scale(self, factor: float) -> "Trace":
        """Multiply every arrival time by `factor`: 2.0 stretches the trace to half the request rate."""
        _require(np.isfinite(factor) and factor > 0, f"time scale must be > 0, got {factor}")
        frame = self._df.copy()
        frame["arrival_s"] *= factor
        return self._with(frame)

    def rate_scale(self, factor: float) -> "Trace":
        """Multiply the request rate by `factor` (divides arrival times): 2.0 is twice the load."""
        _require(np.isfinite(factor) and factor > 0, f"rate scale must be > 0, got {factor}")
        return self.time_scale(1.0 / factor)

    def cap(self, max_requests: int) -> "Trace":
        """The first `max_requests` requests."""
        _require(max_requests >= 1, f"max_requests must be >= 1, got {max_requests}")
        return self._with(self._df.iloc[:max_requests])

    def clip_lengths(self, max_prompt_tokens: int | None = None, max_output_tokens: int | None = None) -> "Trace":
        """Cap prompt and output lengths, so a production trace fits a small model's context and speed."""
        frame = self._df.copy()
        if max_prompt_tokens is not None:
            _require(max_prompt_tokens >= 1, f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
            frame["prompt_len"] = frame["prompt_len"].clip(upper=max_prompt_tokens)
        if max_output_tokens is not None:
            _require(max_output_tokens >= 1, f"max_output_tokens must be >= 1, got {max_output_tokens}")
            frame["output_len"] = frame["output_len"].clip(upper=max_output_tokens)
        return self._with(frame)

    def assign_prompts(self, prompt_sets: Mapping[str, Sequence[Prompt]], seed: int = 0) -> "Trace":
        """Give each request a prompt text from the set of its domain, reproducibly for a given seed.

        Within a domain the prompts are dealt from a seeded shuffle and reshuffled once used up, so
        every prompt is used before any repeats. A request whose domain has no prompt set draws from all
        sets pooled, and its `domain` becomes that of the prompt it got, so per-domain results describe
        the text that was actually sent. `prompt_len` keeps the trace's figure.
        """
        sets = {domain: list(prompts) for domain, prompts in prompt_sets.items() if len(prompts)}
        _require(bool(sets), "assign_prompts needs at least one non-empty prompt set")
        pooled = [p for domain in sorted(sets) for p in sets[domain]]
        rng = np.random.default_rng(seed)
        frame = self._df.copy()
        texts: list[str] = [""] * len(frame)
        sources: list[str] = [""] * len(frame)
        domains = frame["domain"].to_numpy(dtype=object).copy()
        # Deal per domain in sorted order so the draw does not depend on dict ordering.
        for domain in sorted(set(domains)):
            rows = np.flatnonzero(domains == domain)
            chosen = _deal(sets.get(domain, pooled), len(rows), rng)
            for row, prompt in zip(rows, chosen):
                texts[row], sources[row], domains[row] = prompt.text, prompt.source_id, prompt.domain
        frame["prompt"], frame["source_id"], frame["domain"] = texts, sources, domains
        return self._with(frame)

    def drop_prompts(self) -> "Trace":
        frame = self._df.copy()
        frame["prompt"], frame["source_id"] = None, None
        return self._with(frame)


def _deal(prompts: Sequence[Prompt], count: int, rng: np.random.Generator) -> list[Prompt]:
    """`count` prompts from successive seeded shuffles of `prompts`."""
    out: list[Prompt] = []
    while len(out) < count:
        out.extend(prompts[i] for i in rng.permutation(len(prompts)))
    return out[:count]


def _require(condition: bool, message: str) -> None:
    # Operation arguments come from workload specs; spec.py turns these into InputErrors naming the field.
    if not condition:
        raise ValueError(message)


def _normalise(frame: pd.DataFrame) -> pd.DataFrame:
    """Check the columns and values, fix dtypes, sort by arrival, reset the index."""
    missing = [c for c in ("arrival_s", "prompt_len", "output_len", "domain") if c not in frame.columns]
    _require(not missing, f"trace is missing columns {missing}")
    out = pd.DataFrame({
        "arrival_s": pd.to_numeric(frame["arrival_s"]).astype("float64"),
        "prompt_len": pd.to_numeric(frame["prompt_len"]),
        "output_len": pd.to_numeric(frame["output_len"]),
        "domain": frame["domain"].astype(object),
        "prompt": frame["prompt"].astype(object) if "prompt" in frame else None,
        "source_id": frame["source_id"].astype(object) if "source_id" in frame else None,
    }, index=frame.index)
    for col in ("prompt_len", "output_len"):
        values = out[col].to_numpy(dtype=float)
        _require(bool(np.all(np.isfinite(values)) and np.all(values == np.round(values))),
                 f"{col} must hold whole numbers")
        out[col] = values.astype("int64")
    arrival = out["arrival_s"].to_numpy()
    _require(bool(np.all(np.isfinite(arrival))) and bool(np.all(arrival >= 0)), "arrival_s must be finite and >= 0")
    _require(bool((out["prompt_len"] >= 0).all()), "prompt_len must be >= 0")
    _require(bool((out["output_len"] >= 1).all()), "output_len must be >= 1")
    _require(bool(out["domain"].map(lambda d: isinstance(d, str) and d != "").all()),
             "domain must be a non-empty string")
    out = out.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    return out[list(COLUMNS)]
