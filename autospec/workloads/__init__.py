"""Workloads: what requests arrive when, how long they are, and what text they carry.

- `prompts`   prompt files of any common layout (`load_prompts`)
- `default_prompts` the default domain sets (`bundled_prompt_sets`): held-out stdlib code, the project's chat/math
- `trace`     the `Trace` table of requests and its operations (window, scale, cap, clip, prompts)
- `loaders`   production trace files: Azure, BurstGPT, Mooncake, ServeGen (`load_trace`)
- `servegen`  ServeGen per-client window traces
- `synthetic` seeded Poisson, gamma, diurnal and on/off arrival processes (`synthesize`)
- `spec`      the `[workload]` TOML table (`WorkloadSpec`, `load_workload`)

The names below are importable from here; they load lazily so that reading prompts does not pay for
pandas and scipy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Prompt": "prompts", "load_prompts": "prompts", "bundled_prompt_sets": "default_prompts",
    "Trace": "trace", "TraceRequest": "trace",
    "load_trace": "loaders", "detect_format": "loaders",
    "synthesize": "synthetic",
    "WorkloadSpec": "spec", "load_workload": "spec", "read_workload_spec": "spec",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
