"""Where a simulated replay left the profiled grid: the simulator's step times are the fit's models
evaluated at the replay's shapes, and a shape the profile never measured (a larger batch, a longer
context, a prefill of several prompts at once) is an extrapolation of those models, not a measurement.

`outside_grid` counts, in one replay's records, the decode steps and prefills whose shape lies outside
the grid the profile measured (`ProfiledGrid`, read from profile/latency.parquet by
`autospec.fit.profiled_grid`):

* `batch` — decode steps with more requests than the largest profiled decode batch;
* `context` — decode steps whose mean context per request (KV tokens / batch) is above the largest
  profiled decode context;
* `verify_tokens` — decode steps where some request verified more tokens (K + 1) than the profile's
  largest target pass;
* `prefill_batch` — admissions that prefilled more prompts together than the profile's largest prefill
  batch (the quick profile measures one prompt at a time);
* `prefill_tokens` — requests whose prompt is longer than the longest profiled prefill.

Each is a fraction of the replay's decode steps, admissions or requests; `outside` is True when any
is above 0. A flag is not an error: the fit may extrapolate well; it says which figures rest on an
extrapolation (evaluate's summary `outside_profile`, its CLI warning line and the report).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from pydantic import BaseModel, ConfigDict

__all__ = ["ProfiledGrid", "outside_grid", "outside_text"]


class ProfiledGrid(BaseModel):
    """The largest shapes a profile measured (None: that dimension was not measured)."""

    model_config = ConfigDict(extra="forbid")
    decode_batch: int | None = None
    decode_context: float | None = None
    verify_tokens: int | None = None
    prefill_batch: int | None = None
    prefill_tokens: int | None = None


def _fraction(mask: np.ndarray) -> float:
    return float(mask.mean()) if mask.size else 0.0


def outside_grid(requests: pd.DataFrame, steps: pd.DataFrame, grid: ProfiledGrid) -> dict[str, Any]:
    """Fractions of one replay's decode steps / admissions / requests outside `grid` (module docstring)."""
    out: dict[str, float] = {}
    batch = steps["batch"].to_numpy(dtype=float) if len(steps) else np.zeros(0)
    if grid.decode_batch is not None:
        out["batch"] = _fraction(batch > grid.decode_batch)
    if grid.decode_context is not None:
        context = steps["kv_tokens"].to_numpy(dtype=float) / np.maximum(batch, 1.0) if len(steps) else batch
        out["context"] = _fraction(context > grid.decode_context)
    if grid.verify_tokens is not None:
        widest = np.array([max((v + 1 for v in ks), default=0) for ks in steps["k"]]) if len(steps) else batch
        out["verify_tokens"] = _fraction(widest > grid.verify_tokens)
    if grid.prefill_batch is not None:
        admitted = steps["admitted"].to_numpy() if len(steps) else np.zeros(0)
        out["prefill_batch"] = _fraction(admitted[admitted > 0] > grid.prefill_batch)
    if grid.prefill_tokens is not None:
        out["prefill_tokens"] = _fraction(requests["prompt_len"].to_numpy() > grid.prefill_tokens)
    return {"fractions": out, "outside": any(v > 0 for v in out.values())}


def outside_text(per_strategy: dict[str, dict[str, Any]], grid: ProfiledGrid) -> str | None:
    """One line naming, per strategy, the dimensions a replay left the grid in (None when none did)."""
    limits = {"batch": f"batch > {grid.decode_batch}", "context": f"context > {grid.decode_context:g}"
              if grid.decode_context is not None else "", "verify_tokens": f"verify > {grid.verify_tokens} tokens",
              "prefill_batch": f"> {grid.prefill_batch} prompts prefilled together",
              "prefill_tokens": f"prompt > {grid.prefill_tokens} tokens"}
    parts = []
    for name, found in per_strategy.items():
        where = [f"{limits[k]} ({v:.0%})" for k, v in found["fractions"].items() if v > 0]
        if where:
            parts.append(f"{name}: {', '.join(where)}")
    if not parts:
        return None
    return ("simulator predictions outside the profiled grid (extrapolated by the fit; profile those shapes "
            "to measure them): " + "; ".join(parts))
