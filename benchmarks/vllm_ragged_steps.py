"""Whether vLLM runs a batch of requests of unequal context as dear as one of equal context with the same
total: per strategy (no-SD and static K), full-batch decode steps at each batch size of prompts all of
`--context` tokens (`uniform`) and of prompts spread evenly from (1 - `--spread`) to (1 + `--spread`) times
it, the same total (`ragged`), on one offline engine built as a replay builds it, the bundled pair; each
step's period split by vLLM's worker into draft time and the rest (scheduler.DraftTimer,
`step_log.split_step`).

    python benchmarks/vllm_ragged_steps.py [--ks 1,2,4] [--batches 4,8] [--context 128] [--spread 0.75]
        [--repeats 24] [--rounds 4] [--warmup 3] [--out benchmarks/results/vllm_ragged_steps.json]

Why (issue 16; docs/vllm.md, "The simulator against vLLM"): the simulator prices a step by its batch's
summed context (a vLLM profile's clocks are linear in it: `latency.LinearCoeffs.forward` without the
torch profile's `alpha_ragged`), and every vLLM profile row is timed on prompts of one length, while a
replay's batches hold requests of unequal context. If vLLM's step cost more (or less) for a ragged batch,
and more so when it drafts, the simulator would misprice replayed SD steps as the verdict runs found
(K = 1 0.88-0.95 of its price, K = 2-4 1.01-1.16) while the profile's own shapes fit. Each round starts
every strategy's engine once and times both prompt kinds on it, the kinds' order flipping each round;
per cell the median over all rounds, with each round's median (`round_period_s`). Output per strategy
and batch: each kind's median period, draft and outside seconds and mean committed tokens, and ragged /
uniform of each; `summary` per strategy the median over batches. No goal: a diagnostic. Run it alone on
a quiet machine.

Measured (the committed result, 8 min): ragged / uniform at batch 4 / 8 — no-SD 0.99 / 0.90, K = 1 0.99 /
0.87, K = 2 0.98 / 0.97, K = 4 1.04 / 0.98; at batch 8 every round of no-SD and K = 1 ran the ragged batch
cheaper: the sign and order of the verdict's split (docs/vllm.md, "The simulator against vLLM").
"""

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
from vllm_serve_forms import (  # noqa: E402
    full_batch_steps,
    generated_tokens,
    require_cells,
    strategies_of,
    warm_offline_engine,
    write_comparison,
)

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("uniform", "ragged")


def spread_float(text: str) -> float:
    """An argparse type: the ragged prompts' spread, a fraction in [0, 0.95]."""
    import argparse

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0.0 <= value <= 0.95:
        raise argparse.ArgumentTypeError(f"{value} is outside [0, 0.95]")
    return value


def prompt_lengths(batch: int, context: int, spread: float) -> dict[str, list[int]]:
    """Per kind the prompt lengths of one batch: all `context`, or spread evenly over (1 ± spread) x
    context with the same total (the rounding's remainder on the longest)."""
    ragged = [int(round(x)) for x in np.linspace(context * (1 - spread), context * (1 + spread), batch)]
    ragged[-1] += batch * context - sum(ragged)
    return {"uniform": [context] * batch, "ragged": ragged}


def measure(ks: list[int], batches: list[int], context: int, spread: float, repeats: int, rounds: int,
            warmup: int) -> dict[tuple[str, str, int], list[dict]]:
    """Per (kind, strategy, batch): the step-log rows of every timed step over all rounds."""
    from autospec.models import BUNDLED_TARGET
    from autospec.serving.vllm.engine import config_vocab_size, generate_tokens, require_vllm
    from autospec.serving.vllm.step_log import read_step_log

    require_vllm()
    timed = -(-repeats // rounds)
    strategies = strategies_of(ks)
    rng = np.random.default_rng(0)
    vocab = config_vocab_size(BUNDLED_TARGET)
    longest = int(np.ceil(context * (1 + spread))) + generated_tokens(max(ks, default=0), warmup, timed) + 16
    steps: dict[tuple[str, str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="vllm_ragged_steps_") as tmp:
        log = Path(tmp) / "steps.jsonl"
        for round_ in range(rounds):
            for name, k in strategies.items():
                with warm_offline_engine(name, max(batches), longest, log, rng) as llm:
                    for batch in batches:
                        lengths = prompt_lengths(batch, context, spread)
                        for kind in (KINDS if round_ % 2 == 0 else KINDS[::-1]):
                            prompts = [rng.integers(1, vocab, n).tolist() for n in lengths[kind]]
                            t0 = time.perf_counter()
                            generate_tokens(llm, prompts, generated_tokens(k, warmup, timed))
                            steps.setdefault((kind, name, batch), []).extend(
                                {**row, "round": round_}
                                for row in full_batch_steps(read_step_log(log, t0), batch, warmup, timed))
    require_cells(steps, KINDS, list(strategies), batches, "kind")
    return steps


def main() -> None:
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--ks", type=whole_list(1, 16), default=[1, 2, 4], help="static Ks (no-SD is always measured)")
    ap.add_argument("--batches", type=whole_list(2, 64), default=[4, 8], help="batch sizes (a ragged batch needs 2)")
    ap.add_argument("--context", type=whole(8, 2048), default=128, help="the prompts' mean length in tokens")
    ap.add_argument("--spread", type=spread_float, default=0.75, help="ragged prompts span (1 ± spread) x context")
    ap.add_argument("--repeats", type=whole(1, 200), default=24, help="timed steps per cell, over all rounds")
    ap.add_argument("--rounds", type=whole(1, 10), default=4, help="times every engine is started")
    ap.add_argument("--warmup", type=whole(0, 20), default=3, help="full-batch steps of each generation not timed")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_ragged_steps.json")
    args = ap.parse_args()

    load_at_start = os.getloadavg()
    steps = measure(args.ks, args.batches, args.context, args.spread, args.repeats, args.rounds, args.warmup)
    write_comparison(args.out, {"benchmark": "vllm_ragged_steps", "ks": args.ks, "batches": args.batches,
                                "context": args.context, "spread": args.spread,
                                "prompt_lengths": {str(b): prompt_lengths(b, args.context, args.spread)
                                                   for b in args.batches},
                                "repeats": args.repeats, "rounds": args.rounds, "warmup": args.warmup},
                     steps, KINDS, load_at_start)


if __name__ == "__main__":
    run(main)
