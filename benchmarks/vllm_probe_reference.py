"""What the vLLM host-speed probe compares with: the target step of the engines a replay runs, timed now,
against the profile's row the probe reads and against the fit's clock (what the simulator charges).

    python benchmarks/vllm_probe_reference.py --run-dir DIR [--k 2] [--rounds 3]
        [--out benchmarks/results/vllm_probe_reference.json]

DIR is a run directory profiled and fitted on vLLM (`autospec profile --engine vllm` then `autospec fit`,
e.g. `benchmarks/verdict.py --engine vllm --keep DIR`'s). In turn, `--rounds` times, each engine alone:
the profile's fixed-K engine (built as `latency_profile` builds it, `--k` constant drafts a step), a
static-K draft_model engine (the `speculative_config` a replay of `static-k{--k}` starts) and a plain
engine (no-SD). On each, the target step — the step's period less its draft time (`step_log.split_step`,
as the profile and the probe time it) — at batch 1 and at the probe's batch, at the probe's context, over
three generations of the profile's timed steps. Per (engine, batch): the median, its ratio to the
profile's row at that shape (for the probe's batch, the row `speed_check.VllmSpeedReference` reads) and
to the fit's target clock there; for the static-K engine also its draft time per step against the fit's
price of K draft passes and a round (what `engines.sim` charges); for it and the plain engine the whole
step against the simulator's clock (the yardstick of `metrics.step_speed` since this script's results)
and against the policies' linear model (`fit.latency_model`, its yardstick before).

Why (issue 16, docs/vllm.md, "The simulator against vLLM"): in the vLLM fidelity runs the probe read SD replays at
1.1-1.2x their profile while no-SD replays of the same runs read 0.9, and in every vLLM verdict run the SD
cells' in-run step speeds read 1.06-1.40x the fit against no-SD's ~1; the simulator came out optimistic for
SD and pessimistic for no-SD to match. That is the engines a replay runs pricing a step differently from
the profile's, the one profile row the probe reads, or the yardstick. No goal: a diagnostic. Run it alone
on a quiet machine.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import OneLineParser, run, whole  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ENGINES = ("fixed-k", "static-k", "plain")


def profile_row(rows, phase: str, batch: int, tokens: int, context: float) -> float | None:
    """The median of the profile row of `phase` at `batch` and `tokens` nearest `context` (None if absent)."""
    rows = rows[(rows["model"] == "target") & (rows["phase"] == phase) & (rows["batch"] == batch)
                & (rows["tokens"] == tokens)]
    if rows.empty:
        return None
    return float(rows.iloc[int(np.argmin(np.abs(rows["context"].to_numpy() - context)))]["median_s"])


def fitted(fit, engine: str, batch: int, tokens: int, context: float) -> float | None:
    """The simulator's price of that target pass (`engines.sim`: the context counted once per pass): the
    clock's, or the plain engine's clock's."""
    clock = fit.plain_target_clock if engine == "plain" else fit.clock_model.target
    return None if clock is None else clock.forward(batch * context, batch * tokens, rows=batch)


def fitted_draft(fit, batch: int, context: float, k: int) -> float:
    """The simulator's price of a round of `k` draft passes (`engines.sim`): each pass over one token a
    request at the context so far, plus the round's own cost (the fit's `clock_draft_round`)."""
    passes = sum(fit.clock_model.draft.forward(batch * (context + j), batch, rows=batch) for j in range(k))
    round_clock = fit.draft_round_clock
    return passes + (0.0 if round_clock is None else round_clock.forward(batch * context, batch))


def measure(run_dir: Path, k: int, rounds: int) -> dict[str, Any]:
    """Per engine and batch, the target step's median seconds in each round (module docstring), timed by
    the vLLM profile's own code (private to it), so a step here is timed as a profile row is there."""
    import pandas as pd

    from autospec.calibration import ProfileSettings
    from autospec.errors import InputError
    from autospec.fit import load_fit
    from autospec.latency import sd_step_time
    from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET
    from autospec.profile import HOST_SPEED_SHAPE
    from autospec.serving.vllm.engine import close_llm, engine_kwargs, make_llm, served_max_model_len
    from autospec.serving.vllm.latency_profile import FIXED_K_PROPOSER, _VllmLatencyProfiler, passes
    from autospec.serving.vllm.replay import VllmReplayer
    from autospec.serving.vllm.speed_check import VllmSpeedReference
    from autospec.strategy import load_preset

    reference = VllmSpeedReference.from_profile(run_dir, HOST_SPEED_SHAPE[0], HOST_SPEED_SHAPE)
    if reference is None or not (run_dir / "fit" / "models.json").is_file():
        raise InputError("not a run directory with a vLLM latency profile and its fit", path=run_dir)
    latency = pd.read_parquet(run_dir / "profile" / "latency.parquet")
    fit = load_fit(run_dir)
    # the run's own profile settings: its fixed-K engine's K_max, its repeats and warm-up steps
    profiled = json.loads((run_dir / "profile" / "profile.json").read_text())["settings"]
    settings = ProfileSettings.quick().model_copy(update={key: profiled[key] for key in ("k_max", "repeats", "warmup")})
    static_k = VllmReplayer(BUNDLED_TARGET, BUNDLED_DRAFT, max_batch=reference.batch).config_for(
        load_preset(f"static-k{k}"))
    batches = sorted({1, reference.batch})
    medians: dict[str, list[float]] = {}
    drafts: dict[int, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="vllm_probe_reference_") as tmp:
        profiler = _VllmLatencyProfiler(BUNDLED_TARGET, settings, Path(tmp), None)
        prompt = max(1, round(reference.context - profiler.mid))  # a row's context is prompt + mid
        generations, timed = passes(settings.repeats)
        for _ in range(rounds):
            for engine in ENGINES:
                if engine == "fixed-k":
                    llm = profiler.engine({"method": "custom_class", "model": FIXED_K_PROPOSER,
                                           "num_speculative_tokens": settings.k_max})
                    profiler.k_file.write_text(str(k))
                elif engine == "static-k":
                    llm = make_llm(engine_kwargs(BUNDLED_TARGET, static_k, max_num_seqs=reference.batch,
                                                 record_steps=profiler.log, enable_prefix_caching=False,
                                                 max_model_len=served_max_model_len(BUNDLED_TARGET, profiler.longest)))
                else:
                    llm = profiler.engine(None)
                try:
                    profiler.warm_up(llm)
                    per_step = 1 if engine == "plain" else k + 1  # tokens a step may commit per request
                    for batch in batches:
                        steps = [step for _ in range(generations) for step in
                                 profiler.decode_steps(llm, batch, prompt, timed, tokens_per_step=per_step)]
                        medians.setdefault(f"{engine}@{batch}", []).append(float(np.median([o for o, _ in steps])))
                        if engine == "static-k":  # the real draft's time too (the fixed-K one proposes constants)
                            drafts.setdefault(batch, []).append(float(np.median([d for _, d in steps])))
                finally:
                    close_llm(llm)
    out = {}
    for engine in ENGINES:
        phase, tokens = ("decode_plain", 1) if engine == "plain" else ("decode", k + 1)
        for batch in batches:
            measured = float(np.median(medians[f"{engine}@{batch}"]))
            row = profile_row(latency, phase, batch, tokens, reference.context)
            price = fitted(fit, engine, batch, tokens, reference.context)
            out[f"{engine}@{batch}"] = {"rounds_s": medians[f"{engine}@{batch}"], "median_s": measured,
                                        "profile_row_s": row, "over_profile_row": None if not row else measured / row,
                                        "fit_s": price, "over_fit": None if not price else measured / price}
            cell = out[f"{engine}@{batch}"]
            if engine == "static-k":
                draft, draft_price = float(np.median(drafts[batch])), fitted_draft(fit, batch, reference.context, k)
                cell.update({"draft_rounds_s": drafts[batch], "draft_s": draft, "draft_fit_s": draft_price,
                             "draft_over_fit": draft / draft_price})
            if engine != "fixed-k":
                # the whole step against the simulator's clock (`metrics.step_speed`'s yardstick, the verdict's
                # in-run step speeds), and against the policies' linear model (its yardstick before)
                whole = measured + cell.get("draft_s", 0.0)
                clock = (price or 0.0) + cell.get("draft_fit_s", 0.0)
                policy = sd_step_time(fit.latency_model, [0 if engine == "plain" else k] * batch,
                                      batch * reference.context)
                cell.update({"step_s": whole, "step_over_clock": whole / clock if clock else None,
                             "step_over_policy_model": whole / policy})
    return {"context": reference.context, "probe_batch": reference.batch, "cells": out}


def main() -> None:
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--k", type=whole(1, 8), default=2, help="drafts per step (the probe's shape is a K = 2 verify)")
    ap.add_argument("--rounds", type=whole(1, 10), default=3,
                    help="each engine's turns; a cell is their median, so three outvote one slow spell")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_probe_reference.json")
    args = ap.parse_args()

    from autospec.artifacts import hardware_info, write_json
    from autospec.config import SCHEMA_VERSION

    load_at_start = os.getloadavg()
    result = {"schema_version": SCHEMA_VERSION, "benchmark": "vllm_probe_reference", "k": args.k,
              "rounds": args.rounds, **measure(args.run_dir, args.k, args.rounds),
              "load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg(),
              "hardware": hardware_info()}
    write_json(args.out, result)
    for name, cell in result["cells"].items():
        line = (f"{name}: target {cell['median_s'] * 1e3:.2f} ms, over the profile row {cell['over_profile_row']}, "
                f"over the fit {cell['over_fit']}")
        if "draft_s" in cell:
            line += f"; draft {cell['draft_s'] * 1e3:.2f} ms, over the fit {cell['draft_over_fit']}"
        if "step_s" in cell:
            line += (f"; whole step over the clock {cell['step_over_clock']}, over the policies' model "
                     f"{cell['step_over_policy_model']}")
        print(line)
    print(f"-> {args.out}")


if __name__ == "__main__":
    run(main)
