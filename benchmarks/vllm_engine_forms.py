"""Whether the vLLM profile times an SD step as a static-K replay runs it: per K, full-batch decode steps at
each batch size and one context on two engine forms and with two kinds of prompt, the bundled pair, each
step's period split by vLLM's worker into draft time and the rest (scheduler.DraftTimer,
`step_log.split_step`).

Engine forms:
* `profiled` — the engine `autospec profile --engine vllm` times its draft `step` and target
  `decode_drafting` rows on: draft_model, num_speculative_tokens = K_max (`--k-max`) with a one-row
  per-batch-size schedule, `FixedKDraftScheduler` setting each step's K, synchronous scheduling
  (`latency_profile._VllmLatencyProfiler.draft_engine_rows`);
* `deployed` — the engine a static-K replay starts: `speculative_config_for(static-kK)`
  (num_speculative_tokens = K, no schedule) through `engine_kwargs` as `VllmReplayer.session` builds it
  (its recording scheduler subclasses vLLM's synchronous Scheduler, so vLLM runs it synchronously too:
  `engines` in the result records each engine's resolved mode).
Prompts:
* `random` — random token ids, as the profile times every decode row. The target's greedy continuation
  of noise is still partly predictable: measured 1.5 / 1.8 / 2.3 tokens committed per request per step at
  K = 1 / 2 / 4 (`committed` in the result);
* `predictable` — the target's own greedy continuation of 8 random ids, made on the engine before it is
  timed: the draft, trained to imitate the target, has most drafts accepted (1.9 / 2.8 / 4.4), more than
  on the real prompts of a replay (run j: 1.67 at K = 1, 2.1 at K = 2, 2.6 at K = 4).

    python benchmarks/vllm_engine_forms.py [--ks 1,2,4] [--k-max 8] [--batches 1,4,8] [--context 128]
        [--repeats 24] [--rounds 4] [--out benchmarks/results/vllm_engine_forms.json]

Why (issue 16; docs/vllm.md, "Profile on vLLM"): the vLLM verdict (run j, verdict_vllm.json) read the plain
steps of static-k1 replays at 0.88-0.95 of the simulator's clock and those of static-k2..k4 and the
k-schedule at 1.07-1.16, while the profile's own rows put the clock within about -3% at K = 1 and -5..-8%
at K >= 2 (fit's draft_step_bias and drafting_target_bias). A step the profile times unlike the replayed one
— on another engine form, or with drafts rejected where a replay's are accepted — would explain a gap the
profile cannot see. Every engine is started once per round, forms alternating over `--rounds` rounds, so
drift of the host falls on every form alike; per shape the median over all rounds. Output per K and batch:
each (form, prompts) cell's median period, draft and outside seconds and mean committed tokens, with the
ratios deployed / profiled (per prompt kind) and predictable / random (per form); `summary` per K the
median of each ratio over batches. No goal: a diagnostic. Run it alone on a quiet machine (~7 min).

[chosen] 4 rounds: one engine's steps differ from another's of the same configuration by more than a
shape's repeats do — a 2-round run read deployed / profiled 1.14 at K = 2 and 4 (random prompts) where
the 4-round run read 0.96-0.97.

Measured (the committed result, 4 rounds): deployed / profiled 0.96-1.04 and predictable / random
0.99-1.03 in period at every K; neither the engine form nor the acceptance explains the replays' gap.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import OneLineParser, run, whole  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
FORMS = ("profiled", "deployed")
PROMPTS = ("random", "predictable")
PARTS = ("period_s", "draft_s", "outside_s")
SEED_TOKENS = 8  # random ids a predictable prompt starts from [chosen]


def whole_list(low: int, high: int):
    """An argparse type: comma-separated whole numbers in [low, high]."""
    one = whole(low, high)

    def parse(text: str) -> list[int]:
        return sorted({one(part) for part in text.split(",") if part.strip()})

    return parse


def measure(ks: list[int], k_max: int, batches: list[int], context: int, repeats: int,
            rounds: int) -> dict[str, Any]:
    """Per (form, prompts, K, batch): the step-log rows of every timed step over all rounds, and each
    engine's resolved scheduling mode. The steps are timed by the vLLM profile's own code (private to it),
    so a step here is timed as a profile row is there."""
    from autospec.calibration import ProfileSettings
    from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET
    from autospec.serving.vllm.engine import close_llm, engine_kwargs, generate_tokens, make_llm, served_max_model_len
    from autospec.serving.vllm.latency_profile import FIXED_K_DRAFT_SCHEDULER, _VllmLatencyProfiler
    from autospec.serving.vllm.speculative_config import speculative_config_for
    from autospec.strategy import load_preset

    settings = ProfileSettings.quick(k_max=k_max).model_copy(
        update={"repeats": repeats, "contexts": [context], "batches": batches})
    steps: dict[tuple[str, str, int, int], list[dict]] = {}
    modes: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="vllm_engine_forms_") as tmp:
        profiler = _VllmLatencyProfiler(BUNDLED_TARGET, settings, Path(tmp), None)

        def deployed(k: int):
            cfg = speculative_config_for(load_preset(f"static-k{k}"), BUNDLED_TARGET, BUNDLED_DRAFT)
            return make_llm(engine_kwargs(BUNDLED_TARGET, cfg, max_num_seqs=max(batches), record_steps=profiler.log,
                                          max_model_len=served_max_model_len(BUNDLED_TARGET, profiler.longest),
                                          enable_prefix_caching=False))

        def profiled():
            return profiler.engine({"method": "draft_model", "model": str(BUNDLED_DRAFT),
                                    "num_speculative_tokens": k_max, "draft_sample_method": "greedy",
                                    "num_speculative_tokens_per_batch_size": [[1, max(batches), k_max]]},
                                   scheduler_cls=FIXED_K_DRAFT_SCHEDULER, async_scheduling=False)

        def timed(llm, form: str, form_ks: list[int]) -> None:
            profiler.warm_up(llm)
            config = llm.llm_engine.vllm_config
            modes[form if form == "profiled" else f"{form}-k{form_ks[0]}"] = {
                "async_scheduling": bool(config.scheduler_config.async_scheduling),
                "num_speculative_tokens": config.speculative_config.num_speculative_tokens}
            for batch in batches:
                seeds = profiler.rng.integers(1, profiler.vocab, (batch, SEED_TOKENS)).tolist()
                profiler.k_file.write_text("0")  # the profiled engine drafts nothing while it writes prompts
                written = generate_tokens(llm, seeds, context - SEED_TOKENS)
                prompts = {"random": profiler.rng.integers(1, profiler.vocab, (batch, context)).tolist(),
                           "predictable": [seed + more for seed, more in zip(seeds, written)]}
                for k in form_ks:
                    profiler.k_file.write_text(str(k))
                    for kind, rows in prompts.items():
                        steps.setdefault((form, kind, k, batch), []).extend(
                            profiler.decode_step_rows(llm, rows, -(-repeats // rounds), tokens_per_step=k + 1))

        for _ in range(rounds):
            for form, k in [("profiled", 0), *(("deployed", k) for k in ks)]:
                llm = profiled() if form == "profiled" else deployed(k)
                try:
                    timed(llm, form, ks if form == "profiled" else [k])
                finally:
                    close_llm(llm)
    return {"steps": steps, "modes": modes}


def cell_medians(rows: list[dict]) -> dict[str, float]:
    """Median period, draft and outside seconds of one cell's steps, and its mean committed tokens per
    request per step."""
    from autospec.serving.vllm.step_log import split_step

    outside, draft = (np.asarray(column, float) for column in zip(*map(split_step, rows)))
    committed = [c for row in rows for c in row["c"]]
    return {"period_s": float(np.median(outside + draft)), "draft_s": float(np.median(draft)),
            "outside_s": float(np.median(outside)), "committed": float(np.mean(committed)), "steps": len(rows)}


def ratio(a: dict[str, float], b: dict[str, float]) -> dict[str, float | None]:
    return {part: a[part] / b[part] if b[part] else None for part in PARTS}


def compare(steps: dict[tuple[str, str, int, int], list], ks: list[int], batches: list[int]) -> dict[str, Any]:
    """Per K and batch every cell's medians and the ratios between them; per K each ratio's median over
    batches."""
    per_k: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    for k in ks:
        rows = {}
        for batch in batches:
            cells = {f"{form}/{kind}": cell_medians(steps[(form, kind, k, batch)])
                     for form in FORMS for kind in PROMPTS}
            ratios = {**{f"deployed/profiled ({kind})": ratio(cells[f"deployed/{kind}"], cells[f"profiled/{kind}"])
                         for kind in PROMPTS},
                      **{f"predictable/random ({form})": ratio(cells[f"{form}/predictable"], cells[f"{form}/random"])
                         for form in FORMS}}
            rows[str(batch)] = {"cells": cells, "ratios": ratios}
        per_k[str(k)] = rows
        names = next(iter(rows.values()))["ratios"]
        summary[str(k)] = {
            **{name: {part: float(np.median([r["ratios"][name][part] for r in rows.values()
                                             if r["ratios"][name][part] is not None])) for part in PARTS}
               for name in names},
            "committed": {cell: float(np.median([r["cells"][cell]["committed"] for r in rows.values()]))
                          for cell in next(iter(rows.values()))["cells"]}}
    return {"per_k": per_k, "summary": summary}


def main() -> None:
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--ks", type=whole_list(1, 16), default=[1, 2, 4])
    ap.add_argument("--k-max", type=whole(1, 16), default=8, help="the profiled engine's num_speculative_tokens "
                    "(the profile's K_max; the bundled default run's is 8)")
    ap.add_argument("--batches", type=whole_list(1, 64), default=[1, 4, 8])
    ap.add_argument("--context", type=whole(SEED_TOKENS + 1, 2048), default=128)
    ap.add_argument("--repeats", type=whole(1, 200), default=24, help="timed steps per cell, over all rounds")
    ap.add_argument("--rounds", type=whole(1, 10), default=4, help="times every engine is started, forms alternating")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_engine_forms.json")
    args = ap.parse_args()
    if max(args.ks) > args.k_max:
        ap.error(f"--ks {max(args.ks)} exceeds --k-max {args.k_max}")

    from autospec.artifacts import hardware_info, write_json
    from autospec.config import SCHEMA_VERSION

    load_at_start = os.getloadavg()
    measured = measure(args.ks, args.k_max, args.batches, args.context, args.repeats, args.rounds)
    result = {"schema_version": SCHEMA_VERSION, "benchmark": "vllm_engine_forms", "ks": args.ks,
              "k_max": args.k_max, "batches": args.batches, "context": args.context, "repeats": args.repeats,
              "rounds": args.rounds, "engines": measured["modes"],
              **compare(measured["steps"], args.ks, args.batches),
              "load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg(),
              "hardware": hardware_info()}
    write_json(args.out, result)
    for k, ratios in result["summary"].items():
        print(f"K={k}: committed {ratios['committed']}")
        for name, r in ratios.items():
            if name != "committed":
                print(f"  {name}: period {r['period_s']:.3f} draft {r['draft_s']:.3f} outside {r['outside_s']:.3f}")
    print(f"-> {args.out}")


if __name__ == "__main__":
    run(main)
