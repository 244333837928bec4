"""Where a vLLM replay's steps part from the simulator's, by kind of step and side: plain steps and steps that
admit a request (its prefill runs inside them), each split into the draft side and the target side.

    python benchmarks/vllm_admission_steps.py --run-dir DIR [--records vllm]
        [--out benchmarks/results/vllm_admission_steps.json]

DIR is a run directory with a vLLM profile and its fit, and replay records under DIR/RECORDS/eval/
(`steps.parquet`, `requests.parquet`): `benchmarks/vllm_sim_fidelity.py --run-dir DIR` leaves both (its
vLLM replays in `vllm/`, the simulator's in `sim/`). Per strategy and repeat, every step that runs requests
(none preempted) is priced by the simulator (`SimEngine.step_parts_s`: each request at its own context,
drafting what it drafted; the prompts the step admitted prefilled inside it, and the drafter's proposal
for them) and measured from the records: the draft side is vLLM's own draft time (`draft_s`, timed inside
its worker: the proposer, the draft's pass over an admitted prompt included), the target side the rest of
the step's period (`metrics.step_seconds`). A ratio is measured over priced, summed over the steps of one
kind: 1.0 = as the simulator charges. On the simulator's own records (`--records sim`) every step's total is
1.0 (its draft time leaves the draft's prefill to `prefill_s`, so there only the totals compare). Prefill-only
steps are not in the step records (nothing decodes in them). No goal: a diagnostic of the simulator
against vLLM (issue 16, docs/vllm.md, "The simulator against vLLM").
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_args import OneLineParser, run  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("plain", "admission")
# a request's admission time is its admitting step's start (`RequestRecord.admitted_s`, the step log's
# `start_s`), the same clock reading on both engines; a tolerance for the float round trip through parquet
SAME_TIME_S = 1e-6


def split_steps(engine, steps, requests) -> dict[str, dict[str, Any]]:
    """One replay's steps (`records.steps_frame()`, `requests_frame()`), per kind: steps, measured and
    priced seconds of each side, and their ratios (None where nothing was priced)."""
    from autospec.serving.metrics import step_contexts, step_seconds

    steps = steps.reset_index(drop=True)
    seconds = step_seconds(steps).to_numpy(float)
    contexts = step_contexts(steps, dict(zip(requests["req_id"], requests["prompt_len"])))
    admitted_at = requests["admitted_s"].to_numpy(float)
    prompt_len = requests["prompt_len"].to_numpy(int)
    draft_s = steps["draft_s"].fillna(0.0).to_numpy(float)
    sums = {kind: {"steps": 0, "unmatched": 0, "measured_draft_s": 0.0, "measured_target_s": 0.0,
                   "priced_draft_s": 0.0, "priced_target_s": 0.0} for kind in KINDS}
    for i in range(len(steps)):
        if steps["batch"].iloc[i] <= 0 or (steps["preempted"].fillna(0).iloc[i] or 0) > 0:
            continue
        admits = (steps["admitted"].fillna(0).iloc[i] or 0) > 0
        cell = sums["admission" if admits else "plain"]
        prompts = prompt_len[np.abs(admitted_at - steps["start_s"].iloc[i]) <= SAME_TIME_S].tolist() if admits else []
        if admits and not prompts:  # its admissions not found in the requests: cannot be priced
            cell["unmatched"] += 1
            continue
        lengths = np.atleast_1d(steps["k"].iloc[i]).astype(int).tolist()
        draft, target = engine.step_parts_s(contexts[i].tolist(), lengths, prompts)
        cell["steps"] += 1
        cell["measured_draft_s"] += draft_s[i]
        cell["measured_target_s"] += seconds[i] - draft_s[i]
        cell["priced_draft_s"] += draft
        cell["priced_target_s"] += target
    for cell in sums.values():
        measured = cell["measured_draft_s"] + cell["measured_target_s"]
        priced = cell["priced_draft_s"] + cell["priced_target_s"]
        cell["draft"] = cell["measured_draft_s"] / cell["priced_draft_s"] if cell["priced_draft_s"] > 0 else None
        cell["target"] = cell["measured_target_s"] / cell["priced_target_s"] if cell["priced_target_s"] > 0 else None
        cell["total"] = measured / priced if priced > 0 else None
    return sums


def measure(run_dir: Path, records: str) -> dict[str, Any]:
    import pandas as pd

    from autospec.errors import InputError
    from autospec.fit import FittedSimEngine
    from autospec.strategy import load_preset

    source = run_dir / records / "eval"
    if not (source / "steps.parquet").is_file() or not (source / "requests.parquet").is_file():
        raise InputError(f"no replay records in {source} (steps.parquet, requests.parquet)", path=run_dir)
    steps, requests = pd.read_parquet(source / "steps.parquet"), pd.read_parquet(source / "requests.parquet")
    engine = FittedSimEngine.from_dirs(run_dir)
    if not engine.fused_prefill:
        raise InputError("its profile is not a vLLM profile: this prices steps as vLLM lays them out",
                         path=run_dir / "profile")
    cells: dict[str, Any] = {}
    for (name, repeat), cell_steps in steps.groupby(["strategy", "repeat"], sort=False):
        engine.set_speculative(load_preset(str(name)).length.policy != "none")
        cell_requests = requests[(requests["strategy"] == name) & (requests["repeat"] == repeat)]
        cells.setdefault(str(name), {"repeats": []})["repeats"].append(
            {"repeat": int(repeat), **split_steps(engine, cell_steps, cell_requests)})
    for cell in cells.values():
        cell["median"] = {kind: {side: _median([r[kind][side] for r in cell["repeats"]])
                                 for side in ("draft", "target", "total")} for kind in KINDS}
    return {"records": records, "cells": cells}


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known)) if known else None


def main() -> None:
    ap = OneLineParser(description=__doc__)
    ap.add_argument("--run-dir", type=Path, required=True)
    ap.add_argument("--records", default="vllm", help="the replay records' folder under the run directory")
    ap.add_argument("--out", type=Path, default=RESULTS / "vllm_admission_steps.json")
    args = ap.parse_args()

    from autospec.artifacts import hardware_info, write_json
    from autospec.config import SCHEMA_VERSION

    result = {"schema_version": SCHEMA_VERSION, "benchmark": "vllm_admission_steps", "run_dir": args.run_dir.name,
              **measure(args.run_dir, args.records), "load_average": os.getloadavg(), "hardware": hardware_info()}
    write_json(args.out, result)
    for name, cell in result["cells"].items():
        m = cell["median"]
        print(f"{name}: " + "; ".join(f"{kind} draft {_fmt(m[kind]['draft'])} target {_fmt(m[kind]['target'])} "
                                      f"total {_fmt(m[kind]['total'])}" for kind in KINDS))
    print(f"-> {args.out}")


def _fmt(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    run(main)
