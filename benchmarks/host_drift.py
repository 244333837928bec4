"""Whether the slow drift of vLLM's step time is the host's or the engine's: one plain vLLM engine (no-SD,
served online as the vLLM profile serves its `decode_plain` rows) kept open for `--seconds`, and autospec's own
torch engine in this process, timed in turn every `--spacing-s`. Each round times a burst of vLLM decode
steps at batch 1 and at the host-speed probe's batch (`profile.HOST_SPEED_SHAPE`, 8 requests at context
128), timed as the profile times its rows (`latency_profile.decode_steps`: the step's period outside the
draft), then a burst of the torch engine's verify calls at the torch host-speed check's shape (timed as
`profile.HostSpeedCheck` times it).

    python benchmarks/host_drift.py [--seconds 2400] [--spacing-s 30] [--repeats 5]
        [--out benchmarks/results/host_drift.json]

Why (issue 16, docs/vllm.md, "The simulator against vLLM"): in the vLLM verdict runs the host-speed probe's
median moved 1.20 -> 0.89 of the profile over 25 min (run p) and 0.87-1.29 within one 35-min capacity
search (run q), and whole profiles of one VM priced plain decode at batch 1 at 11.3 and 14.7 ms hours
apart. If the engine drifts by itself (its age, its memory), restarting it per run would be the cure; if
the host does, only the probes' retries are. The torch engine shares the host and nothing of vLLM, so:
each series over its own median per round (`ratios`), their Spearman correlation (scipy) across rounds
(`correlation`: vLLM batch 8 against torch, and vLLM batch 1 against batch 8; `slow_*` the same of
their 5-minute running medians, SLOW_WINDOW_S), each series' spread
(quantiles of |ratio - 1|) and the share of rounds off by more than the probe's tolerance
(`profile.HOST_SPEED_TOLERANCE`) in each, and in both the same way (`off_together`), and each series' trend
(median of the last quarter of rounds over the first: an engine that slows with age reads > 1 on vLLM
alone). No goal: a diagnostic. Run it alone on a quiet machine.
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
SERIES = ("vllm_b1_s", "vllm_probe_s", "torch_probe_s")
QUANTILES = (0.5, 0.9, 1.0)
# [chosen] the slow drift is read on running medians this long: a burst of steps reads its own noise (one
# round's bursts of the two engines agree far less than their 5-minute medians do), and the drift in
# question moves over tens of minutes
SLOW_WINDOW_S = 300.0


def measure(seconds: float, spacing_s: float, repeats: int) -> list[dict[str, float]]:
    """The rounds: per round, the median seconds of `repeats` vLLM decode steps at batch 1 and at the probe's
    batch, and of `repeats` torch verify calls at the torch check's shape, `spacing_s` apart from round
    start to round start."""
    from autospec.calibration import ProfileSettings
    from autospec.engines.torch_engine import TorchSDEngine
    from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET
    from autospec.profile import HOST_SPEED_SHAPE, time_engine_calls
    from autospec.serving.vllm.engine import OnlineEngine
    from autospec.serving.vllm.latency_profile import _VllmLatencyProfiler

    batch, tokens, context = HOST_SPEED_SHAPE
    settings = ProfileSettings.quick(k_max=tokens - 1).model_copy(
        update={"repeats": repeats, "contexts": [context], "batches": [1, batch]})
    torch_engine = TorchSDEngine(BUNDLED_TARGET, BUNDLED_DRAFT)
    rng = np.random.default_rng(0)
    rounds = []
    with tempfile.TemporaryDirectory(prefix="host_drift_") as tmp:
        profiler = _VllmLatencyProfiler(BUNDLED_TARGET, settings, Path(tmp), None)
        # the plain engine of the profile's decode_plain rows, served online as a replay serves no-SD
        with OnlineEngine(profiler.engine_kwargs(None)) as llm:
            profiler.warm_up(llm)
            start = time.perf_counter()
            while (t := time.perf_counter() - start) < seconds:
                b1 = [outside for outside, _ in profiler.decode_steps(llm, 1, context, repeats)]
                b8 = [outside for outside, _ in profiler.decode_steps(llm, batch, context, repeats)]
                timed = time_engine_calls(torch_engine, batch, context, settings, rng, widths=[tokens])
                rounds.append({"t_s": t, "vllm_b1_s": float(np.median(b1)), "vllm_probe_s": float(np.median(b8)),
                               "torch_probe_s": float(np.median(timed["verify"][tokens][0])),
                               "load_average_1m": os.getloadavg()[0]})
                time.sleep(max(0.0, start + t + spacing_s - time.perf_counter()))
    return rounds


def summarise(rounds: list[dict[str, float]], tolerance: float, slow_rounds: int) -> dict[str, Any]:
    """Each series over its median per round, their correlations (per round, and of their centred
    `slow_rounds`-round running medians: the slow drift apart from each burst's own noise), spreads,
    co-movement and trends (module docstring)."""
    import pandas as pd
    from scipy.stats import spearmanr

    ratios = {name: np.asarray([r[name] for r in rounds]) / np.median([r[name] for r in rounds]) for name in SERIES}
    running = pd.DataFrame(ratios).rolling(slow_rounds, center=True).median().dropna()
    quarter = max(1, len(rounds) // 4)

    def rho(a: str, b: str, series: Any = ratios) -> float | None:
        x, y = np.asarray(series[a]), np.asarray(series[b])
        if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:  # too few rounds, or a series that never moved
            return None
        return float(spearmanr(x, y).statistic)

    off = {name: np.abs(values - 1) > tolerance for name, values in ratios.items()}
    same_way = np.sign(ratios["vllm_probe_s"] - 1) == np.sign(ratios["torch_probe_s"] - 1)
    return {
        "rounds": len(rounds),
        "median_s": {name: float(np.median([r[name] for r in rounds])) for name in SERIES},
        "spread": {name: {f"q{int(q * 100)}": float(np.quantile(np.abs(v - 1), q)) for q in QUANTILES}
                   for name, v in ratios.items()},
        "range": {name: [float(v.min()), float(v.max())] for name, v in ratios.items()},
        "correlation": {"vllm_probe_vs_torch_probe": rho("vllm_probe_s", "torch_probe_s"),
                        "vllm_b1_vs_vllm_probe": rho("vllm_b1_s", "vllm_probe_s"),
                        "slow_rounds": slow_rounds,
                        "slow_vllm_probe_vs_torch_probe": rho("vllm_probe_s", "torch_probe_s", running),
                        "slow_vllm_b1_vs_torch_probe": rho("vllm_b1_s", "torch_probe_s", running)},
        "off_share": {name: float(o.mean()) for name, o in off.items()},
        "off_together": float((off["vllm_probe_s"] & off["torch_probe_s"] & same_way).mean()),
        "trend_last_over_first_quarter": {name: float(np.median(v[-quarter:]) / np.median(v[:quarter]))
                                          for name, v in ratios.items()},
        "ratios": {name: [round(float(x), 4) for x in v] for name, v in ratios.items()},
    }


def main() -> None:
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--seconds", type=between(0, 7200), default=2400.0)
    ap.add_argument("--spacing-s", type=between(0, 3600), default=30.0)
    ap.add_argument("--repeats", type=whole(1, 50), default=5, help="steps (calls) per burst: the profile's --repeats")
    ap.add_argument("--out", type=Path, default=RESULTS / "host_drift.json")
    args = ap.parse_args()

    from autospec.artifacts import hardware_info, write_json
    from autospec.config import SCHEMA_VERSION
    from autospec.profile import HOST_SPEED_TOLERANCE

    load_at_start = os.getloadavg()
    rounds = measure(args.seconds, args.spacing_s, args.repeats)
    summary = summarise(rounds, HOST_SPEED_TOLERANCE, max(1, round(SLOW_WINDOW_S / max(args.spacing_s, 1.0))))
    result = {"schema_version": SCHEMA_VERSION, "benchmark": "host_drift", "seconds": args.seconds,
              "spacing_s": args.spacing_s, "repeats": args.repeats, "tolerance": HOST_SPEED_TOLERANCE,
              **summary, "raw": rounds, "load_average_at_start": load_at_start,
              "load_average_at_end": os.getloadavg(), "hardware": hardware_info()}
    write_json(args.out, result)
    print(f"{summary['rounds']} rounds over {args.seconds:.0f} s; medians {summary['median_s']}; "
          f"rho {summary['correlation']}; off share {summary['off_share']}, together {summary['off_together']:.2f}; "
          f"trend {summary['trend_last_over_first_quarter']} -> {args.out}")


if __name__ == "__main__":
    run(main)
