"""SM partitioning between draft and target with CUDA green contexts (FASER §4; docs/policies.md §4).

The draft gets r of the GPU's SMs and the target 1 − r, each in its own green context with its own
stream, so a draft pass and a target pass can run at the same time without fighting for SMs. A pool
holds one (draft, target) pair of green contexts per configured r; `select(r)` picks the one the next
passes use, `phase("draft" | "target")` enters it around a pass.

SM counts (the rule, from the CUDA driver API documentation of `cuDevSmResourceSplitByCount`, which
torch's `GreenContext.create(num_sms=...)` builds on; torch's docs state no rule of their own): a
partition must hold at least a minimum number of SMs and a multiple of an alignment that depend on the
compute capability — CC 6.x: ≥ 1, multiple of 1; 7.x: ≥ 2, multiple of 2; 8.x: ≥ 4, multiple of 2;
9.0 and later: ≥ 8, multiple of 8. `split_sms` rounds r·N to the nearest aligned count, keeps both sides
at or above the minimum, and refuses an r that cannot give both sides a legal partition.

Caveat: torch exposes no "remainder" of a split, so the two contexts are two independent `create`
calls; each caps its side's SMs (which is what FASER's latency models measure), but the driver does not
promise that the two sets are disjoint. benchmarks/gpu_smsplit.py measures what the split does.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch.cuda.green_contexts import GreenContext  # importable on any build; create() needs CUDA

from autospec.errors import InputError

NO_CUDA = "SM split needs a CUDA GPU (torch.cuda.is_available() is False)"


def require_cuda() -> None:
    """Raise the one-line InputError (CLI exit 2) when there is no CUDA device."""
    if not torch.cuda.is_available():
        raise InputError(NO_CUDA, field="sm_split")


def partition_rule(major: int, minor: int = 0) -> tuple[int, int]:
    """(minimum SMs, alignment) of a green-context SM partition for compute capability major.minor."""
    if major >= 9:
        return 8, 8
    if major == 8:
        return 4, 2
    if major == 7:
        return 2, 2
    return 1, 1


def parse_fractions(text: str | Sequence[float]) -> list[float]:
    """'0.25,0.5' (or a list) -> sorted unique draft fractions, each in (0, 1)."""
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for item in items:
        try:
            r = float(item)
        except (TypeError, ValueError):
            raise InputError(f"SM split fraction {item!r} is not a number", field="sm_split") from None
        if not 0.0 < r < 1.0 or math.isnan(r):
            raise InputError(f"SM split fraction must be in (0, 1), got {r}", field="sm_split")
        out.append(r)
    if not out:
        raise InputError("no SM split fraction given", field="sm_split")
    return sorted(set(out))


@dataclass(frozen=True)
class SplitCounts:
    r: float  # requested draft fraction
    draft_sms: int
    target_sms: int

    @property
    def actual_r(self) -> float:
        return self.draft_sms / (self.draft_sms + self.target_sms)


def split_sms(total_sms: int, r: float, major: int, minor: int = 0) -> SplitCounts:
    """Aligned SM counts for the draft (≈ r·total) and the target (the rest, aligned down)."""
    if not 0.0 < r < 1.0:
        raise InputError(f"SM split fraction must be in (0, 1), got {r}", field="sm_split")
    low, align = partition_rule(major, minor)
    usable = total_sms // align * align
    if usable < 2 * low:
        raise InputError(f"the GPU's {total_sms} SMs cannot be split in two partitions of at least {low}",
                         field="sm_split")
    draft = int(round(r * total_sms / align)) * align
    draft = min(max(draft, low), usable - low)
    target = usable - draft
    return SplitCounts(r, draft, target)


class SMSplit:
    """A pool of (draft, target) green contexts, one pair per configured draft fraction r."""

    def __init__(self, device: torch.device | str, fractions: Sequence[float]):
        require_cuda()
        self.device = torch.device(device)
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        self.total_sms = int(props.multi_processor_count)
        self.capability = (int(props.major), int(props.minor))
        self.counts: dict[float, SplitCounts] = {}
        self._contexts: dict[float, dict[str, object]] = {}
        for r in parse_fractions(list(fractions)):
            c = split_sms(self.total_sms, r, *self.capability)
            try:
                pair = {"draft": GreenContext.create(num_sms=c.draft_sms, device_id=index),
                        "target": GreenContext.create(num_sms=c.target_sms, device_id=index)}
            except RuntimeError as exc:  # built without green contexts, or an old driver
                raise InputError(f"cannot create green contexts on this GPU: {exc}", field="sm_split") from None
            self.counts[r] = c
            self._contexts[r] = pair
        self.current = min(self.counts)

    def select(self, r: float) -> None:
        if r not in self._contexts:
            raise InputError(f"SM split {r} is not in the pool {sorted(self._contexts)}", field="sm_split")
        self.current = r

    @contextmanager
    def phase(self, which: str) -> Iterator[None]:
        """Run the enclosed CUDA work in `which`'s green context and on its stream."""
        ctx = self._contexts[self.current][which]
        ctx.set_context()  # type: ignore[attr-defined]
        try:
            with torch.cuda.stream(ctx.Stream()):  # type: ignore[attr-defined]
                yield
        finally:
            ctx.pop_context()  # type: ignore[attr-defined]
