"""Builders for the policy tests: contexts, draft states and outcomes from plain numbers.

(A uniquely named module, not conftest.py, so test files can import it without clashing with other
test directories' conftest modules.)"""

from __future__ import annotations

from typing import Sequence

from autospec.contract import DraftState, RequestView, StepContext, StepOutcome
from autospec.latency import LinearCoeffs, LinearLatencyModel


def make_ctx(batch: int, *, k_max: int = 8, model=None, slo=None, context_len: int = 100,
             match_lens: Sequence[int | None] | None = None, sm_split: float | None = None) -> StepContext:
    reqs = [RequestView(req_id=i, prompt_len=context_len, generated_len=0, max_tokens=256,
                        true_match_len=None if match_lens is None else match_lens[i]) for i in range(batch)]
    return StepContext(now_s=0.0, requests=reqs, k_max=k_max, latency_model=model, slo_tpot_s=slo,
                       sm_split=sm_split)


def make_drafts(confidences: Sequence[Sequence[float]], entropies: Sequence[Sequence[float]] | None = None,
                req_ids: Sequence[int] | None = None) -> DraftState:
    ids = list(req_ids) if req_ids is not None else list(range(len(confidences)))
    ents = entropies or [[0.0] * len(c) for c in confidences]
    return DraftState(ids, [[0] * len(c) for c in confidences], [list(c) for c in confidences],
                      [list(e) for e in ents])


def make_outcome(drafted: Sequence[int], accepted: Sequence[int], *, verified: Sequence[int] | None = None,
                 klds: Sequence[Sequence[float]] | None = None, draft_time: float = 0.0,
                 verify_time: float = 0.0, finished: Sequence[bool] | None = None,
                 req_ids: Sequence[int] | None = None) -> StepOutcome:
    n = len(drafted)
    ver = list(verified) if verified is not None else list(drafted)
    return StepOutcome(
        req_ids=list(req_ids) if req_ids is not None else list(range(n)),
        drafted=list(drafted), verified=ver, accepted=list(accepted),
        committed=[[0] * (a + 1) for a in accepted],
        finished=list(finished) if finished is not None else [False] * n,
        target_probs=[[1.0] * v for v in ver],
        klds=[list(k) for k in klds] if klds is not None else [[] for _ in range(n)],
        draft_time_s=draft_time, verify_time_s=verify_time)


def simple_linear_model() -> LinearLatencyModel:
    """Context-free time model: a draft pass costs 10 ms; a target pass 50 ms + 10 ms per token."""
    return LinearLatencyModel(draft=LinearCoeffs(0.0, 0.0, 0.01), target=LinearCoeffs(0.0, 0.01, 0.05))
