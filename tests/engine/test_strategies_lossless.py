"""Every strategy preset is lossless on the torch engine: T=0 output is token-identical to `no-sd` on
the bundled pair, and T=1 output follows the target's exact distribution on a tiny pair.

The oracles need the true match length, which only the simulator knows; they are checked there.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import Counter

import pytest

from autospec.engines.torch_engine import TorchSDEngine
from autospec.generate import run_generate
from autospec.latency import LinearCoeffs, LinearLatencyModel
from autospec.serving.factory import load_tokenizer, needs_latency_model, quick_latency_model
from autospec.strategy import build_strategy, list_presets, load_preset
from autospec.workloads.prompts import load_prompts
from engine.test_t1_distribution import N_TOKENS, PROMPT, chi_square_p, exact_distribution

from autospec_testing import shared_file

STRATEGIES = [name for name in list_presets() if name not in ("oracle", "oracle-m")]


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


# A latency model under which drafting pays (draft passes 10x cheaper than target passes), so that
# model-based policies really draft and trim on the tiny pair and the distribution test is not vacuous.
DRAFTING_PAYS = LinearLatencyModel(draft=LinearCoeffs(1e-7, 1e-6, 1e-3), target=LinearCoeffs(1e-7, 1e-6, 1e-2))


@pytest.fixture(scope="module")
def tiny_setup(tiny_pair):
    target, draft = tiny_pair
    engine = TorchSDEngine(target, draft, temperature=1.0, seed=11)
    return engine, exact_distribution(target, 1.0)


def sample(engine, strategy):
    result = run_generate(engine, [PROMPT] * 6000, strategy, max_tokens=N_TOKENS, batch_size=1000,
                          ignore_eos=True, latency_model=DRAFTING_PAYS)
    return Counter(tuple(t) for t in result.token_ids), result


@pytest.mark.parametrize("name", STRATEGIES)
def test_t1_follows_the_target_distribution(tiny_setup, name):
    engine, expected = tiny_setup
    # Each strategy draws from its own seed, so its sample does not depend on which tests ran before it
    # on the shared engine (a changed policy elsewhere would otherwise shift every later test's draws).
    engine.generator.manual_seed(zlib.crc32(name.encode()))
    samples, result = sample(engine, build_strategy(load_preset(name)))
    if name != "no-sd":
        assert result.drafted > 0, "the strategy never drafted: the test would prove nothing"
    assert chi_square_p(samples, expected) > 1e-3


@pytest.mark.parametrize("name", ["dspark", "adaspec"])
def test_confidence_trimming_with_sampled_proposals_is_biased(tiny_setup, name):
    """Why those presets propose greedily: with sampled proposals the verified prefix depends on a random
    draw, and the output distribution measurably leaves the target's (DSpark App. A)."""
    engine, expected = tiny_setup
    strategy = build_strategy(load_preset(name))
    strategy = dataclasses.replace(strategy, execution=strategy.execution.model_copy(
        update={"draft_sampling": "sample"}))
    samples, result = sample(engine, strategy)
    assert result.verified < result.drafted  # the verifier really trimmed
    assert chi_square_p(samples, expected) < 1e-6
