"""Whether vLLM runs the first decode step of a request that just joined a running batch dearer than a steady
step of the same batch: per strategy (no-SD and static K) and batch size, one offline engine built as a
replay builds it, the bundled pair, kept at the batch size by hand — a new request is added as soon as one
finishes (`LLMEngine.add_request` between `step` calls, output lengths drawn so requests finish at
different steps) — and its full-batch decode steps split into two kinds from the recording scheduler's log:
* `after_join` — the step right after the step that prefilled a joining request, with the same requests
  (the joiner's first decode step: vLLM's persistent batch and block tables have just changed, and the
  joiner verifies the first drafts proposed in its prefill step);
* `steady` — a step whose previous step ran the same requests and prefilled none.
Both kinds run the same churning batches, so their contexts differ alike. Each step's period is split by
vLLM's worker into draft time and the rest (scheduler.DraftTimer, `step_log.split_step`). Steps before the
first request finishes (the batch that started together) are not timed.

    python benchmarks/vllm_join_steps.py [--ks 1,2,4] [--batches 4,8] [--context 128] [--joins 8]
        [--rounds 3] [--out benchmarks/results/vllm_join_steps.json]

Why (issue 16; docs/vllm.md, "The simulator against vLLM"): the simulator prices a step by its batch's
shape, and prices the step that admits a request (its prefill inside the running requests' step) on its
own, but not the step after it; every vLLM profile row is timed on a batch that started together and runs
unchanged, while a replay's requests join and leave all the time. If a joiner's first decode step cost
more, and more so when the engine drafts, the simulator would under-price replayed SD steps. Each round
starts every strategy's engine once and runs every batch size on it; per cell the median over all rounds,
with each round's median (`round_period_s`). Output per strategy and batch: each kind's median period,
draft and outside seconds and mean committed tokens, and after_join / steady of each; `summary` per
strategy the median over batches. No goal: a diagnostic. Run it alone on a quiet machine.

Measured (the committed result, 5 min): after_join / steady at batch 4 / 8 — no-SD 1.04 / 1.10, K = 1 1.06 /
1.05, K = 2 0.99 / 0.98, K = 4 1.01 / 1.01: a join costs the joiner's first decode step a few percent for
no-SD and K = 1, one step per request, under 0.5% of a replay's step time (docs/vllm.md, "The simulator
against vLLM")."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import OneLineParser, run, whole  # noqa: E402
from vllm_engine_forms import whole_list  # noqa: E402
from vllm_serve_forms import require_cells, strategies_of, warm_offline_engine, write_comparison  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("steady", "after_join")
# [chosen] a request's output runs (K + 1) x 6..18 tokens: at the 1.5-2.3 tokens a step that random prompts
# commit, finishes land on different steps, so joins are spread over the run rather than bunched
STEPS_PER_REQUEST = (6, 18)


def step_kinds(steps: list[dict], batch: int) -> dict[str, list[dict]]:
    """The full-batch decode steps of one churning run (`churn`) by kind: `after_join` when the previous
    step prefilled a request and ran the same requests, `steady` when it ran the same requests and
    prefilled none; steps up to the first that a request left (finished) are left out — the first batch's
    requests can be admitted over several steps, since the engine core steps while they are added, and
    that is not a join mid-generation —, as are steps without a period (`step_log.step_period`)."""
    from autospec.serving.vllm.step_log import step_period

    kinds: dict[str, list[dict]] = {kind: [] for kind in KINDS}
    started = False
    for prev, row in zip(steps, steps[1:]):
        started = started or bool(set(prev["ids"]) - set(row["ids"]))
        if not started or len(row["ids"]) != batch or any(row["first"]) or step_period(row) is None:
            continue
        if set(prev["ids"]) == set(row["ids"]):
            kinds["after_join" if any(prev["first"]) else "steady"].append(row)
    return kinds


def churn(llm, batch: int, context: int, k: int, joins: int, rng: np.random.Generator, vocab: int, tag: str) -> None:
    """`batch` requests of `context` random prompt ids, then `joins` more, each added as soon as a running
    one finishes (so the engine runs `batch` requests, less the ones between a finish and the next join);
    request i generates (k + 1) x STEPS_PER_REQUEST tokens, greedy, EOS ignored."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    engine = llm.llm_engine
    started = 0

    def start() -> None:
        nonlocal started
        tokens = (k + 1) * int(rng.integers(STEPS_PER_REQUEST[0], STEPS_PER_REQUEST[1] + 1))
        engine.add_request(f"{tag}-{started}", TokensPrompt(prompt_token_ids=rng.integers(1, vocab, context).tolist()),
                           SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True))
        started += 1

    for _ in range(batch):
        start()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished and started < batch + joins:
                start()


def measure(ks: list[int], batches: list[int], context: int, joins: int,
            rounds: int) -> dict[tuple[str, str, int], list[dict]]:
    """Per (kind, strategy, batch): the step-log rows of every step of that kind over all rounds."""
    from autospec.models import BUNDLED_TARGET
    from autospec.serving.vllm.engine import config_vocab_size, require_vllm
    from autospec.serving.vllm.step_log import read_step_log

    require_vllm()
    strategies = strategies_of(ks)
    rng = np.random.default_rng(0)
    vocab = config_vocab_size(BUNDLED_TARGET)
    longest = context + (max(ks, default=0) + 1) * STEPS_PER_REQUEST[1] + 16
    steps: dict[tuple[str, str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="vllm_join_steps_") as tmp:
        log = Path(tmp) / "steps.jsonl"
        for round_ in range(rounds):
            for name, k in strategies.items():
                with warm_offline_engine(name, max(batches), longest, log, rng) as llm:
                    for batch in batches:
                        t0 = time.perf_counter()
                        churn(llm, batch, context, k, joins, rng, vocab, f"r{round_}-b{batch}")
                        for kind, rows in step_kinds(read_step_log(log, t0), batch).items():
                            steps.setdefault((kind, name, batch), []).extend({**row, "round": round_} for row in rows)
    require_cells(steps, KINDS, list(strategies), batches, "kind")
    return steps


def main() -> None:
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--ks", type=whole_list(1, 16), default=[1, 2, 4], help="static Ks (no-SD is always measured)")
    ap.add_argument("--batches", type=whole_list(2, 64), default=[4, 8], help="batch sizes (a join needs 2)")
    ap.add_argument("--context", type=whole(8, 2048), default=128, help="prompt tokens per request")
    ap.add_argument("--joins", type=whole(1, 200), default=8, help="requests joining each batch per round")
    ap.add_argument("--rounds", type=whole(1, 10), default=3, help="times every engine is started")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_join_steps.json")
    args = ap.parse_args()

    load_at_start = os.getloadavg()
    steps = measure(args.ks, args.batches, args.context, args.joins, args.rounds)
    write_comparison(args.out, {"benchmark": "vllm_join_steps", "ks": args.ks, "batches": args.batches,
                                "context": args.context, "joins": args.joins, "rounds": args.rounds,
                                "steps_per_request": list(STEPS_PER_REQUEST)}, steps, KINDS, load_at_start)


if __name__ == "__main__":
    run(main)
