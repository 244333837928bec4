"""FASER token-wise early exit during verification (FASER §4.2; docs/policies.md §4) — pure functions.

From layer L_init = ⌊0.4·L⌋ the target's hidden state that predicts draft position j is projected
through the final norm and LM head; the draft token is flagged (likely rejected) when at least K_ℓ
vocabulary entries score above it — a rank test, no full top-k. K_ℓ falls linearly from 64 at L_init
to 10 at layer L − 1: conservative early, stricter deeper. Flagged tokens are pruned only when the
time saved on the k̂_rej tokens expected to be rejected beats the cost of pruning them (Eq. 5–10).
The engine applies these; keeping the position before a pruned token at full depth is what keeps the
result lossless.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class EarlyExitParams(BaseModel):
    """The early-exit rule's parameters. Configured as every policy's parameters
    (`autospec.policies.base.PolicyParams`: strict, unknown keys rejected, immutable) but not derived from
    it: the torch engine applies these rules, and engines never import policies (tests/test_layers.py)."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    start_fraction: float = Field(0.4, gt=0.0, lt=1.0)  # L_init = ⌊fraction·L⌋ [chosen]
    k_start: int = Field(64, ge=1)  # K_ℓ at L_init [chosen]
    k_end: int = Field(10, ge=1)  # K_ℓ at layer L − 1 [chosen]
    # Eq. 10's times when no fitted FASER model supplies them, as fractions of one full verify pass
    # (only ratios enter Eq. 6–10): T_ee one rank check (final norm + LM head over the verified
    # positions), T_pr dropping the pruned positions from the batch [chosen]. T_t, the target's time
    # for the k̂_rej tokens, is then k̂_rej / (fed positions) of the pass (`ratio_times`).
    check_cost_ratio: float = Field(0.05, ge=0.0)
    prune_cost_ratio: float = Field(0.01, ge=0.0)


def start_layer(n_layers: int, fraction: float = 0.4) -> int:
    """L_init = ⌊fraction·L⌋: the first layer whose hidden state is tested."""
    return math.floor(fraction * n_layers)


def rank_threshold(layer: int, n_layers: int, params: EarlyExitParams | None = None) -> int:
    """K_ℓ, linear from k_start at L_init to k_end at L − 1, rounded to the nearest integer."""
    p = params or EarlyExitParams()
    first, last = start_layer(n_layers, p.start_fraction), n_layers - 1
    if not first <= layer <= last:
        raise ValueError(f"layer {layer} is outside the early-exit range [{first}, {last}]")
    if last == first:
        return p.k_end
    frac = (layer - first) / (last - first)
    return int(round(p.k_start + frac * (p.k_end - p.k_start)))


def rank_flag(logits: np.ndarray | Sequence[float], token: int, k: int) -> bool:
    """True when at least k vocabulary entries score strictly above `token` (the token is flagged)."""
    scores = np.asarray(logits)
    return int(np.count_nonzero(scores > scores[token])) >= k


def expected_rejections(draft_lengths: Sequence[int], acceptance: Sequence[float]) -> float:
    """k̂_rej = Σ_i s_i·(1 − â_i) (Eq. 5): the draft tokens the batch expects to lose."""
    return float(sum(s * (1.0 - a) for s, a in zip(draft_lengths, acceptance)))


def ratio_times(params: EarlyExitParams, fed_positions: int, k_rej: float) -> tuple[float, float, float]:
    """(T_t, T_ee, T_pr) for Eq. 6–10 without a fitted FASER model, in units of one full verify pass
    over `fed_positions` positions: T_t = k̂_rej / fed_positions, the share of the pass spent on the
    tokens expected to be rejected [chosen: a pass's cost taken as proportional to its positions],
    and the params' check and pruning cost ratios."""
    share = min(max(k_rej, 0.0) / fed_positions, 1.0) if fed_positions > 0 else 0.0
    return share, params.check_cost_ratio, params.prune_cost_ratio


def time_saved(n_layers: int, layer: int, t_target: float, t_early_exit: float) -> float:
    """T_save (Eq. 6–9), evaluated at k̂_rej: `t_target` is T_t(b, r, k̂_rej), the target's time for
    the k̂_rej tokens expected to be rejected (not the whole verify pass). ΔL = L·T_ee/T_t layers'
    worth of checking; L' = max(L − ℓ − ΔL, 0); T_save = (L'/L)·T_t. Nothing to save when T_t = 0."""
    if t_target <= 0.0:
        return 0.0
    delta_layers = n_layers * t_early_exit / t_target
    remaining = max(n_layers - layer - delta_layers, 0.0)
    return remaining / n_layers * t_target


def should_prune(n_layers: int, layer: int, t_target: float, t_early_exit: float, t_prune: float) -> bool:
    """Eq. 10: prune the flagged tokens when T_save(k̂_rej) > T_pr(b, r, k̂_rej); `t_target` is
    T_t(b, r, k̂_rej) (see `time_saved`)."""
    return time_saved(n_layers, layer, t_target, t_early_exit) > t_prune
