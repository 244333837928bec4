"""Decision overhead of every strategy: microseconds per SD step spent in the policies, at batch 1, 16,
64 and 256, and its ratio to a measured target verify step of the bundled pair at the same batch.

    python benchmarks/policy_overhead.py [--out benchmarks/results/policy_overhead.json]

One "decision" is everything a strategy computes in one step: the schedule pick, the length policy's
begin_step and its keep_drafting calls while K_max tokens are drafted, the verify policy's select, and
every observe call. The requests carry realistic state (64 rounds of history, KLD and confidence
windows) and the drafts carry real confidences drawn from a Beta distribution. Goal (issue 3): <= 1% of
a verify step at batch 64 (FASER reports 0.5-0.9% for its drafter).

The cost-aware `oracle` reads the engine's step clock (`StepContext.step_clock`), which only the
simulator has: its decisions are timed with the clock of the simulator calibrated by the committed CI
profile (`reports/ci-profile`, a profile of the same bundled pair on this kind of CPU), the clock it
calls K_max + 1 times per step in a real replay.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from autospec.contract import DraftState, DraftToken, RequestView, RoundRecord, StepContext, StepOutcome

RESULTS = Path(__file__).resolve().parent / "results"
REPO = RESULTS.parent.parent
K_MAX = 8
CONTEXT = 256


def make_requests(batch: int, rng: np.random.Generator) -> list[RequestView]:
    views = []
    for i in range(batch):
        rounds = [RoundRecord(4, 4, int(rng.integers(0, 5))) for _ in range(64)]
        views.append(RequestView(
            req_id=i, prompt_len=CONTEXT, generated_len=int(rng.integers(1, 200)), max_tokens=256,
            arrival_s=float(i) * 0.01, predicted_output_len=200.0, attained_service_s=float(rng.random()),
            domain="code", rounds=rounds, kld_history=list(rng.gamma(1.0, 0.3, 64)),
            confidence_history=list(rng.beta(4, 2, 64)), true_match_len=int(rng.integers(0, K_MAX + 1))))
    return views


def one_decision(strategy, ctx: StepContext, rng: np.random.Generator) -> float:
    """Seconds the strategy's policies spend on one step (engine work simulated outside the timer)."""
    spent = 0.0
    t0 = time.perf_counter()
    strategy.schedule.pick(ctx.now_s, [], ctx.requests, len(ctx.requests))
    strategy.length.begin_step(ctx)
    drafts = DraftState.empty(ctx.req_ids)
    spent += time.perf_counter() - t0
    while True:
        t0 = time.perf_counter()
        more = strategy.length.keep_drafting(ctx, drafts)
        spent += time.perf_counter() - t0
        ids = [rid for rid, m, n in zip(drafts.req_ids, more, drafts.lengths()) if m and n < K_MAX]
        if not ids:
            break
        confs = rng.beta(4, 2, len(ids))
        for rid, c in zip(ids, confs):  # what engine.draft would hand back
            drafts.append(rid, DraftToken(int(rng.integers(0, 4096)), float(c), float(rng.random() * 3)))
    t0 = time.perf_counter()
    n_verify = strategy.verify.select(ctx, drafts)
    spent += time.perf_counter() - t0
    verified = [min(int(n), k) for n, k in zip(n_verify, drafts.lengths())]
    accepted = [int(rng.integers(0, v + 1)) for v in verified]
    outcome = StepOutcome(
        req_ids=ctx.req_ids, drafted=drafts.lengths(), verified=verified, accepted=accepted,
        committed=[[1] * (a + 1) for a in accepted], finished=[False] * len(accepted),
        target_probs=[list(rng.random(v)) for v in verified], klds=[list(rng.gamma(1.0, 0.3, v)) for v in verified],
        draft_time_s=0.004, verify_time_s=0.01)
    t0 = time.perf_counter()
    strategy.length.observe(ctx, outcome)
    strategy.verify.observe(ctx, outcome)
    strategy.schedule.observe(outcome)
    return spent + time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=RESULTS / "policy_overhead.json")
    # 200, not 30: with 30 the median of a cell moved by up to 2.3x between two back-to-back runs on one
    # host, and GP-LCB (a window of W = 64 steps) was timed before its window filled
    ap.add_argument("--steps", type=int, default=200, help="decisions timed per (strategy, batch)")
    args = ap.parse_args()

    from autospec.artifacts import hardware_info, write_json
    from autospec.engines.torch_engine import TorchSDEngine
    from autospec.fit import FittedSimEngine
    from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET
    from autospec.serving.factory import quick_latency_model
    from autospec.strategy import build_strategy, list_presets, load_preset

    engine = TorchSDEngine(BUNDLED_TARGET, BUNDLED_DRAFT)
    latency_model = quick_latency_model(engine)
    step_clock = FittedSimEngine.from_dirs(REPO / "reports" / "ci-profile", k_max=K_MAX).step_time_s
    batches = [1, 16, 64, 256]
    verify_s = {b: float(np.median(engine.time_forward("target", b, 5, CONTEXT, repeats=3, warmup=1)))
                for b in batches}
    print(json.dumps({"verify_step_ms": {b: round(t * 1e3, 3) for b, t in verify_s.items()}}), flush=True)
    rows = []
    for name in list_presets():
        for batch in batches:
            rng = np.random.default_rng(batch)
            strategy = build_strategy(load_preset(name))
            views = make_requests(batch, rng)
            times = []
            for step in range(args.steps + 3):
                ctx = StepContext(now_s=step * 0.01, requests=views, k_max=K_MAX, latency_model=latency_model,
                              step_clock=step_clock)
                t = one_decision(strategy, ctx, rng)
                if step >= 3:  # the first steps warm caches and fill windows
                    times.append(t)
            us = statistics.median(times) * 1e6
            rows.append({"strategy": name, "batch": batch, "us_per_decision": round(us, 1),
                         "ratio_to_verify_step": round(us / 1e6 / verify_s[batch], 5)})
            print(json.dumps(rows[-1]), flush=True)
    at64 = {r["strategy"]: r["ratio_to_verify_step"] for r in rows if r["batch"] == 64}
    write_json(args.out, {
        "benchmark": "policy_overhead",
        "k_max": K_MAX,
        "context": CONTEXT,
        "steps_per_cell": args.steps,
        "verify_step_s": {str(b): t for b, t in verify_s.items()},
        "rows": rows,
        "worst_ratio_at_batch64": max(at64.values()),
        "strategies_over_1pct_at_batch64": sorted(k for k, v in at64.items() if v > 0.01),
        "goal_ratio_at_batch64": 0.01,
        "hardware": hardware_info(),
    })


if __name__ == "__main__":
    main()
