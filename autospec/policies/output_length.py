"""Output-length prediction for length-aware schedulers (LAPS-SD, LP-SJF; docs/policies.md §7).

LAPS-SD uses a learned predictor; autospec's default is an oracle with noise: the request's true
output length (in trace replay `max_tokens` is the trace's recorded output length) times a lognormal
error exp(N(0, σ²)). σ = 0.07 [chosen] matches the ≈7% estimate error the paper reports. A value
the serving loop already put in RequestView.predicted_output_len wins over the predictor.
"""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from autospec.contract import RequestView


class OutputLengthPredictor(Protocol):
    def predict(self, request: RequestView) -> float: ...


class OracleNoisePredictor:
    """max_tokens × exp(N(0, σ²)); the noise is a function of (seed, req_id), so a request's
    prediction does not depend on which other requests were predicted before it."""

    def __init__(self, sigma: float = 0.07, seed: int = 0) -> None:
        if sigma < 0:
            raise ValueError("sigma must be >= 0")
        self.sigma = sigma
        self.seed = seed

    def predict(self, request: RequestView) -> float:
        if self.sigma == 0:
            return float(request.max_tokens)
        noise = np.random.default_rng([self.seed, request.req_id]).normal(0.0, self.sigma)
        return float(request.max_tokens * math.exp(noise))


class PredictedLengths:
    """Per-request predictions, made once and cached (a scheduler must not see its estimate jitter)."""

    def __init__(self, predictor: OutputLengthPredictor) -> None:
        self.predictor = predictor
        self._cache: dict[int, float] = {}

    def total(self, request: RequestView) -> float:
        if request.predicted_output_len is not None:
            return float(request.predicted_output_len)
        if request.req_id not in self._cache:
            self._cache[request.req_id] = self.predictor.predict(request)
        return self._cache[request.req_id]

    def remaining(self, request: RequestView) -> float:
        return max(self.total(request) - request.generated_len, 0.0)

    def forget(self, req_id: int) -> None:
        self._cache.pop(req_id, None)
