"""GPU telemetry through NVML (nvidia-ml-py): a snapshot, and a background sampler for profile/evaluate.

`TelemetrySampler` polls every GPU's SM clock, utilization, memory used and power draw on a daemon
thread while a stage runs and folds the samples into per-GPU statistics (mean, min, p50, max). On a
machine without a GPU (no pynvml, no driver, no device) nothing is sampled and the record says why:
{"available": false, "reason": ...}. The sampler only reads counters; it never changes device state.
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

try:  # importing only loads the bindings (~15 ms); the driver is opened by nvmlInit in _nvml
    import pynvml
except ImportError:  # nvidia-ml-py is a dependency, but a trimmed install still runs without telemetry
    pynvml = None

METRICS = ("sm_clock_mhz", "utilization_gpu_pct", "memory_used_bytes", "power_w")
SERIES_CAP = 2000  # samples kept verbatim in the record (the statistics use all of them)

# One sample: a list with one dict per GPU, each holding "index" and the METRICS.
SampleFn = Callable[[], list[dict[str, float]]]


def _nvml():
    if pynvml is None:
        return None, "nvidia-ml-py (pynvml) is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return None, f"NVML could not start: {exc}"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            pynvml.nvmlShutdown()
            return None, "NVML found no GPU"
    except pynvml.NVMLError as exc:
        pynvml.nvmlShutdown()
        return None, f"NVML query failed: {exc}"
    return pynvml, None


def snapshot() -> dict[str, Any]:
    """Device state per GPU: name, memory, clocks, power, temperature, utilization."""
    nvml, reason = _nvml()
    if nvml is None:
        return {"available": False, "reason": reason}
    try:
        gpus = []
        for i in range(nvml.nvmlDeviceGetCount()):
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            mem = nvml.nvmlDeviceGetMemoryInfo(h)
            name = nvml.nvmlDeviceGetName(h)
            gpus.append({
                "index": i, "name": name.decode() if isinstance(name, bytes) else name,
                "memory_total_bytes": int(mem.total), "memory_used_bytes": int(mem.used),
                "sm_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                "mem_clock_mhz": nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM),
                "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
                "temperature_c": nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
                "utilization_gpu_pct": nvml.nvmlDeviceGetUtilizationRates(h).gpu,
            })
        return {"available": True, "gpus": gpus}
    except nvml.NVMLError as exc:
        return {"available": False, "reason": f"NVML query failed: {exc}"}
    finally:
        nvml.nvmlShutdown()


def _nvml_sampler(nvml) -> SampleFn:
    handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]

    def sample() -> list[dict[str, float]]:
        out = []
        for i, h in enumerate(handles):
            out.append({
                "index": i,
                "sm_clock_mhz": float(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM)),
                "utilization_gpu_pct": float(nvml.nvmlDeviceGetUtilizationRates(h).gpu),
                "memory_used_bytes": float(nvml.nvmlDeviceGetMemoryInfo(h).used),
                "power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0,
            })
        return out

    return sample


def aggregate(samples: Sequence[tuple[float, list[dict[str, float]]]]) -> list[dict[str, Any]]:
    """Per GPU and metric: n, mean, min, p50, max over the samples ((t, per-GPU dicts) pairs)."""
    by_gpu: dict[int, dict[str, list[float]]] = {}
    for _, gpus in samples:
        for g in gpus:
            cols = by_gpu.setdefault(int(g["index"]), {m: [] for m in METRICS})
            for m in METRICS:
                if g.get(m) is not None:
                    cols[m].append(float(g[m]))
    out = []
    for index in sorted(by_gpu):
        stats = {}
        for m, values in by_gpu[index].items():
            if values:
                v = np.asarray(values)
                stats[m] = {"n": int(v.size), "mean": float(v.mean()), "min": float(v.min()),
                            "p50": float(np.median(v)), "max": float(v.max())}
        out.append({"index": index, "stats": stats})
    return out


class TelemetrySampler:
    """Sample GPU counters every `interval_s` on a daemon thread between start() and stop().

    Use as a context manager; `record()` is the JSON-ready result. `sample_fn` replaces NVML (tests).
    """

    def __init__(self, interval_s: float = 0.5, sample_fn: SampleFn | None = None):
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.interval_s = interval_s
        self._sample_fn = sample_fn
        self._nvml = None
        self.reason: str | None = None
        self.before: dict[str, Any] | None = None
        self.samples: list[tuple[float, list[dict[str, float]]]] = []
        self.errors = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._t1 = 0.0

    def start(self) -> "TelemetrySampler":
        if self._sample_fn is None:
            self.before = snapshot()
            if not self.before.get("available"):
                self.reason = self.before.get("reason")
                return self
            self._nvml, self.reason = _nvml()
            if self._nvml is None:
                return self
            self._sample_fn = _nvml_sampler(self._nvml)
        self._t0 = time.perf_counter()
        self._thread = threading.Thread(target=self._run, name="autospec-telemetry", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        assert self._sample_fn is not None
        while True:
            try:
                self.samples.append((time.perf_counter() - self._t0, self._sample_fn()))
            except Exception:  # a counter that fails once (e.g. power on some boards) must not kill the run
                self.errors += 1
            if self._stop.wait(self.interval_s):
                return

    def stop(self) -> dict[str, Any]:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._t1 = time.perf_counter()
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            finally:
                self._nvml = None
        return self.record()

    def record(self) -> dict[str, Any]:
        if self.reason is not None and not self.samples:
            return {"available": False, "reason": self.reason}
        step = max(1, len(self.samples) // SERIES_CAP + (len(self.samples) % SERIES_CAP > 0))
        series = [{"t_s": t, "gpus": g} for t, g in self.samples[::step]]
        rec: dict[str, Any] = {"available": True, "interval_s": self.interval_s, "samples": len(self.samples),
                               "sample_errors": self.errors, "duration_s": max(0.0, self._t1 - self._t0),
                               "gpus": aggregate(self.samples), "series": series}
        if self.before is not None:
            rec["before"] = self.before
        return rec

    def __enter__(self) -> "TelemetrySampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
