"""`autospec generate`: run one strategy over a prompt set on the torch engine, FCFS static batching.

Prompts are taken in file order, `batch_size` at a time; a batch runs SD steps until all of its
requests finish, then the next batch starts. (Continuous batching, arrivals and schedule policies are
the serving loop's job; here the strategy's schedule part is not used.) Strategies whose policies
consult a latency model get one fitted on the spot from a short measurement of this engine, unless
one is passed in.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from autospec.config import EngineSpec, PairSpec
from autospec.contract import LatencyModel
from autospec.engines.base import GenRequest
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError
from autospec.latency import LinearLatencyModel, fit_linear, linear_features
from autospec.serving.state import RequestState
from autospec.serving.step import StepSettings, sd_step
from autospec.strategy import Strategy, StrategySpec, load_preset, spec_from_dict
from autospec.workloads.prompts import Prompt

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODEL_FREE = ({"static", "none"}, {"all"})  # length / verify policies that need no latency model


def build_engine(pair: PairSpec, engine: EngineSpec, temperature: float) -> TorchSDEngine:
    if engine.threads:
        torch.set_num_threads(engine.threads)
    return TorchSDEngine(pair.target, pair.draft, device=engine.device, dtype=DTYPES[engine.dtype],
                         temperature=temperature, k_max=engine.k_max, seed=engine.seed)


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot load a tokenizer: {str(exc).splitlines()[0]}", path=model_dir) from None


def strategy_spec(name: str | None, k: int | None) -> StrategySpec:
    """`--k N` is shorthand for static K (K=0 = no SD); otherwise a preset name or file."""
    if k is not None:
        if k < 0:
            raise InputError(f"K must be >= 0, got {k}", field="k")
        if k == 0:
            return load_preset("no-sd")
        return spec_from_dict({"strategy": {"name": f"static-k{k}"}, "length": {"policy": "static", "k": k}})
    return load_preset(name or "static-k4")


def needs_latency_model(spec: StrategySpec) -> bool:
    return spec.length.policy not in MODEL_FREE[0] or spec.verify.policy not in MODEL_FREE[1]


def quick_latency_model(engine: TorchSDEngine, repeats: int = 3) -> LinearLatencyModel:
    """AdaSpec's linear time model fitted to a small grid measured on this engine (a few seconds).

    `autospec profile` + `autospec fit` do this properly (bigger grid, held-out error); this is what
    `generate` uses so model-based strategies can run without a profile.
    """
    target_rows, draft_rows = [], []
    for batch in (1, 4):
        for context in (64, 256):
            for tokens in (1, 5):
                t = float(np.median(engine.time_forward("target", batch, tokens, context, repeats)))
                # the context summed over the pass's positions, as Eq. 4 uses it (latency.linear_features)
                target_rows.append([*map(float, linear_features(batch, tokens, context)), t])
            t = float(np.median(engine.time_forward("draft", batch, 1, context, repeats)))
            draft_rows.append([batch * context, batch, t])
    # The draft grid has only two N_b values per context; add a wider batch so the fit is determined.
    t = float(np.median(engine.time_forward("draft", 8, 1, 64, repeats)))
    draft_rows.append([8 * 64, 8, t])
    return LinearLatencyModel(draft=fit_linear(draft_rows), target=fit_linear(target_rows))


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


def encode_prompts(tokenizer, prompts: Sequence[Prompt]) -> list[list[int]]:
    ids = [prompt_token_ids(tokenizer, p) for p in prompts]
    for p, i in zip(prompts, ids):
        if not i:
            raise InputError("prompt encodes to no tokens", path=p.source_id)
    return ids


def prompt_token_ids(tokenizer, prompt: Prompt) -> list[int]:
    """The prompt's own `token_ids` when it has them (the `random` dataset), checked against the
    tokenizer's vocabulary; otherwise its text, tokenized."""
    if prompt.token_ids is None:
        return tokenizer.encode(prompt.text, add_special_tokens=False)
    size = len(tokenizer)
    bad = next((t for t in prompt.token_ids if not 0 <= t < size), None)
    if bad is not None:
        raise InputError(f"token id {bad} is outside the tokenizer's vocabulary of {size}", path=prompt.source_id)
    return list(prompt.token_ids)


def random_vocab(tokenizer) -> dict:
    """What `load_dataset("random", ...)` draws from: the tokenizer's base vocabulary (vLLM's choice; ids
    added on top of it may have no trained embedding) less its special tokens."""
    return {"vocab_size": int(tokenizer.vocab_size), "exclude_ids": tuple(tokenizer.all_special_ids)}

