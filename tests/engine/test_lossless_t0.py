"""At T=0, SD output must be token-identical to plain greedy decoding (K=0) — for every K, batch size
and mix of prompt lengths, including batches whose requests finish at different steps (slot reuse)."""

from __future__ import annotations

import pytest

from autospec.engines.base import GenRequest
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError
from autospec.generate import run_generate
from autospec.serving.factory import load_tokenizer, strategy_spec
from autospec.strategy import build_strategy
from autospec.workloads.prompts import load_prompts

from autospec_testing import shared_file

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def prompt_ids(bundled_pair):
    tokenizer = load_tokenizer(bundled_pair[0])
    prompts = load_prompts(shared_file("humaneval.jsonl.gz"), limit=4)
    prompts += load_prompts(shared_file("gsm8k_test.jsonl"), limit=2)
    prompts += load_prompts(shared_file("mt_bench_questions.jsonl"), limit=2)
    ids = [tokenizer.encode(p.text) for p in prompts]
    assert len({len(i) for i in ids}) > 4, "want mixed prompt lengths"
    return ids


@pytest.fixture(scope="module")
def engine(bundled_pair):
    return TorchSDEngine(*bundled_pair)


def generate(engine, ids, k, batch_size):
    return run_generate(engine, ids, build_strategy(strategy_spec(None, k)), max_tokens=MAX_TOKENS,
                        batch_size=batch_size).token_ids


@pytest.fixture(scope="module")
def reference(engine, prompt_ids):
    return generate(engine, prompt_ids, 0, batch_size=1)


@pytest.mark.parametrize("k", [1, 2, 4, 8])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_static_k_is_token_identical_to_greedy(engine, prompt_ids, reference, k, batch_size):
    assert generate(engine, prompt_ids, k, batch_size) == reference


def test_no_sd_is_batch_invariant(engine, prompt_ids, reference):
    assert generate(engine, prompt_ids, 0, batch_size=8) == reference


def test_partial_verification_and_uneven_drafts_stay_lossless(engine, prompt_ids, reference):
    """Requests draft different amounts, verify only a prefix, and leave mid-batch."""
    res = engine.add([GenRequest(p, MAX_TOKENS) for p in prompt_ids])
    live = list(res.req_ids)
    outputs = {}
    step = 0
    while live:
        for j in range(4):
            subset = [rid for i, rid in enumerate(live) if (i + step) % 4 >= j]
            engine.draft(subset)
        plan = {rid: (len(engine.drafts_of(rid)) + step) % 3 for rid in live}
        out = engine.verify(plan)
        assert all(v <= d for v, d in zip(out.verified, out.drafted))
        done = [rid for rid, f in zip(out.req_ids, out.finished) if f]
        outputs.update({rid: engine.output(rid) for rid in done})
        engine.remove(done)
        live = [rid for rid in live if rid not in done]
        step += 1
    assert [outputs[rid] for rid in res.req_ids] == reference


def test_stop_at_eos_and_max_tokens(engine, prompt_ids):
    res = engine.add([GenRequest(prompt_ids[0], 5)])
    rid = res.req_ids[0]
    while not engine.is_finished(rid):
        for _ in range(8):
            engine.draft([rid])
        engine.verify({rid: 8})
    assert len(engine.output(rid)) == 5
    engine.remove([rid])


def test_vocabulary_mismatch_is_an_input_error(bundled_pair, tmp_path):
    from autospec_testing import make_tiny_model

    other = make_tiny_model(tmp_path / "other", vocab=50, layers=1)
    with pytest.raises(InputError, match="vocabulary"):
        TorchSDEngine(bundled_pair[0], other)
