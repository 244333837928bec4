"""The compact forward must compute what transformers computes, for every supported architecture,
whether tokens arrive in one prefill, in pieces, or in padded batches of different lengths."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from autospec.engines.llama import CompactLlama
from autospec.errors import InputError

from autospec_testing import make_tiny_model


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_forward_matches_transformers(tmp_path, arch):
    path = make_tiny_model(tmp_path / arch, vocab=50, layers=2, hidden=64, heads=2, kv_heads=1, arch=arch)
    ref_model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    model = CompactLlama(path)
    tokens = torch.randint(0, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = ref_model(tokens).logits
    cache = model.new_cache()
    cache.ensure(3, 32)
    rows = torch.arange(3)
    with torch.inference_mode():
        first = model.forward(tokens[:, :7], cache, rows, torch.zeros(3, dtype=torch.long), torch.full((3,), 7))
        rest = model.forward(tokens[:, 7:], cache, rows, torch.full((3,), 7), torch.full((3,), 5))
    got = torch.cat([first, rest], dim=1)
    assert torch.allclose(got, ref, atol=1e-4, rtol=1e-4), (got - ref).abs().max()


def test_padded_rows_of_different_lengths_match_single_rows(tmp_path):
    path = make_tiny_model(tmp_path / "m", vocab=50, layers=2)
    model = CompactLlama(path)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 50, (n,), generator=gen) for n in (3, 9, 5)]
    singles = []
    with torch.inference_mode():
        for p in prompts:
            cache = model.new_cache()
            cache.ensure(1, 16)
            singles.append(model.forward(p[None], cache, torch.tensor([0]), torch.tensor([0]),
                                         torch.tensor([len(p)]))[0, len(p) - 1])
        cache = model.new_cache()
        cache.ensure(3, 16)
        padded = torch.zeros(3, 9, dtype=torch.long)
        for i, p in enumerate(prompts):
            padded[i, : len(p)] = p
        q_lens = torch.tensor([len(p) for p in prompts])
        batched = model.forward(padded, cache, torch.arange(3), torch.zeros(3, dtype=torch.long), q_lens,
                                logits_at=(q_lens - 1)[:, None])[:, 0]
    assert torch.allclose(torch.stack(singles), batched, atol=1e-5)


def test_missing_and_broken_model_directories_are_input_errors(tmp_path):
    with pytest.raises(InputError, match="does not exist"):
        CompactLlama(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="config.json"):
        CompactLlama(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        CompactLlama(bad)
