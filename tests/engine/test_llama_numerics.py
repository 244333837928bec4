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


@pytest.mark.parametrize("rows", [[2, 0, 3, 1], [3, 2, 1, 0], [0, 2]], ids=["shuffled", "reversed", "sparse"])
def test_rows_in_any_order_compute_what_slot_order_computes(tmp_path, rows):
    """A batch whose rows are a block of slots in another order (a replay's usual step) attends to a view
    of the block with its queries reordered; a batch of scattered slots gathers them. Both must give each
    row what the same rows give in slot order."""
    path = make_tiny_model(tmp_path / "m", vocab=50, layers=2, heads=2, kv_heads=1)
    model = CompactLlama(path)
    gen = torch.Generator().manual_seed(2)
    lengths = torch.tensor([4, 9, 6, 7])
    cache = model.new_cache()
    cache.ensure(4, 24)
    with torch.inference_mode():
        prompts = torch.randint(0, 50, (4, 9), generator=gen)
        model.forward(prompts, cache, torch.arange(4), torch.zeros(4, dtype=torch.long), lengths)
        feed = torch.randint(0, 50, (4, 3), generator=gen)
        saved = cache.data.clone()
        ordered = model.forward(feed, cache, torch.arange(4), lengths, torch.full((4,), 3))
        cache.data.copy_(saved)
        index = torch.tensor(rows)
        got = model.forward(feed[index], cache, index, lengths[index], torch.full((len(rows),), 3))
    assert torch.allclose(got, ordered[index], atol=1e-6), (got - ordered[index]).abs().max()


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
