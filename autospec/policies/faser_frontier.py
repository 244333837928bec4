"""FASER frontier overlap (§4.3; POLICIES.md §4): the chunk size s_c — a pure function.

The draft drafts chunk c+1 while the target verifies chunk c (the engine runs the protocol:
`TorchSDEngine.frontier_step`). The chunk is the largest s_c in 1..s with
T_q(s_c; b, r) + (s/s_c)·T_p(s_c; b, 1 − r) < T̂(s; b, r)  [paper]
where T_q, T_p are the fitted piecewise latency models (autospec/latency.py, Eq. 11–14) and T̂ the
sequential step time; None when no chunk beats sequential execution (then run without overlap).
"""

from __future__ import annotations

from autospec.latency import PiecewiseLatency, faser_chunk_size


def choose_chunk_size(s: int, b: int, r: float, t_draft: PiecewiseLatency, t_target: PiecewiseLatency,
                      t_hat: float) -> int | None:
    """Largest s_c satisfying FASER's overlap condition, or None (see the module docstring)."""
    if s < 1:
        raise ValueError(f"draft length s must be >= 1, got {s}")
    if b < 1:
        raise ValueError(f"batch size b must be >= 1, got {b}")
    return faser_chunk_size(s, b, r, t_draft, t_target, t_hat)
