"""`autospec generate`: run one strategy over a prompt set on the torch engine, FCFS static batching.

Prompts are taken in file order, `batch_size` at a time; a batch runs SD steps until all of its
requests finish, then the next batch starts. (Continuous batching, arrivals and schedule policies are
the serving loop's job; here the strategy's schedule part is not used.) Strategies whose policies
consult a latency model get one fitted on the spot from a short measurement of this engine, unless
one is passed in (the engine, tokenizer and that model come from `autospec.serving.factory`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from autospec.contract import LatencyModel
from autospec.engines.base import GenRequest
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError
from autospec.serving.state import RequestState
from autospec.serving.step import StepSettings, sd_step
from autospec.strategy import Strategy


@dataclass
class GenerateResult:
    strategy: str
    texts: list[str]
    token_ids: list[list[int]]
    wall_s: float
    prefill_s: float
    draft_s: float
    verify_s: float
    steps: int
    drafted: int
    verified: int
    accepted: int
    request_steps: int
    per_request: list[dict] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return sum(len(t) for t in self.token_ids)

    def summary(self) -> dict:
        return {
            "strategy": self.strategy,
            "requests": len(self.texts),
            "generated_tokens": self.generated_tokens,
            "acceptance_rate": self.accepted / self.verified if self.verified else 0.0,
            "mean_accepted_per_step": self.accepted / self.request_steps if self.request_steps else 0.0,
            "mean_drafted_per_step": self.drafted / self.request_steps if self.request_steps else 0.0,
            "tokens_per_s": self.generated_tokens / self.wall_s if self.wall_s else 0.0,
            "wall_s": self.wall_s,
            "prefill_s": self.prefill_s,
            "draft_s": self.draft_s,
            "verify_s": self.verify_s,
            "steps": self.steps,
        }


def run_generate(
    engine: TorchSDEngine,
    prompt_ids: Sequence[Sequence[int]],
    strategy: Strategy,
    *,
    max_tokens: int,
    batch_size: int,
    ignore_eos: bool = False,
    latency_model: LatencyModel | None = None,
    decode: Callable[[list[int]], str] | None = None,
    on_batch_done: Callable[[int], None] | None = None,
) -> GenerateResult:
    if not prompt_ids:
        raise InputError("no prompts to generate from", field="prompts")
    if batch_size < 1:
        raise InputError(f"batch size must be >= 1, got {batch_size}", field="batch_size")
    # every prompt before the first batch runs
    engine.check_all_fit(((f"prompt {i + 1}", len(ids), max_tokens) for i, ids in enumerate(prompt_ids)), "prompts")
    engine.set_draft_sampling(strategy.execution.draft_sampling)
    settings = StepSettings(k_max=engine.k_max, temperature=engine.temperature, latency_model=latency_model)
    outputs: list[list[int]] = [[] for _ in prompt_ids]
    steps = drafted = verified = accepted = request_steps = 0
    draft_s = verify_s = prefill_s = 0.0
    per_request: list[dict] = [{} for _ in prompt_ids]
    start = time.perf_counter()
    for first in range(0, len(prompt_ids), batch_size):
        chunk = list(range(first, min(first + batch_size, len(prompt_ids))))
        res = engine.add([GenRequest(prompt_ids[i], max_tokens, ignore_eos) for i in chunk])
        prefill_s += res.time_s
        index_of = dict(zip(res.req_ids, chunk))
        states = {rid: RequestState(rid, len(prompt_ids[i]), max_tokens, generated=1, finished=fin)
                  for rid, i, fin in zip(res.req_ids, chunk, res.finished)}
        while True:
            live = [s for s in states.values() if not s.finished]
            if not live:
                break
            outcome, _ = sd_step(engine, strategy, live, time.perf_counter() - start, settings)
            steps += 1
            request_steps += outcome.batch_size
            drafted += sum(outcome.drafted)
            verified += sum(outcome.verified)
            accepted += sum(outcome.accepted)
            draft_s += outcome.draft_time_s
            verify_s += outcome.verify_time_s
        for rid, i in index_of.items():
            outputs[i] = engine.output(rid)
            s = states[rid]
            per_request[i] = {"rounds": len(s.rounds), "accepted": sum(r.accepted for r in s.rounds),
                              "verified": sum(r.verified for r in s.rounds)}
        engine.remove(list(index_of))
        if on_batch_done is not None:
            on_batch_done(len(chunk))
    wall = time.perf_counter() - start
    texts = [decode(o) if decode else "" for o in outputs]
    return GenerateResult(strategy.name, texts, outputs, wall, prefill_s, draft_s, verify_s, steps, drafted,
                          verified, accepted, request_steps, per_request)
