"""Progress with an ETA for the long commands, on a terminal and in CI logs; durations you can type.

`reporter(command, console)` is a context manager whose tasks advance as the work does:

* on a terminal: rich's progress bars (count, elapsed, ETA) on the console, i.e. stderr;
* otherwise (CI logs, `2> file`): one plain line per task update at most every `interval_s` seconds
  (default 10, or `$AUTOSPEC_PROGRESS_INTERVAL`), one when a task finishes and, at the end, one for
  every task left unfinished (a tune stopped by its time budget) whose last count was not printed yet:

      tune: 12/40 trials, 1m20s elapsed, ETA 3m10s
      evaluate: static-k4 (repeat 1/3) 30/60, 41s elapsed, ETA 41s

Progress never goes to stdout, so `--json` output there stays one clean object. A task's ETA is its
elapsed time per completed unit times the units left (units are trials, requests, grid shapes: each
stage's own); a task with a time budget never shows an ETA past the budget.

`parse_duration` reads `--time-budget` style durations: seconds (`90`, `1.5`) or a number with a unit
(`90s`, `20m`, `1h`, and sums such as `1h30m`).
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TextIO

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from autospec.errors import InputError

DEFAULT_INTERVAL_S = 10.0  # [chosen] often enough to plan by, rare enough not to flood a CI log
INTERVAL_ENV = "AUTOSPEC_PROGRESS_INTERVAL"

_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)\s*([hms])", re.IGNORECASE)


def parse_duration(text: str | float | int, *, option: str = "--time-budget") -> float:
    """Seconds in `text`: a plain number of seconds or `<number><s|m|h>` parts (`1h30m`); > 0."""
    if isinstance(text, bool):
        raise InputError(f"not a duration: {text!r} (use seconds, or e.g. 90s, 20m, 1h)", field=option)
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        raw = text.strip()
        try:
            seconds = float(raw)
        except ValueError:
            parts = _PART.findall(raw)
            if not parts or _PART.sub("", raw).strip():
                raise InputError(f"not a duration: {text!r} (use seconds, or e.g. 90s, 20m, 1h)",
                                 field=option) from None
            seconds = sum(float(n) * _UNIT_S[u.lower()] for n, u in parts)
    if not math.isfinite(seconds) or seconds <= 0:
        raise InputError(f"a duration must be a finite number of seconds > 0, got {text!r}", field=option)
    return seconds


def format_duration(seconds: float | None) -> str:
    """`45s`, `1m20s`, `2h05m` (whole seconds; `?` when unknown)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    s = max(0, int(round(seconds)))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


def interval_from_env(default: float = DEFAULT_INTERVAL_S) -> float:
    """`$AUTOSPEC_PROGRESS_INTERVAL` seconds between plain progress lines (0 = every update)."""
    value = os.environ.get(INTERVAL_ENV)
    if value is None or not value.strip():
        return default
    try:
        interval = float(value)
    except ValueError:
        raise InputError(f"not a number of seconds: {value!r}", field=INTERVAL_ENV) from None
    if not math.isfinite(interval) or interval < 0:
        raise InputError(f"must be >= 0 seconds, got {value!r}", field=INTERVAL_ENV)
    return interval


class Task:
    """One counted piece of work (trials, requests, grid shapes) inside a `Reporter`."""

    def __init__(self, reporter: "Reporter", label: str, total: int, unit: str, budget_s: float | None,
                 rich_id: Any):
        self.reporter, self.label, self.total, self.unit, self.budget_s = reporter, label, total, unit, budget_s
        self.done = 0
        self.baseline = 0  # units done before this run (a resumed study): not part of the rate
        self.started = reporter.clock()
        self.finished_reported = False
        self.reported_done: int | None = None  # the count of the last line printed for this task
        self._rich_id = rich_id

    def advance(self, n: Any = 1) -> None:
        """Count `n` more units; a non-integer argument (a finished request's record) counts as one."""
        self.update(self.done + (n if isinstance(n, int) and not isinstance(n, bool) else 1))

    def update(self, completed: int, total: int | None = None) -> None:
        self.reporter._update(self, completed, total)

    def start_at(self, completed: int) -> None:
        """Start the clock now with `completed` units already done before this run."""
        self.reporter._update(self, completed, None, quiet=True)
        self.baseline, self.started = self.done, self.reporter.clock()

    def eta_s(self, now: float) -> float | None:
        elapsed = now - self.started
        if self.done >= self.total:
            return 0.0
        ran = self.done - self.baseline
        eta = elapsed / ran * (self.total - self.done) if ran > 0 else None
        if self.budget_s is not None:
            left = max(0.0, self.budget_s - elapsed)
            eta = left if eta is None else min(eta, left)
        return eta

    def line(self, now: float) -> str:
        counts = f"{self.done}/{self.total}" + (f" {self.unit}" if self.unit else "")
        what = f"{self.label} {counts}" if self.label else counts
        return (f"{self.reporter.command}: {what}, {format_duration(now - self.started)} elapsed, "
                f"ETA {format_duration(self.eta_s(now))}")


class Reporter:
    """Tasks of one command; see the module docstring for what is shown where."""

    def __init__(self, command: str, *, terminal: bool, stream: TextIO | None = None, console=None,
                 interval_s: float | None = None, plain: bool = True,
                 clock: Callable[[], float] = time.monotonic):
        self.command = command
        self.stream = stream
        self.interval_s = interval_from_env() if interval_s is None else interval_s
        self.plain = plain and not terminal  # plain lines only where no live display can be drawn
        self.clock = clock
        self.tasks: list[Task] = []
        self._last_line = -math.inf
        self._lock = threading.Lock()  # optuna callbacks or the telemetry thread may report concurrently
        self._rich = None
        if terminal and console is not None:
            self._rich = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TimeElapsedColumn(), TextColumn("ETA"), TimeRemainingColumn(), console=console)

    # -- tasks ----------------------------------------------------------------------------------------

    def task(self, label: str = "", total: int = 1, *, unit: str = "", budget_s: float | None = None) -> Task:
        rich_id = None
        if self._rich is not None:
            rich_id = self._rich.add_task(" ".join(p for p in (label, unit) if p) or self.command, total=total)
        t = Task(self, label, max(int(total), 0), unit, budget_s, rich_id)
        with self._lock:
            self.tasks.append(t)
        return t

    def track(self, label: str, total: int) -> Callable[..., None]:
        """The stages' progress protocol: `progress(label, total)` returns an advance callback."""
        return self.task(label, total).advance

    def _update(self, task: Task, completed: int, total: int | None, quiet: bool = False) -> None:
        with self._lock:
            if total is not None:
                task.total = max(int(total), 0)
            task.done = max(0, int(completed))
            if self._rich is not None:
                self._rich.update(task._rich_id, completed=task.done, total=task.total)
            if quiet or not self.plain:
                return
            now = self.clock()
            finished = task.done >= task.total
            if finished and not task.finished_reported:
                task.finished_reported = True
                self._emit(task, now)
            elif not finished and now - self._last_line >= self.interval_s:
                self._emit(task, now)

    def _emit(self, task: Task, now: float) -> None:
        self._last_line = now
        task.reported_done = task.done
        stream = self.stream or sys.stderr
        stream.write(task.line(now) + "\n")
        stream.flush()

    # -- lifetime -------------------------------------------------------------------------------------

    def start(self) -> "Reporter":
        if self._rich is not None:
            self._rich.start()
        return self

    def stop(self, completed: bool = True) -> None:
        """End the display; after a normal end, a last line for every task still unfinished."""
        if self._rich is not None:
            self._rich.stop()
        if not (self.plain and completed):
            return  # after an error the one-line error message stays the last word
        with self._lock:
            now = self.clock()
            for task in self.tasks:
                if not task.finished_reported and task.done < task.total and task.reported_done != task.done:
                    task.finished_reported = True
                    self._emit(task, now)


@contextmanager
def reporter(command: str, console, *, plain: bool = True, interval_s: float | None = None) -> Iterator[Reporter]:
    """Progress for `command` on `console` (the CLI's stderr console): rich bars on a terminal, plain
    lines otherwise (`plain=False`: nothing off a terminal, for commands that are short there)."""
    rep = Reporter(command, terminal=console.is_terminal, console=console, interval_s=interval_s, plain=plain)
    # plain lines go to the console's file, resolved now: stderr (a test runner's capture included)
    rep.stream = console.file
    rep.start()
    try:
        yield rep
    except BaseException:
        rep.stop(completed=False)
        raise
    rep.stop()
