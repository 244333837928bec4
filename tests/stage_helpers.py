"""Synthetic profiles with known ground truth and synthetic workload files, shared by the tests that run
the stages (profile → fit → sim → tune / evaluate / report / gate)."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path

import numpy as np
import pandas as pd

from autospec.artifacts import write_json, write_parquet
from autospec.profile import ACCEPTANCE_COLUMNS, LATENCY_COLUMNS

# Known AdaSpec coefficients (alpha s/context token, gamma s/batch token, delta s/pass) and prefill lines.
TRUE = {"draft": (2e-7, 3e-5, 1.5e-3), "target": (1.1e-6, 2.4e-4, 9e-3)}
PREFILL = {"draft": (4e-6, 1e-3), "target": (3e-5, 8e-3)}
K_MAX = 4


def synthetic_latency(noise: float = 0.0, seed: int = 0, lam: dict[str, float] | None = None,
                      plain: tuple[float, float, float] | None = None,
                      draft_round: tuple[float, float, float] | None = None,
                      multi: dict[str, float] | None = None,
                      alpha_decode: dict[str, float] | None = None,
                      alpha_ragged: dict[str, float] | None = None,
                      step_passes: dict[int, float] | None = None,
                      prefill_square: dict[str, float] | None = None) -> pd.DataFrame:
    """Decode and prefill rows from TRUE/PREFILL; `lam` adds λ·log2(batch·tokens) per model, `multi` μ
    to every pass over two or more tokens, and `alpha_decode` replaces α in passes of one token per
    row (the simulator's clock terms); `alpha_ragged` adds `decode_ragged` rows (one token per row,
    rows of unequal length, batch >= 2) that attend at it; `plain` = (α, γ, δ) adds a plain engine's
    target rows (`decode_plain`); `draft_round` = (α, γ, δ) adds a vLLM profile's draft `round` rows
    and the `step` rows (K passes + the round, K = 1, 2, 4) they are split from — `step_passes[K]` passes
    worth instead of K (a draft step not linear in K). `prefill_square` adds c·tokens² per model to the
    prefill rows (attention over the prompt), which then reach 1024 tokens."""
    rng = np.random.default_rng(seed)
    rows = []
    for model, (a, g, d) in TRUE.items():
        for batch in (1, 2, 4, 8):
            for context in (32, 128, 512):
                for tokens in (range(1, K_MAX + 2) if model == "target" else (1,)):
                    alpha = (alpha_decode or {}).get(model, a) if tokens == 1 else a
                    t = (alpha * batch * context + g * batch * tokens + d
                         + (lam or {}).get(model, 0.0) * np.log2(batch * tokens)
                         + (multi or {}).get(model, 0.0) * (batch * tokens >= 2))
                    t *= 1 + noise * rng.standard_normal()
                    rows.append({"model": model, "phase": "decode", "batch": batch, "tokens": tokens,
                                 "context": context, "sm_split": np.nan, "median_s": t, "mad_s": 0.0, "repeats": 5})
                if model in (alpha_ragged or {}) and batch >= 2:
                    t = (alpha_ragged[model] * batch * context + g * batch + d  # type: ignore[index]
                         + (lam or {}).get(model, 0.0) * np.log2(batch) + (multi or {}).get(model, 0.0))
                    rows.append({"model": model, "phase": "decode_ragged", "batch": batch, "tokens": 1,
                                 "context": context, "sm_split": np.nan, "median_s": t, "mad_s": 0.0, "repeats": 5})
        if model == "draft" and draft_round is not None:  # a vLLM profile's draft rounds and steps
            ra, rg, rd = draft_round
            for batch in (1, 2, 4, 8):
                for context in (32, 128, 512):
                    round_s = ra * batch * context + rg * batch + rd
                    rows.append({"model": "draft", "phase": "round", "batch": batch, "tokens": 1, "context": context,
                                 "sm_split": np.nan, "median_s": round_s, "mad_s": 0.0, "repeats": 5})
                    for k in (1, 2, 4):
                        rows.append({"model": "draft", "phase": "step", "batch": batch, "tokens": k,
                                     "context": context, "sm_split": np.nan,
                                     "median_s": round_s + (step_passes or {}).get(k, k)
                                     * (a * batch * context + g * batch + d),
                                     "mad_s": 0.0, "repeats": 5})
        if model == "target" and plain is not None:  # a plain (no-SD) engine's target step
            pa, pg, pd_ = plain
            for batch in (1, 2, 4, 8):
                for context in (32, 128, 512):
                    rows.append({"model": "target", "phase": "decode_plain", "batch": batch, "tokens": 1,
                                 "context": context, "sm_split": np.nan,
                                 "median_s": pa * batch * context + pg * batch + pd_, "mad_s": 0.0, "repeats": 5})
        per, fixed = PREFILL[model]
        square = (prefill_square or {}).get(model, 0.0)
        for tokens in (32, 128, 256) + ((512, 1024) if prefill_square else ()):
            rows.append({"model": model, "phase": "prefill", "batch": 1, "tokens": tokens, "context": 0,
                         "sm_split": np.nan, "median_s": per * tokens + square * tokens ** 2 + fixed, "mad_s": 0.0,
                         "repeats": 5})
    return pd.DataFrame(rows, columns=LATENCY_COLUMNS)


def synthetic_acceptance(n_prompts: int = 6, positions: int = 40, temperature: float = 2.5,
                         seed: int = 0) -> pd.DataFrame:
    """Traces whose draft is overconfident: P(accept token j) = σ(logit(c_j) / temperature)."""
    rng = np.random.default_rng(seed)
    frames = []
    for i in range(n_prompts):
        conf = rng.uniform(0.05, 0.999, (positions, K_MAX))
        z = np.log(conf) - np.log1p(-conf)
        accept = rng.random((positions, K_MAX)) < 1 / (1 + np.exp(-z / temperature))
        match = np.cumprod(accept, axis=1).sum(axis=1)
        frames.append(pd.DataFrame({
            "prompt_id": f"p{i}", "domain": ("code", "chat")[i % 2], "position": np.arange(positions),
            "target_token": rng.integers(0, 100, positions), "match_len": match,
            "chain_tokens": list(rng.integers(100, 200, (positions, K_MAX))),
            "confidences": list(conf), "entropies": list(rng.uniform(0, 3, (positions, K_MAX))),
            "klds": list(rng.uniform(0, 2, (positions, K_MAX))),
            "target_probs": list(rng.uniform(0, 1, (positions, K_MAX))),
            "accept_probs": list(rng.uniform(0, 1, (positions, K_MAX)))}))
    return pd.concat(frames, ignore_index=True)[ACCEPTANCE_COLUMNS]


def write_synthetic_run(root: Path, acceptance: pd.DataFrame | None = None, noise: float = 0.0,
                        lam: dict[str, float] | None = None, plain: tuple[float, float, float] | None = None,
                        engine: str = "torch", draft_round: tuple[float, float, float] | None = None,
                        multi: dict[str, float] | None = None, alpha_decode: dict[str, float] | None = None,
                        alpha_ragged: dict[str, float] | None = None,
                        step_passes: dict[int, float] | None = None,
                        prefill_square: dict[str, float] | None = None) -> Path:
    """A run directory with a synthetic profile; `engine` is the engine profile.json says it measured."""
    prof = root / "profile"
    write_parquet(prof / "latency.parquet", synthetic_latency(noise, lam=lam, plain=plain, draft_round=draft_round,
                                                              multi=multi, alpha_decode=alpha_decode,
                                                              alpha_ragged=alpha_ragged, step_passes=step_passes,
                                                              prefill_square=prefill_square))
    write_parquet(prof / "acceptance.parquet", synthetic_acceptance() if acceptance is None else acceptance)
    write_json(prof / "profile.json", {"settings": {"k_max": K_MAX}, "engine": engine})
    return root


def synthetic_workload(name: str, *, rate: float, duration_s: float, max_requests: int, prompt_tokens: int,
                       output_tokens: int, seed: int = 0, domains: bool = True, bundled_prompts: bool = False) -> str:
    """A `[workload]` TOML for a Poisson synthetic workload: mean prompt/output lengths as given, each
    clipped at twice its mean; requests spread over code and chat (`domains`); `bundled_prompts` False
    gives synthetic prompt ids instead of the bundled prompt sets."""
    lines = ["[workload]", f"name = {json.dumps(name)}", 'format = "synthetic"', 'generator = "poisson"',
             f"rate = {float(rate)}", f"duration_s = {float(duration_s)}", f"max_requests = {max_requests}",
             f"mean_prompt_tokens = {prompt_tokens}", f"mean_output_tokens = {output_tokens}",
             f"max_prompt_tokens = {2 * prompt_tokens}", f"max_output_tokens = {2 * output_tokens}"]
    if domains:
        lines.append("domains = { code = 1, chat = 1 }")
    if not bundled_prompts:
        lines.append("prompts = []")
    lines.append(f"seed = {seed}")
    return "\n".join(lines) + "\n"


def slowed_records(records, factor: float, since_step: int):
    """`records` with every step from `since_step` on taking `factor` times as long (a host that slowed
    down mid-run): each later step's start and end move by the time the earlier slowed steps added."""
    steps = copy.deepcopy(records.steps)
    shift = 0.0
    for i in range(len(steps.start_s)):
        duration = steps.end_s[i] - steps.start_s[i]
        steps.start_s[i] += shift
        if i >= since_step:
            shift += duration * (factor - 1.0)
        steps.end_s[i] = steps.start_s[i] + duration * (factor if i >= since_step else 1.0)
    return dataclasses.replace(records, steps=steps)


class SlowedOnce:
    """The simulator replay of a window, except that the first run with engine seed `seed` comes back as
    if the host had run twice as slow over its last third of steps (slowed_records)."""

    def __init__(self, sim, seed: int):
        self.sim, self.seed, self.requests, self.slo = sim, seed, sim.requests, sim.slo
        self.calls: list[int] = []

    def run(self, spec, seed, *, requests=None):
        records = self.sim.run(spec, seed, requests=requests)
        self.calls.append(seed)
        if seed == self.seed and self.calls.count(seed) == 1:
            records = slowed_records(records, 2.0, 2 * len(records.steps.start_s) // 3)
        return records

