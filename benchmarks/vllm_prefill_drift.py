"""How far one burst of prefill timings stands for the host: on one vLLM engine built as the profile builds
its fixed-K engine (the bundled pair), time `--repeats` prefills of `--prompt-tokens` random tokens back to
back — as `autospec profile --engine vllm` timed a prefill row before it spread them over its passes
(`latency_profile.PREFILL`: this measurement is why) — then `--repeats` decode steps at batch 1, and again,
for `--seconds`. Each round is one "burst" of each.

    python benchmarks/vllm_prefill_drift.py [--seconds 240] [--prompt-tokens 512] [--repeats 5]
        [--spacing-s 60] [--out benchmarks/results/vllm_prefill_drift.json]

Why (issue 16, docs/vllm.md, "The simulator against vLLM": the verdict runs): the profile's target prefill slope moved
0.215-0.292 ms per token between vLLM profiles made on the same host, and the simulator's error on vLLM
followed it. The profile then timed each prompt length's prefills in one burst, while it spread every
decode shape over up to three generations far apart in time. This measures what that cost: each burst's median
against the median of all bursts (`one_burst`), and the median of three bursts `--spacing-s` apart against
the same (`three_bursts`), as |relative error| quantiles; the same for the decode bursts (`decode_one_burst`).
It does not measure drift slower than `--seconds` (between profiles made an hour apart); nothing here
can, on one run. No goal: a diagnostic. Run it alone on a quiet machine.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import OneLineParser, between, run, whole  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
QUANTILES = (0.5, 0.9, 1.0)


def burst_errors(times_s: list[float], medians: list[float], spacing_s: float) -> dict[str, Any]:
    """|relative error| quantiles (median, p90, max) against the median of all `medians` (one per burst,
    at `times_s`): of a single burst, and of the median of three bursts `spacing_s` apart (each burst
    with the first ones at or after +spacing_s and +2·spacing_s; None when the run is too short)."""
    values = np.asarray(medians, float)
    centre = float(np.median(values))

    def summary(errors: np.ndarray) -> dict[str, float] | None:
        if not len(errors):
            return None
        return {f"q{int(q * 100)}": float(np.quantile(errors, q)) for q in QUANTILES}

    times = np.asarray(times_s, float)
    spread = []
    for i, t in enumerate(times):
        j, k = np.searchsorted(times, t + spacing_s), np.searchsorted(times, t + 2 * spacing_s)
        if k < len(times):
            spread.append(float(np.median(values[[i, j, k]])))
    return {"bursts": len(values), "median_s": centre, "one_burst": summary(np.abs(values / centre - 1)),
            "three_bursts": summary(np.abs(np.asarray(spread) / centre - 1))}


def measure(seconds: float, prompt_tokens: int, repeats: int) -> list[dict[str, float]]:
    """The bursts: per round, the median of `repeats` prefills and of `repeats` decode steps (seconds), timed
    by the vLLM profile's own code (private to it), so a burst here is timed as a prefill row is there."""
    from autospec.calibration import ProfileSettings
    from autospec.models import BUNDLED_TARGET
    from autospec.serving.vllm.engine import close_llm
    from autospec.serving.vllm.latency_profile import FIXED_K_PROPOSER, _VllmLatencyProfiler
    from autospec.serving.vllm.step_log import split_step

    settings = ProfileSettings.quick(k_max=2).model_copy(
        update={"repeats": repeats, "prefill_tokens": [prompt_tokens], "contexts": [128], "batches": [1]})
    rounds = []
    with tempfile.TemporaryDirectory(prefix="vllm_prefill_drift_") as tmp:
        profiler = _VllmLatencyProfiler(BUNDLED_TARGET, settings, Path(tmp), None)
        llm = profiler.engine({"method": "custom_class", "model": FIXED_K_PROPOSER,
                               "num_speculative_tokens": settings.k_max})
        try:
            profiler.warm_up(llm)
            profiler.k_file.write_text("0")
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                prefill = [split_step(step)[0] for step in profiler.prefill_steps(llm, prompt_tokens, repeats)]
                decode = [outside for outside, _ in profiler.decode_steps(llm, 1, 128, repeats)]
                rounds.append({"t_s": time.perf_counter() - start, "prefill_s": float(np.median(prefill)),
                               "decode_s": float(np.median(decode))})
        finally:
            close_llm(llm)
    return rounds


def main() -> None:
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--seconds", type=between(0, 3600), default=240.0)
    ap.add_argument("--prompt-tokens", type=whole(16, 2048), default=512)
    ap.add_argument("--repeats", type=whole(1, 50), default=5, help="prefills (and decode steps) per burst: "
                    "the profile's --repeats")
    ap.add_argument("--spacing-s", type=between(0, 3600), default=60.0)
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_prefill_drift.json")
    args = ap.parse_args()

    from autospec.artifacts import hardware_info, write_json
    from autospec.config import SCHEMA_VERSION

    load_at_start = os.getloadavg()
    rounds = measure(args.seconds, args.prompt_tokens, args.repeats)
    times = [r["t_s"] for r in rounds]
    result = {"schema_version": SCHEMA_VERSION, "benchmark": "vllm_prefill_drift", "seconds": args.seconds,
              "prompt_tokens": args.prompt_tokens, "repeats": args.repeats, "spacing_s": args.spacing_s,
              "prefill": burst_errors(times, [r["prefill_s"] for r in rounds], args.spacing_s),
              "decode_one_burst": burst_errors(times, [r["decode_s"] for r in rounds], args.spacing_s)["one_burst"],
              "rounds": rounds, "load_average_at_start": load_at_start, "load_average_at_end": os.getloadavg(),
              "hardware": hardware_info()}
    write_json(args.out, result)
    prefill = result["prefill"]
    print(f"{prefill['bursts']} bursts over {args.seconds:.0f} s; {args.prompt_tokens}-token prefill median "
          f"{prefill['median_s'] * 1e3:.1f} ms; one burst |err| {prefill['one_burst']}; three bursts "
          f"{args.spacing_s:.0f} s apart {prefill['three_bursts']} -> {args.out}")


if __name__ == "__main__":
    run(main)
