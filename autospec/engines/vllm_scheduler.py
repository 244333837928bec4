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
the target's verify forward, sampling, and the draft proposals for the next step.

This module imports vLLM at import time: only vLLM's engine core imports it (by dotted path).
"""

from __future__ import annotations

import json
import time

from vllm.v1.core.sched.scheduler import Scheduler

STEP_LOG_KEY = "autospec_step_log"


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
        self._t0 = 0.0

    def schedule(self, *args, **kwargs):
        self._t0 = time.perf_counter()
        return super().schedule(*args, **kwargs)

    def update_from_output(self, scheduler_output, model_runner_output):
        if self._log is not None:
            t1 = time.perf_counter()
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
            self._log.write(json.dumps({"t0": self._t0, "t1": t1, "ids": ids, "n": n, "k": k, "c": c,
                                        "first": first,
                                        "pre": len(scheduler_output.preempted_req_ids or ())}) + "\n")
        return super().update_from_output(scheduler_output, model_runner_output)

    def shutdown(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None
        super().shutdown()


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
