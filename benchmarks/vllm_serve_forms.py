"""Whether vLLM runs a step dearer served online — through `AsyncLLM`, as a replay serves — than offline,
through `LLM.generate`, as `autospec profile --engine vllm` times its rows: per strategy (no-SD and static
K), full-batch decode steps at each batch size and one context on both serving forms of one engine
configuration, the bundled pair, each step's period split by vLLM's worker into draft time and the rest
(scheduler.DraftTimer, `step_log.split_step`).

Forms (both from the EngineArgs `VllmReplayer.session` builds for the strategy: `engine_kwargs` with the
recording scheduler, prefix caching off, the served max_model_len, max_num_seqs = the largest batch):
* `offline` — `vllm.LLM` (`engine.make_llm`), the batch's prompts given to one `generate` call, as the
  profile's `decode_step_rows` does;
* `online` — `AsyncLLM`, the same prompts submitted together as concurrent `generate` streams with
  `RequestOutputKind.FINAL_ONLY`, as a replay submits its requests (`VllmReplayer._generate`).
Within a round both forms get the same random prompts (`--context` ids each) and the same output length
(K + 1 tokens per step for `--warmup` + `--repeats`/`--rounds` + 2 steps); a step is timed when every
prompt of the batch ran in it and none started (the profile's selection), after the first `--warmup`.

    python benchmarks/vllm_serve_forms.py [--ks 1,2,4] [--batches 1,4,8] [--context 128] [--repeats 24]
        [--rounds 4] [--warmup 3] [--out benchmarks/results/vllm_serve_forms.json]

Why (issue 16; docs/vllm.md, "The simulator against vLLM"): replays priced on the simulator's clock read
vLLM's plain steps at 0.88-0.95 of it for static K = 1 and 1.01-1.16 for K = 2-4 (verdict run j), while
every row that clock is fitted to is timed offline. `benchmarks/vllm_engine_forms.py` ruled out the engine
form and the acceptance, both offline; the serving form was the untested difference: an online engine's
front end (its output handler, per-request bookkeeping) runs beside the engine core on the same 2 cores.
Engines are started once per round and form, forms alternating (the order flips each round), so the host's
drift falls on both alike; per cell the median over all rounds. Output per strategy and batch: each form's
median period, draft and outside seconds and mean committed tokens, and online / offline of each; `summary`
per strategy the median ratio over batches. No goal: a diagnostic. Run it alone on a quiet machine.

[chosen] 4 rounds, as `vllm_engine_forms.py`: two engines of one configuration differ by more than one
shape's repeats do (`round_period_s` in the result: each round's median period per cell).

Measured (the committed result, 14 min; a first run before `round_period_s` agreed): no-SD's plain step
0.93-0.97x online at every batch; SD engines' medians 1.08 / 1.05 / 0.98 at K = 1 / 2 / 4 (first run 0.99 /
1.11 / 1.01) against rounds of one cell spreading up to 30% — the serving form is most of the simulator's
over-pricing of no-SD replays, and not the K >= 2 steps' run over the clock (docs/vllm.md).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import OneLineParser, run, whole  # noqa: E402
from vllm_engine_forms import PARTS, cell_medians, ratio, whole_list  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FORMS = ("offline", "online")


def full_batch_steps(steps: list[dict], batch: int, warmup: int, timed: int) -> list[dict]:
    """The step-log rows of `timed` steps in which all `batch` requests ran and none started (their
    period is the step's cost), after the first `warmup` of them: the profile's `decode_step_rows`."""
    from autospec.serving.vllm.step_log import step_period

    full = [s for s in steps if not any(s["first"]) and len(s["ids"]) == batch and step_period(s) is not None]
    return full[warmup:warmup + timed]


def strategies_of(ks: list[int]) -> dict[str, int]:
    """The strategies timed, by name, with the K each drafts: no-SD and static K for each of `ks`."""
    return {"no-sd": 0, **{f"static-k{k}": k for k in ks}}


def generated_tokens(k: int, warmup: int, timed: int) -> int:
    """Tokens each request generates: up to K + 1 a step for the warm-up, the timed steps and two more."""
    return (k + 1) * (warmup + timed + 2)


def replay_kwargs(name: str, max_batch: int, longest: int, log: Path) -> dict[str, Any]:
    """The EngineArgs keywords a replay of strategy `name` starts its engine with (`VllmReplayer.session`:
    the recording scheduler logging to `log`, prefix caching off, the served max_model_len for requests of
    up to `longest` tokens), max_num_seqs = `max_batch`, the bundled pair."""
    from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET
    from autospec.serving.vllm.engine import engine_kwargs, served_max_model_len
    from autospec.serving.vllm.replay import VllmReplayer
    from autospec.strategy import load_preset

    cfg = VllmReplayer(BUNDLED_TARGET, BUNDLED_DRAFT, max_batch=max_batch).config_for(load_preset(name))
    return engine_kwargs(BUNDLED_TARGET, cfg, max_num_seqs=max_batch, seed=0, record_steps=log,
                         max_model_len=served_max_model_len(BUNDLED_TARGET, longest), enable_prefix_caching=False)


def measure(ks: list[int], batches: list[int], context: int, repeats: int, rounds: int,
            warmup: int) -> dict[tuple[str, str, int], list[dict]]:
    """Per (form, strategy, batch): the step-log rows of every timed step over all rounds."""
    from autospec.models import BUNDLED_TARGET
    from autospec.serving.vllm.engine import OnlineEngine, config_vocab_size, generate_tokens, require_vllm
    from autospec.serving.vllm.step_log import read_step_log

    require_vllm()  # sets vLLM's environment before its first import

    timed = -(-repeats // rounds)
    strategies = strategies_of(ks)
    rng = np.random.default_rng(0)
    vocab = config_vocab_size(BUNDLED_TARGET)
    steps: dict[tuple[str, str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="vllm_serve_forms_") as tmp:
        log = Path(tmp) / "steps.jsonl"

        def longest(k: int) -> int:
            return context + generated_tokens(k, warmup, timed) + 16

        def offline(name: str, k: int, prompts: dict[int, list[list[int]]], round_: int) -> None:
            with warm_offline_engine(name, max(batches), longest(k), log, rng) as llm:
                for batch, rows in prompts.items():
                    t0 = time.perf_counter()
                    generate_tokens(llm, rows, generated_tokens(k, warmup, timed))
                    steps.setdefault(("offline", name, batch), []).extend(
                        {**row, "round": round_}
                        for row in full_batch_steps(read_step_log(log, t0), batch, warmup, timed))

        def online(name: str, k: int, prompts: dict[int, list[list[int]]], round_: int) -> None:
            with OnlineEngine(replay_kwargs(name, max(batches), longest(k), log)) as served:
                served.generate([rng.integers(1, vocab, 16).tolist()], 4)
                for batch, rows in prompts.items():
                    t0 = time.perf_counter()
                    served.generate(rows, generated_tokens(k, warmup, timed))
                    steps.setdefault(("online", name, batch), []).extend(
                        {**row, "round": round_}
                        for row in full_batch_steps(read_step_log(log, t0), batch, warmup, timed))

        for round_ in range(rounds):
            for name, k in strategies.items():
                prompts = {batch: rng.integers(1, vocab, (batch, context)).tolist() for batch in batches}
                order = (offline, online) if round_ % 2 == 0 else (online, offline)
                for serve in order:
                    serve(name, k, prompts, round_)
    require_cells(steps, FORMS, list(strategies), batches, "form")
    return steps


@contextmanager
def warm_offline_engine(name: str, max_batch: int, longest: int, log: Path,
                        rng: np.random.Generator) -> Iterator[Any]:
    """An offline vLLM engine for preset `name` as a replay builds it (`replay_kwargs`), warmed up on one
    short random prompt as the profile's engines are; closed on leaving, whatever happened."""
    from autospec.models import BUNDLED_TARGET
    from autospec.serving.vllm.engine import close_llm, config_vocab_size, generate_tokens, make_llm

    llm = make_llm(replay_kwargs(name, max_batch, longest, log))
    try:
        generate_tokens(llm, [rng.integers(1, config_vocab_size(BUNDLED_TARGET), 16).tolist()], 4)
        yield llm
    finally:
        close_llm(llm)


def require_cells(steps: dict[tuple[str, str, int], list[dict]], kinds: tuple[str, ...], strategies: list[str],
                  batches: list[int], kind_name: str) -> None:
    """Refuse a measurement where some (kind, strategy, batch) cell timed no step."""
    missing = [key for key in ((c, n, b) for c in kinds for n in strategies for b in batches) if not steps.get(key)]
    if missing:
        raise RuntimeError(f"vLLM ran no full-batch decode step in {missing[0]} ({kind_name}, strategy, batch)")


def compare(steps: dict[tuple[str, str, int], list[dict]], strategies: list[str], batches: list[int],
            kinds: tuple[str, str] = FORMS) -> dict[str, Any]:
    """Per strategy and batch both kinds' cells (medians, each round's median period) and the second kind
    over the first (`online/offline` here; benchmarks/vllm_ragged_steps.py's `ragged/uniform`); per
    strategy each ratio's and the committed tokens' median over batches."""
    base, other = kinds
    name_of_ratio = f"{other}/{base}"
    per_strategy: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for name in strategies:
        rows = {}
        for batch in batches:
            cells = {kind: {**cell_medians(steps[(kind, name, batch)]),
                            "round_period_s": round_periods(steps[(kind, name, batch)])} for kind in kinds}
            rows[str(batch)] = {"cells": cells, name_of_ratio: ratio(cells[other], cells[base])}
        per_strategy[name] = rows
        summary[name] = {
            name_of_ratio: {part: _median([r[name_of_ratio][part] for r in rows.values()]) for part in PARTS},
            "committed": {kind: float(np.median([r["cells"][kind]["committed"] for r in rows.values()]))
                          for kind in kinds}}
    return {"per_strategy": per_strategy, "summary": summary}


def write_comparison(out: Path, head: dict[str, Any], steps: dict[tuple[str, str, int], list[dict]],
                     kinds: tuple[str, str], load_at_start: tuple[float, float, float]) -> None:
    """Write a two-kind comparison's result — `head` (the benchmark's name and flags, with `ks` and
    `batches`), `compare` of `steps`, the host's load and hardware — to `out`, and print its summary."""
    from autospec.artifacts import hardware_info, write_json
    from autospec.config import SCHEMA_VERSION

    result = {"schema_version": SCHEMA_VERSION, **head,
              **compare(steps, list(strategies_of(head["ks"])), head["batches"], kinds=kinds),
              "load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg(),
              "hardware": hardware_info()}
    write_json(out, result)
    name_of_ratio = f"{kinds[1]}/{kinds[0]}"
    for name, row in result["summary"].items():
        r = row[name_of_ratio]
        print(f"{name}: {name_of_ratio} period {r['period_s']:.3f} outside {r['outside_s']:.3f} "
              f"draft {r['draft_s'] if r['draft_s'] is None else round(r['draft_s'], 3)}; "
              f"committed {row['committed']}")
    print(f"-> {out}")


def round_periods(rows: list[dict]) -> list[float]:
    """Each round's median step period (one engine's): how far engines of one configuration differ."""
    from autospec.serving.vllm.step_log import split_step

    by_round: dict[int, list[float]] = {}
    for row in rows:
        by_round.setdefault(row.get("round", 0), []).append(sum(split_step(row)))
    return [float(np.median(by_round[r])) for r in sorted(by_round)]


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def main() -> None:
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--ks", type=whole_list(1, 16), default=[1, 2, 4], help="static Ks (no-SD is always measured)")
    ap.add_argument("--batches", type=whole_list(1, 64), default=[1, 4, 8])
    ap.add_argument("--context", type=whole(1, 2048), default=128, help="prompt tokens per request")
    ap.add_argument("--repeats", type=whole(1, 200), default=24, help="timed steps per cell, over all rounds")
    ap.add_argument("--rounds", type=whole(1, 10), default=4, help="times every engine is started, forms alternating")
    ap.add_argument("--warmup", type=whole(0, 20), default=3, help="full-batch steps of each generation not timed")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_serve_forms.json")
    args = ap.parse_args()

    load_at_start = os.getloadavg()
    steps = measure(args.ks, args.batches, args.context, args.repeats, args.rounds, args.warmup)
    write_comparison(args.out, {"benchmark": "vllm_serve_forms", "ks": args.ks, "batches": args.batches,
                                "context": args.context, "repeats": args.repeats, "rounds": args.rounds,
                                "warmup": args.warmup}, steps, FORMS, load_at_start)


if __name__ == "__main__":
    run(main)
