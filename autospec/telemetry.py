"""GPU telemetry through NVML (nvidia-ml-py): a snapshot, and a background sampler for profile/evaluate;
and the host's CPU load around a real-engine run (`HostLoadMeter`, from /proc).

`TelemetrySampler` polls every GPU's SM clock, utilization, memory used and power draw on a daemon
thread while a stage runs and folds the samples into per-GPU statistics (mean, min, p50, max). On a
machine without a GPU (no pynvml, no driver, no device) nothing is sampled and the record says why:
{"available": false, "reason": ...}. The sampler only reads counters; it never changes device state.
"""

from __future__ import annotations

import os
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


# --- host load: is anything else using the CPU while a real engine is timed? ----------------------------

# [chosen] A real-engine run is disturbed when other processes used more than a quarter of the machine's
# CPU time while it ran, or the hypervisor took more than 5% (steal): on the 2-core hosts autospec is
# developed on, one busy neighbour process is half the machine; the engine then measures another machine
# than the one it was profiled on. Both are shares of every CPU's time over the run (1.0 = all cores).
OTHERS_CPU_LIMIT = 0.25
STEAL_LIMIT = 0.05


def _cpu_jiffies() -> tuple[int, int, int] | None:
    """(busy, steal, total) clock ticks of all CPUs since boot (/proc/stat's `cpu` line); None without /proc."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq
    return busy, steal, busy + idle + iowait + steal


def _tree_jiffies(root: int) -> int | None:
    """CPU clock ticks (user + system) of process `root` and every descendant now alive, plus the children
    it has reaped — a vLLM replay computes in an engine-core child process, which is ours, not a
    neighbour's. None without /proc."""
    children: dict[int, list[int]] = {}
    ticks: dict[int, int] = {}
    try:
        entries = [e.name for e in os.scandir("/proc") if e.name.isdigit()]
    except OSError:
        return None
    for name in entries:
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                rest = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited meanwhile
        pid = int(name)
        reaped = int(rest[13]) + int(rest[14]) if pid == root else 0  # cutime + cstime: waited-for children
        ticks[pid] = int(rest[11]) + int(rest[12]) + reaped  # utime + stime
        children.setdefault(int(rest[1]), []).append(pid)
    if root not in ticks:
        return None
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += ticks.get(pid, 0)
        todo.extend(children.get(pid, []))
    return total


class HostLoadMeter:
    """Measures, over a real-engine run, how much of the machine's CPU went to other processes, to the
    hypervisor (steal) and to this process tree, and the load average at both ends. Only reads /proc
    (nothing is recorded where it is absent: {"available": false}).

    A meter adds up the intervals it was running: `start()` opens one, `pause()` closes it, `resume()` opens
    the next, `stop()` closes the last and reports their sum. vLLM replays measure only their runs this way
    [why: vLLM computes in an engine-core child and its worker grandchild; an engine core killed at
    shutdown orphans the worker, whose CPU time then leaves this process tree and read as another
    process's — a quiet host once measured "others 29%" over a whole evaluate]. The torch engine runs in
    this process, so one interval over the whole evaluate is the same thing."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.busy = self.steal = self.total = self.own = 0
        self.available = True
        self.loads: list[float] = []
        self._open: tuple[float, tuple[int, int, int] | None, int | None] | None = None

    @classmethod
    def start(cls) -> "HostLoadMeter":
        meter = cls()
        meter.resume()
        return meter

    def resume(self) -> None:
        """Open an interval (nothing when one is open)."""
        if self._open is None:
            self.loads.append(os.getloadavg()[0])
            self._open = (time.perf_counter(), _cpu_jiffies(), _tree_jiffies(os.getpid()))

    def pause(self) -> None:
        """Close the open interval and add it up (nothing when none is open)."""
        if self._open is None:
            return
        (wall0, cpu0, own0), self._open = self._open, None
        cpu1, own1 = _cpu_jiffies(), _tree_jiffies(os.getpid())
        self.loads.append(os.getloadavg()[0])
        self.wall += time.perf_counter() - wall0
        if cpu0 is None or cpu1 is None or own0 is None or own1 is None:
            self.available = False
            return
        self.busy += cpu1[0] - cpu0[0]
        self.steal += cpu1[1] - cpu0[1]
        self.total += cpu1[2] - cpu0[2]
        self.own += max(0, own1 - own0)

    def stop(self) -> dict[str, Any]:
        self.pause()
        cpus = os.cpu_count() or 1
        loads = self.loads or [os.getloadavg()[0]]
        record: dict[str, Any] = {"cpus": cpus, "wall_s": self.wall, "load_average": [round(loads[0], 2),
                                                                                      round(loads[-1], 2)]}
        if not self.available or self.total <= 0:
            return {**record, "available": False, "disturbed": False, "note": None}
        others = max(0, self.busy - self.own) / self.total
        steal = self.steal / self.total
        off = others > OTHERS_CPU_LIMIT or steal > STEAL_LIMIT
        note = (f"measurements disturbed: other processes used {others:.0%} of the CPU time ({cpus} cores) while "
                f"the engine ran" + (f", the hypervisor stole {steal:.0%}" if steal > STEAL_LIMIT else "")
                + f"; load {max(loads):.1f} on {cpus} cores — re-run on a quiet host") if off else None
        return {**record, "available": True, "others_cpu_share": round(others, 4), "steal_share": round(steal, 4),
                "own_cpu_share": round(self.own / self.total, 4), "limits": {"others_cpu_share": OTHERS_CPU_LIMIT,
                                                                             "steal_share": STEAL_LIMIT},
                "disturbed": off, "note": note}
