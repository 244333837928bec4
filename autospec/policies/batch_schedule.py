"""Draft length by batch size: the per-batch-size K schedule vLLM deploys (docs/policies.md §1, static K
generalised; vLLM's `num_speculative_tokens_per_batch_size`).

The batch sizes are split into buckets by `edges` (each bucket's smallest batch size; the first is 1,
the last bucket is open-ended) and every request in a batch of size b drafts `k[bucket(b)]` tokens.
SD pays at small batches, where the target is memory-bound and a verify of k+1 tokens costs about one
decode, and stops paying as the batch fills the machine — one K per bucket lets a tuner find where.
`autospec tune` searches each bucket's K (a search range on a list parameter searches each element)
and `autospec.deploy` writes the result as vLLM's [start, end, K] ranges.
"""

from __future__ import annotations

from bisect import bisect_right

from pydantic import Field, model_validator

from autospec.contract import StepContext
from autospec.policies.base import PolicyParams, TargetLengthPolicy, register_length

# [chosen] powers-of-two buckets 1, 2, 3-4, 5-8, 9-16, 17-32, 33+ (vLLM captures CUDA graphs at
# similar sizes); K falls with the batch as a starting point, tune replaces it.
DEFAULT_EDGES = [1, 2, 3, 5, 9, 17, 33]
DEFAULT_K = [4, 4, 3, 3, 2, 2, 1]


class BatchScheduleParams(PolicyParams):
    edges: list[int] = Field(default_factory=lambda: list(DEFAULT_EDGES), min_length=1)
    k: list[int] = Field(default_factory=lambda: list(DEFAULT_K), min_length=1)

    @model_validator(mode="after")
    def _check(self) -> "BatchScheduleParams":
        if self.edges[0] != 1:
            raise ValueError(f"edges must start at batch size 1, got {self.edges[0]}")
        if any(b <= a for a, b in zip(self.edges, self.edges[1:])):
            raise ValueError(f"edges must be strictly increasing, got {self.edges}")
        if len(self.k) != len(self.edges):
            raise ValueError(f"k needs one value per bucket: {len(self.edges)} edges, {len(self.k)} values")
        if min(self.k) < 0:
            raise ValueError(f"k must be >= 0, got {self.k}")
        return self

    def k_for(self, batch: int) -> int:
        return self.k[max(0, bisect_right(self.edges, batch) - 1)]

    def ranges(self, max_batch: int) -> list[tuple[int, int, int]]:
        """[start, end, K] per bucket up to max_batch, inclusive (vLLM's schedule shape)."""
        out = []
        for i, start in enumerate(self.edges):
            if start > max_batch:
                break
            end = self.edges[i + 1] - 1 if i + 1 < len(self.edges) else max_batch
            out.append((start, min(end, max_batch), self.k[i]))
        return out


@register_length("batch-schedule")
class BatchScheduleLength(TargetLengthPolicy):
    """Every request drafts K(batch size) tokens, K from the bucket the step's batch size falls in."""

    reads = frozenset()  # RequestView signals it reads (Policy.reads)

    Params = BatchScheduleParams
    params: BatchScheduleParams

    def targets(self, ctx: StepContext) -> list[int]:
        return [self.uniform_length(ctx.batch_size)] * ctx.batch_size

    def uniform_length(self, batch_size: int) -> int:  # UniformLengthPolicy
        return self.params.k_for(batch_size)
