"""vLLM scheduler subclass that records every engine step for autospec (imported by vLLM's engine core).

vLLM runs its own continuous-batching scheduler in the engine-core process, so autospec cannot drive it
step by step the way `autospec.serving.loop.serve` drives the torch engine and the simulator. Instead
this `scheduler_cls` writes one JSON line per engine step to the file named by
`additional_config["autospec_step_log"]`:

    {"t0": schedule() start, "t1": update_from_output() start (perf_counter seconds, CLOCK_MONOTONIC,
     the same clock as the client's time.perf_counter on Linux),
     "ids": external request ids, "n": tokens scheduled, "k": drafts verified, "c": tokens committed,
     "first": whether the step produced the request's first output token,
     "pre": requests preempted (for recompute) when this step was scheduled}

On this CPU build the engine runs synchronously (no async scheduling), so t0..t1 is the whole step:
the target's verify forward, sampling, and the draft proposals for the next step. The last of these
is timed directly: `DraftTimer` (a worker extension, so it runs in vLLM's worker process, which on the
CPU build is not the engine core's) wraps the model runner's `propose_draft_token_ids` — the one call
that runs the draft model, its prompt prefill for new requests included — with a clock and logs each
call to a second file; `autospec.serving.vllm.step_log.read_step_log` adds each step's draft seconds
("d") from it. So the profile reads the draft's cost from vLLM itself instead of differencing two
engines' whole steps.

`OnlineKScheduler` (a subclass, same log plus "K" and "tk") runs an autospec length policy (GP-LCB,
SmartSpec) inside the engine core: it chooses the batch K vLLM drafts every step and trims each
request's drafts to its own length (class docstring).

This module imports vLLM at import time: only vLLM's engine core imports it (by dotted path).
"""

from __future__ import annotations

import itertools
import json
import time
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds

from autospec.contract import RequestView, RoundRecord, StepOutcome
from autospec.serving.vllm.online import ONLINE_KEY, OnlineLength

__all__ = ["DraftTimer", "FixedKDraftScheduler", "FixedKProposer", "OnlineKScheduler", "RecordingScheduler"]

STEP_LOG_KEY = "autospec_step_log"

DRAFT_LOG_KEY = "autospec_draft_log"
WORKER_EXTENSION = "autospec.serving.vllm.scheduler.DraftTimer"


class DraftTimer:
    """vLLM `worker_extension_cls` whose import, in the worker process, wraps the model runner's
    `propose_draft_token_ids` with a clock (module docstring). Each call appends {"t": start, "d":
    seconds, "p": [seconds of each draft forward pass]} (perf_counter, CLOCK_MONOTONIC: comparable
    across the engine's processes) to the file named
    by `additional_config["autospec_draft_log"]`; runners without that key are untouched. The clock comes
    from vLLM importing the class there; the class adds one method, which reports the worker's OpenMP
    runtime and threads (`autospec_worker_runtime`). On CUDA the clock synchronises
    the device before and after the call, so the time is the draft's work and not its launch (a
    recording run pays that; a deployment never installs this)."""

    def autospec_worker_runtime(self) -> dict[str, Any]:
        """What this worker computes on (`openmp.worker_runtime`), read through `LLM.collective_rpc`:
        vLLM adds an extension's methods to its worker class."""
        from autospec.serving.vllm.openmp import worker_runtime

        return worker_runtime()


def _time_draft_proposals() -> None:
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner  # the CPU runner inherits the method

    original = GPUModelRunner.propose_draft_token_ids
    if getattr(original, "_autospec_timed", False):
        return

    def timed(self, *args, **kwargs):
        log = _draft_log(self)
        if log is None:
            return original(self, *args, **kwargs)
        sync = _cuda_sync(self)
        passes = _draft_passes(self, sync)
        passes.clear()
        sync()
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            sync()
            log.write(json.dumps({"t": start, "d": time.perf_counter() - start, "p": list(passes)}) + "\n")

    timed._autospec_timed = True  # type: ignore[attr-defined]
    GPUModelRunner.propose_draft_token_ids = timed


def _draft_log(runner):
    log = getattr(runner, "_autospec_draft_log", False)
    if log is False:
        path = (runner.vllm_config.additional_config or {}).get(DRAFT_LOG_KEY)
        log = open(path, "a", buffering=1, encoding="utf-8") if path else None  # noqa: SIM115 — lives with the runner
        runner._autospec_draft_log = log
    return log


def _draft_passes(runner, sync) -> list[float]:
    """The draft model's forward passes in the current proposal call, in seconds: forward hooks on the
    drafter's model (the first pass runs over the tokens the target just verified — over the prompt,
    for a new request —, the others over one token per request). Empty for drafters without a model."""
    passes = getattr(runner, "_autospec_passes", None)
    if passes is None:
        passes = runner._autospec_passes = []
        model: Any = getattr(getattr(runner, "drafter", None), "model", None)  # a torch module, or None
        if hasattr(model, "register_forward_hook"):
            started: list[float] = []

            def before(*_):
                sync()
                started.append(time.perf_counter())

            def after(*_):
                sync()
                if started:
                    passes.append(time.perf_counter() - started.pop())

            model.register_forward_pre_hook(before)
            model.register_forward_hook(after)
    return passes


def _cuda_sync(runner):
    device = getattr(runner, "device", None)
    if getattr(device, "type", None) == "cuda":
        import torch

        return lambda: torch.cuda.synchronize(device)
    return lambda: None


_time_draft_proposals()


def external_id(internal: str) -> str:
    """vLLM appends "-<8 random chars>" to the caller's request id inside the engine."""
    return internal.rsplit("-", 1)[0]


class RecordingScheduler(Scheduler):
    """vLLM's scheduler, unchanged in its decisions, plus a per-step JSONL log (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        extra = self.vllm_config.additional_config or {}
        path = extra.get(STEP_LOG_KEY)
        self._log = open(path, "a", buffering=1, encoding="utf-8") if path else None  # noqa: SIM115 — lives with the engine
        self._t0 = self._t1 = 0.0

    def schedule(self, *args, **kwargs):
        self._t0 = time.perf_counter()
        return super().schedule(*args, **kwargs)

    def update_from_output(self, scheduler_output, model_runner_output):
        self._t1 = time.perf_counter()
        if self._log is not None:
            self._log.write(json.dumps(self._step_record(scheduler_output, model_runner_output)) + "\n")
        return super().update_from_output(scheduler_output, model_runner_output)

    def _step_record(self, scheduler_output, model_runner_output) -> dict[str, Any]:
        """One line of the step log (module docstring); read before vLLM applies the step."""
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        spec = scheduler_output.scheduled_spec_decode_tokens
        ids, n, k, c, first = [], [], [], [], []
        for rid, tokens in scheduler_output.num_scheduled_tokens.items():
            i = index.get(rid)
            committed = len(sampled[i]) if sampled and i is not None else 0
            req = self.requests.get(rid)
            ids.append(external_id(rid))
            n.append(int(tokens))
            k.append(len(spec.get(rid, ())))
            c.append(committed)
            first.append(bool(committed and req is not None and req.num_output_tokens == 0))
        return {"t0": self._t0, "t1": self._t1, "ids": ids, "n": n, "k": k, "c": c, "first": first,
                "pre": len(scheduler_output.preempted_req_ids or ())}

    def shutdown(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        super().shutdown()


class OnlineKScheduler(RecordingScheduler):
    """vLLM's scheduler with an autospec length policy (GP-LCB, SmartSpec) choosing the draft lengths.

    Configured by `additional_config["autospec_online"]` (`autospec.serving.vllm.online.online_settings`:
    the length policy and its params, k_max, temperature, the fitted latency model's path), with
    `speculative_config.num_speculative_tokens = k_max` and a per-batch-size schedule (so vLLM keeps a
    `dynamic_sd_lookup` and treats K as varying). Every step:

    * schedule(n): vLLM schedules the batch; the requests that will sample a token (all but partial
      prefill chunks) become RequestViews (prompt, generated and max tokens; the RoundRecords this
      scheduler collected) and the policy decides each one's length k_i for the drafts vLLM proposes
      during step n and verifies in step n + 1. [chosen] The batch K — vLLM drafts one K for the whole
      batch — is max_i k_i: no request gets fewer drafts than its policy asked for, and the extra drafts
      of the others are trimmed below. It is written into `dynamic_sd_lookup[batch]` and into this
      step's `num_spec_tokens_to_schedule` (vLLM reads the lookup inside schedule(), before the batch
      the policy needs to see exists).
    * update_from_output(n): the requests that verified drafts of an earlier decision give a
      StepOutcome per decision — drafted = verified = drafts scheduled (vLLM verifies all it
      schedules), accepted = sampled − 1, verify_time_s = this step's wall time t1 − t0 (as the step
      log measures it), draft_time_s = 0: a vLLM step also runs the draft proposals for the next step,
      so the draft cost is inside verify_time_s (and it is step n's K, not the decision's own) — and
      the policy observes it. The one-step lag (the decision for n + 1 is taken before step n's
      outcome is observed) is handled by `OnlineLength` (autospec/serving/vllm/online.py): each
      observe sees its own decision's in-flight state.
    * update_draft_token_ids(n): each request's drafts are cut to its own k_i (GP-LCB's per-request
      refinement, Eq. 2), so step n + 1 schedules and verifies k_i drafts for it.

    The step log gets two fields: "K" (the batch K drafted during this step) and "tk" (per scheduled
    request, its k_i for those drafts; −1 for a request that does not draft this step).

    Sync scheduling only: with async scheduling vLLM trims drafts in the worker
    (update_draft_token_ids_in_output) and the trim here would never run, so that is refused.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        settings = (self.vllm_config.additional_config or {}).get(ONLINE_KEY)
        name = type(self).__name__
        if not settings:
            raise ValueError(f"{name} needs additional_config[{ONLINE_KEY!r}] (autospec.serving.vllm.online."
                             "online_settings)")
        if self.scheduler_config.async_scheduling:
            raise ValueError(f"{name} needs synchronous scheduling: start vLLM with --no-async-scheduling")
        if not self.num_spec_tokens or self.dynamic_sd_lookup is None:
            raise ValueError(f"{name} needs speculative decoding with num_speculative_tokens_per_batch_size "
                             "(vLLM drops it under data parallelism, where ranks must agree on K)")
        self.online = OnlineLength.from_settings(settings)
        if self.online.k_max > self.num_spec_tokens:
            raise ValueError(f"{name}: k_max {self.online.k_max} exceeds num_speculative_tokens "
                             f"{self.num_spec_tokens}")
        self._views: dict[str, tuple[int, list[RoundRecord]]] = {}  # request -> (policy req_id, rounds)
        self._ids = itertools.count()
        self._holding: dict[str, int] = {}  # request -> decision whose drafts it holds (not yet verified)
        self._verifying: dict[str, int] = {}  # this step: request -> decision whose drafts it verifies
        self._targets: dict[str, int] = {}  # this step's decision: request -> k_i
        self._batch_k = 0

    def _view(self, rid: str) -> RequestView:
        req = self.requests[rid]
        if rid not in self._views:
            self._views[rid] = (next(self._ids), [])
        num, rounds = self._views[rid]
        return RequestView(req_id=num, prompt_len=int(req.num_prompt_tokens),
                           generated_len=int(req.num_output_tokens), max_tokens=int(req.max_tokens or 0),
                           arrival_s=float(req.arrival_time), rounds=rounds)

    def schedule(self, *args, **kwargs):
        out = super().schedule(*args, **kwargs)
        for rid in out.preempted_req_ids or ():
            self._holding.pop(rid, None)  # vLLM dropped its drafts; it comes back through prefill
        scheduled = out.num_scheduled_tokens
        self._verifying = {rid: self._holding.pop(rid) for rid in scheduled if rid in self._holding}
        drafting = [rid for rid in scheduled if not self.requests[rid].is_prefill_chunk]
        self._targets, k = {}, 0
        if drafting:
            decision, lengths = self.online.decide([self._view(rid) for rid in drafting])
            self._targets = dict(zip(drafting, lengths))
            self._holding.update(dict.fromkeys(drafting, decision))
            k = max(lengths)
        if scheduled:
            self.dynamic_sd_lookup[min(len(scheduled), len(self.dynamic_sd_lookup) - 1)] = k
            out.num_spec_tokens_to_schedule = k
        self._batch_k = k
        return out

    def _step_record(self, scheduler_output, model_runner_output) -> dict[str, Any]:
        record = super()._step_record(scheduler_output, model_runner_output)
        record["K"] = self._batch_k
        record["tk"] = [self._targets.get(rid, -1) for rid in scheduler_output.num_scheduled_tokens]
        return record

    def update_from_output(self, scheduler_output, model_runner_output):
        sampled = model_runner_output.sampled_token_ids
        index = model_runner_output.req_id_to_index
        spec = scheduler_output.scheduled_spec_decode_tokens
        rows: dict[int, list[tuple[str, int, int, list[int]]]] = {}
        for rid, decision in self._verifying.items():
            i = index.get(rid)
            tokens = [int(t) for t in sampled[i]] if sampled and i is not None else []
            if not tokens:
                continue  # nothing sampled for it this step (aborted)
            drafted = len(spec.get(rid, ()))
            rows.setdefault(decision, []).append((rid, drafted, max(len(tokens) - 1, 0) if drafted else 0, tokens))
        self._verifying = {}
        outputs = super().update_from_output(scheduler_output, model_runner_output)
        step_s = self._t1 - self._t0
        for decision in sorted(rows):
            group = rows[decision]
            finished = [rid not in self.requests or self.requests[rid].is_finished() for rid, *_ in group]
            for rid, drafted, accepted, _ in group:
                self._views[rid][1].append(RoundRecord(drafted, drafted, accepted))
            n = len(group)
            self.online.observe(decision, StepOutcome(
                req_ids=[self._views[rid][0] for rid, *_ in group], drafted=[g[1] for g in group],
                verified=[g[1] for g in group], accepted=[g[2] for g in group], committed=[g[3] for g in group],
                finished=finished, target_probs=[[] for _ in range(n)], klds=[[] for _ in range(n)],
                draft_time_s=0.0, verify_time_s=step_s))
        for rid in [r for r in self._views if r not in self.requests or self.requests[r].is_finished()]:
            del self._views[rid]
            self._holding.pop(rid, None)
        self.online.retain(set(self._holding.values()))
        return outputs

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        targets = self._targets
        trimmed = [list(tokens)[:targets.get(rid, 0)]
                   for rid, tokens in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids)]
        super().update_draft_token_ids(DraftTokenIds(list(draft_token_ids.req_ids), trimmed))


FIXED_K_FILE_KEY = "autospec_fixed_k_file"


class FixedKProposer:
    """`custom_class` proposer for profiling the target: proposes exactly k tokens for every request that
    sampled a token, with k read from the file named by `additional_config["autospec_fixed_k_file"]`
    (so one engine with num_speculative_tokens = K_max times every verify width). The proposals are
    token 0 and cost nothing to make: a step's time is the target's verify of k + 1 tokens per request
    plus vLLM's own per-step work."""

    def __init__(self, vllm_config):
        self.path = (vllm_config.additional_config or {}).get(FIXED_K_FILE_KEY)
        self.k_max = int(vllm_config.speculative_config.num_speculative_tokens)

    def load_model(self, *args, **kwargs) -> None:
        """Nothing to load: the proposals are constants."""

    def propose(self, sampled_token_ids, num_tokens_no_spec=None, token_ids_cpu=None, slot_mappings=None):
        k = 0
        if self.path:
            with open(self.path, encoding="utf-8") as fh:
                k = min(int(fh.read().strip() or 0), self.k_max)
        return [[0] * k if len(sampled) else [] for sampled in sampled_token_ids]


class FixedKDraftScheduler(RecordingScheduler):
    """Profiling only: vLLM's scheduler with the batch K of every step read from the fixed-K file
    (`additional_config["autospec_fixed_k_file"]`, as `FixedKProposer`), so one draft_model engine
    times its draft proposals at every K (`latency_profile`'s draft rows). Needs
    `num_speculative_tokens_per_batch_size` (vLLM then takes each step's K from `dynamic_sd_lookup`,
    which this sets to k before vLLM reads it) and synchronous scheduling, like `OnlineKScheduler`."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._k_path = (self.vllm_config.additional_config or {}).get(FIXED_K_FILE_KEY)
        if not self._k_path or self.dynamic_sd_lookup is None or self.scheduler_config.async_scheduling:
            raise ValueError(f"{type(self).__name__} needs additional_config[{FIXED_K_FILE_KEY!r}], "
                             "num_speculative_tokens_per_batch_size and --no-async-scheduling")

    def schedule(self, *args, **kwargs):
        with open(self._k_path, encoding="utf-8") as fh:
            k = min(int(fh.read().strip() or 0), self.num_spec_tokens)
        lookup = self.dynamic_sd_lookup
        lookup[:] = [k] * len(lookup)
        out = super().schedule(*args, **kwargs)
        out.num_spec_tokens_to_schedule = k
        return out
