"""Every strategy preset is lossless on the torch engine: T=0 output is token-identical to `no-sd` on
the bundled pair, and T=1 output follows the target's exact distribution on a tiny pair.

The oracle needs the true match length, which only the simulator knows; it is checked there.
"""

from __future__ import annotations

from collections import Counter

import pytest

from autospec.engines.torch_engine import TorchSDEngine
from autospec.generate import load_tokenizer, needs_latency_model, quick_latency_model, run_generate
from autospec.strategy import build_strategy, list_presets, load_preset
from autospec.workloads.prompts import load_prompts
from conftest import shared_file
from engine.test_t1_distribution import PROMPT, N_TOKENS, chi_square_p, exact_distribution

STRATEGIES = [name for name in list_presets() if name != "oracle"]


@pytest.fixture(scope="module")
def bundled_setup(bundled_pair):
    engine = TorchSDEngine(*bundled_pair)
    tokenizer = load_tokenizer(bundled_pair[0])
    prompts = load_prompts(shared_file("humaneval.jsonl.gz"), limit=3)
    prompts += load_prompts(shared_file("mt_bench_questions.jsonl"), limit=2)
    ids = [tokenizer.encode(p.text) for p in prompts]
    model = quick_latency_model(engine)
    reference = run_generate(engine, ids, build_strategy(load_preset("no-sd")), max_tokens=20,
                             batch_size=5).token_ids
    return engine, ids, model, reference


@pytest.mark.parametrize("name", STRATEGIES)
def test_t0_identical_to_no_sd(bundled_setup, name):
    engine, ids, model, reference = bundled_setup
    spec = load_preset(name)
    result = run_generate(engine, ids, build_strategy(spec), max_tokens=20, batch_size=5,
                          latency_model=model if needs_latency_model(spec) else None)
    assert result.token_ids == reference


@pytest.fixture(scope="module")
def tiny_setup(tiny_pair):
    target, draft = tiny_pair
    engine = TorchSDEngine(target, draft, temperature=1.0, seed=11)
    return engine, exact_distribution(target, 1.0), quick_latency_model(engine, repeats=1)


@pytest.mark.parametrize("name", STRATEGIES)
def test_t1_follows_the_target_distribution(tiny_setup, name):
    engine, expected, model = tiny_setup
    spec = load_preset(name)
    result = run_generate(engine, [PROMPT] * 6000, build_strategy(spec), max_tokens=N_TOKENS, batch_size=1000,
                          ignore_eos=True, latency_model=model if needs_latency_model(spec) else None)
    samples = Counter(tuple(t) for t in result.token_ids)
    assert chi_square_p(samples, expected) > 1e-3
