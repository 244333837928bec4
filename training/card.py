"""Measured properties of a draft/target pair, as written into the bundled pair's model card.

- acceptance per domain: greedy SD at K=4 over the default prompt sets (autospec.workloads.default_prompts;
  the card shipped with the pair was measured on HumanEval = code, MT-Bench = chat, GSM8K = math);
  `acceptance_rate` is accepted / drafted (per-token acceptance at K=4), and `agreement` is the
  per-position probability that the draft's argmax equals the target's on the target's own greedy
  continuation (the α of Leviathan et al.);
- decode cost: one-token forward at batch 1 (context 256) for each model on this machine, and the ratio.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from autospec.artifacts import hardware_info
from autospec.engines.torch_engine import TorchSDEngine
from autospec.generate import run_generate
from autospec.serving.factory import load_tokenizer, strategy_spec
from autospec.strategy import build_strategy
from autospec.workloads.default_prompts import bundled_prompt_sets

DOMAIN_FILES = {"code": "stdlib (held-out files)", "chat": "autospec chat set", "math": "autospec math set"}


def _agreement(engine: TorchSDEngine, prompt: list[int], continuation: list[int]) -> float:
    """Fraction of positions where draft argmax == target argmax, teacher-forced on `continuation`."""
    seq = torch.tensor([prompt + continuation])
    n = len(continuation)
    argmaxes = []
    for model in (engine.target, engine.draft_model):
        cache = model.new_cache()
        cache.ensure(1, seq.shape[1] + 1)
        with torch.inference_mode():
            logits = model.forward(seq, cache, torch.tensor([0]), torch.tensor([0]), torch.tensor([seq.shape[1]]))
        argmaxes.append(logits[0, len(prompt) - 1: len(prompt) - 1 + n].argmax(-1))
    return float((argmaxes[0] == argmaxes[1]).float().mean())


def measure_acceptance(engine: TorchSDEngine, tokenizer, prompts_per_domain: int = 16, max_tokens: int = 64,
                       k: int = 4) -> dict:
    out = {}
    for domain, prompts in bundled_prompt_sets(limit=prompts_per_domain).items():
        ids = [tokenizer.encode(p.text) for p in prompts]
        res = run_generate(engine, ids, build_strategy(strategy_spec(None, k)), max_tokens=max_tokens,
                           batch_size=8)
        agreement = [_agreement(engine, p, o) for p, o in zip(ids, res.token_ids) if o]
        summary = res.summary()
        out[domain] = {
            "prompt_set": DOMAIN_FILES.get(domain, domain),
            "prompts": len(ids),
            "k": k,
            "acceptance_rate": round(summary["acceptance_rate"], 4),
            "mean_accepted_per_step": round(summary["mean_accepted_per_step"], 4),
            "agreement": round(float(np.mean(agreement)), 4),
        }
    return out


def measure_step_cost(engine: TorchSDEngine, context: int = 256, repeats: int = 60) -> dict:
    target = float(np.median(engine.time_forward("target", 1, 1, context, repeats, warmup=10)))
    draft = float(np.median(engine.time_forward("draft", 1, 1, context, repeats, warmup=10)))
    return {"batch": 1, "context": context, "target_decode_step_ms": round(target * 1e3, 4),
            "draft_decode_step_ms": round(draft * 1e3, 4), "target_over_draft": round(target / draft, 3)}


def measure_properties(target_dir: Path, draft_dir: Path) -> dict:
    engine = TorchSDEngine(target_dir, draft_dir)
    tokenizer = load_tokenizer(target_dir)
    sizes = {name: sum(f.stat().st_size for f in Path(d).glob("*.safetensors"))
             for name, d in (("target", target_dir), ("draft", draft_dir))}
    return {
        "parameters": {"target": engine.target.parameter_count(), "draft": engine.draft_model.parameter_count()},
        "weight_bytes": {**sizes, "total": sum(sizes.values())},
        "acceptance_k4_greedy": measure_acceptance(engine, tokenizer),
        "decode_step_cost": measure_step_cost(engine),
        "measured_on": hardware_info(),
    }
