"""FASER frontier overlap (§4.3; docs/policies.md §4): the chunk size s_c — pure functions the serving
step applies (it is a rule of the step's execution, not a policy a strategy picks).

The draft drafts chunk c+1 while the target verifies chunk c (the engine runs the protocol:
`TorchSDEngine.frontier_step`, `SimEngine.frontier_step`). The chunk is the largest s_c in 1..s with
T_q(s_c; b, r) + (s/s_c)·T_p(s_c; b, 1 − r) < T̂(s; b, r)  [paper]
where T_q, T_p are the fitted piecewise latency models (autospec/latency.py, Eq. 11–14) and T̂ the
sequential step time; None when no chunk beats sequential execution (then run without overlap).

`execution.chunk_size = "auto"` asks for this chunk every step (`frontier_chunk`). The condition prices
the draft of chunk c+1 as hidden behind the verify of chunk c, which holds only when the two run at the
same time: in their own green contexts, draft on r > 0 of the SMs. Without a split (r = 0; every CPU)
the engine runs them one after the other, so "auto" runs the step without overlap; the same without
models that know r (a profile with no r axis: its one-segment fits are whole-GPU times, which say
nothing about the draft on r of the SMs). A fixed chunk_size runs chunked at any r (tune can score it on
the simulator, which prices serial chunks as serial passes).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Callable

from autospec.latency import FaserModels, faser_chunk_size

__all__ = ["choose_chunk_size", "frontier_chunk"]


# A chunk's time as a function of (b, s_c, r): a PiecewiseLatency, or FaserModels.draft_time / verify_time.
ChunkTime = Callable[[int, int, float], Any]


def choose_chunk_size(s: int, b: int, r: float, t_draft: ChunkTime, t_target: ChunkTime,
                      t_hat: float) -> int | None:
    """Largest s_c satisfying FASER's overlap condition, or None (see the module docstring).

    `t_draft(b, s_c, r)` / `t_target(b, s_c, r)`: the times of drafting / verifying a chunk of s_c
    (a PiecewiseLatency, or `FaserModels.draft_time` / `verify_time`, which use the profile's units)."""
    if s < 1:
        raise ValueError(f"draft length s must be >= 1, got {s}")
    if b < 1:
        raise ValueError(f"batch size b must be >= 1, got {b}")
    # latency.faser_chunk_size names PiecewiseLatency, but only calls t(b, s_c, r) and takes float() of it
    return faser_chunk_size(s, b, r, t_draft, t_target, t_hat)  # type: ignore[arg-type]


@lru_cache(maxsize=4096)
def frontier_chunk(models: FaserModels, s: int, b: int, r: float) -> int | None:
    """The chunk `chunk_size = "auto"` runs for a step drafting s tokens for b requests at SM split r:
    FASER's condition on the fitted models, T̂ their sequential step; None (no overlap this step) for
    s < 1, r = 0 or models without an r axis (module docstring). Cached: a replay asks for the same
    (s, b, r) over and over."""
    if s < 1 or b < 1 or r <= 0 or not models.has_r_axis:
        return None
    return choose_chunk_size(s, b, r, models.draft_time, models.verify_time, models.sequential_time(s, b, r))
