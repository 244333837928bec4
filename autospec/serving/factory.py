"""Build the torch SD engine and its inputs: the engine from a pair and engine settings, the tokenizer,
prompt token ids, and a quick latency model for strategies that consult one.

Used by every stage that runs the torch engine (`generate`, `profile`, `evaluate`, the model card) — the
one place that turns `PairSpec` / `EngineSpec` into a `TorchSDEngine`.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from autospec.config import EngineSpec, PairSpec
from autospec.engines.llama import config_max_positions
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError
from autospec.latency import LinearLatencyModel, fit_linear, linear_features
from autospec.strategy import StrategySpec, load_preset, spec_from_dict
from autospec.workloads.prompts import Prompt
from autospec.workloads.trace import Trace, TraceRequest

__all__ = ["build_engine", "check_workload_fits", "context_window", "encode_prompts", "load_tokenizer",
           "needs_latency_model", "prompt_token_ids", "quick_latency_model", "random_vocab", "sent_prompt_ids",
           "strategy_spec"]

DTYPES = {"float32": torch.float32, "float64": torch.float64, "bfloat16": torch.bfloat16, "float16": torch.float16}
MODEL_FREE = ({"static", "none"}, {"all"})  # length / verify policies that need no latency model


def build_engine(pair: PairSpec, engine: EngineSpec, temperature: float) -> TorchSDEngine:
    if engine.threads:
        torch.set_num_threads(engine.threads)
    return TorchSDEngine(pair.target, pair.draft, device=engine.device, dtype=DTYPES[engine.dtype],
                         temperature=temperature, k_max=engine.k_max, seed=engine.seed)


def load_tokenizer(model_dir: Path):
    from transformers import AutoTokenizer  # lazily: +0.9 s, for the paths that tokenize text only

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


def encode_prompts(tokenizer, prompts: Sequence[Prompt]) -> list[list[int]]:
    ids = [prompt_token_ids(tokenizer, p) for p in prompts]
    for p, i in zip(prompts, ids):
        if not i:
            raise InputError("prompt encodes to no tokens", path=p.source_id)
    return ids


def sent_prompt_ids(rows: Sequence[TraceRequest], tokenizer) -> list[list[int]]:
    """The token ids a real replay sends for trace rows with prompt text: the text's ids clipped or
    cyclically padded to the row's prompt_len (`autospec evaluate` on torch; `autospec profile
    --workload` traces exactly these)."""
    cache: dict[str, list[int]] = {}
    out = []
    for r in rows:
        ids = cache.get(r.prompt or "")
        if ids is None:
            ids = cache[r.prompt or ""] = tokenizer.encode(r.prompt or "", add_special_tokens=False)
        if not ids:
            raise InputError("prompt encodes to no tokens", path=r.source_id)
        out.append(list(itertools.islice(itertools.cycle(ids), r.prompt_len)))
    return out


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


def context_window(pair: PairSpec) -> int | None:
    """The most positions a request may occupy on `pair`: the smaller of its models' trained context
    (config.json's max_position_embeddings, as the torch engine's `max_context` and vLLM's max_model_len
    read it); None when no config names one. A config that cannot be read counts as naming none: loading
    the model reports it."""
    limits = []
    for model in (pair.target, pair.draft):
        try:
            cfg = json.loads((Path(model) / "config.json").read_text(encoding="utf-8")) if model else None
        except (OSError, ValueError, RecursionError):
            cfg = None
        if isinstance(cfg, dict) and (limit := config_max_positions(cfg)):
            limits.append(limit)
    return min(limits) if limits else None


def check_workload_fits(trace: Trace, pair: PairSpec, k_max: int, *, path: Path) -> None:
    """Refuse a workload (`path`, its trace `trace`) with a request the pair cannot hold: its prompt, every
    token it may generate and the K_max drafts a last round verifies past them (the engine's `check_fits`
    rule). Checked before any engine starts: a raw production trace (prompts of thousands of tokens)
    used to stop `autospec run` only once the profile reached its prompts, and a confirmation only
    after the whole search. One line: the first such request, how many there are, and the clip that fits."""
    limit = context_window(pair)
    if limit is None or not len(trace):
        return
    prompt, output = trace.column("prompt_len"), trace.column("output_len")
    need = prompt + output + k_max
    over = (need > limit).nonzero()[0]
    if not len(over):
        return
    first = int(over[0])
    others = f"; so do {len(over) - 1} more of its {len(trace)} requests" if len(over) > 1 else ""
    raise InputError(f"request {first} needs {int(need[first])} positions ({int(prompt[first])} prompt + "
                     f"{int(output[first])} output tokens + K_max {k_max} drafts), more than the models' context "
                     f"window of {limit}{others}; clip the workload so that max_prompt_tokens + max_output_tokens "
                     f"<= {limit - k_max}", path=path, field="workload")
