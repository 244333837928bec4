"""A busy host is noticed (issue 17): `telemetry.HostLoadMeter` counts the CPU other processes take while a
real engine runs, and a torch replay beside one CPU-bound process per core is flagged in its summary, its
report and by `autospec gate`. The assertions are about CPU accounting with the host fully occupied by
the test's own busy loops, never about how fast anything ran."""

from __future__ import annotations

import json
import multiprocessing
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autospec.cli import main
from autospec.telemetry import OTHERS_CPU_LIMIT, HostLoadMeter

REPO = Path(__file__).resolve().parents[2]
CI_PROFILE = REPO / "reports" / "ci-profile"
SPIN_S = 1.5


def neighbours(n: int, seconds: float) -> list[int]:
    """`n` busy loops that are not this process's children — started by a shell subshell that exits at
    once, so they are reparented — as a neighbour's work would be; each stops by itself after `seconds`.
    Returns their pids (HostLoadMeter counts our own process tree, children included, as ours)."""
    marker = f"autospec-test-busy-{os.getpid()}-{time.monotonic_ns()}"
    script = f"import time\nend = time.perf_counter() + {seconds}\nwhile time.perf_counter() < end: pass\n"
    subprocess.run(["sh", "-c", "; ".join(f"({sys.executable} -c {shlex.quote(script)} {marker} &)"
                                          for _ in range(n))], timeout=30, check=True)
    time.sleep(0.3)
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    assert len(found) == n, found
    return found


def stop(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_cpu_taken_by_other_processes_marks_a_run_disturbed():
    pids = neighbours(os.cpu_count() or 1, SPIN_S + 2)
    try:
        meter = HostLoadMeter.start()
        time.sleep(SPIN_S)
        record = meter.stop()
    finally:
        stop(pids)
    assert record["available"] and record["others_cpu_share"] > OTHERS_CPU_LIMIT, record
    assert record["disturbed"] and "other processes used" in record["note"]


def test_cpu_our_own_children_take_is_ours_not_a_neighbours():
    meter = HostLoadMeter.start()
    child = multiprocessing.get_context("spawn").Process(target=_spin, args=(SPIN_S,))
    child.start()
    child.join()
    record = meter.stop()
    assert record["own_cpu_share"] > record["others_cpu_share"], record


def test_a_meter_counts_only_the_intervals_it_ran():
    """vLLM replays measure each run while its engine is alive (pause between runs): busy neighbours while
    the meter is paused are not counted, busy neighbours while it runs are."""
    meter = HostLoadMeter()
    assert meter.stop()["available"] is False  # never ran: nothing measured, nothing flagged
    meter = HostLoadMeter()
    meter.resume()
    time.sleep(0.5)
    meter.pause()
    pids = neighbours(os.cpu_count() or 1, SPIN_S + 1)
    try:
        time.sleep(SPIN_S)  # paused: this CPU is not the run's business
    finally:
        stop(pids)
    meter.resume()
    time.sleep(0.5)
    record = meter.stop()
    assert record["available"] and not record["disturbed"], record
    assert record["wall_s"] < SPIN_S, record  # the paused time is not in the run's wall either

    meter = HostLoadMeter()
    pids = neighbours(os.cpu_count() or 1, SPIN_S + 2)
    try:
        meter.resume()
        time.sleep(SPIN_S)
        meter.pause()
    finally:
        stop(pids)
    record = meter.stop()
    assert record["disturbed"] and record["others_cpu_share"] > OTHERS_CPU_LIMIT, record


@pytest.mark.slow
def test_a_torch_replay_beside_busy_processes_is_flagged_everywhere(tmp_path, capsys):
    (tmp_path / "w.toml").write_text('[workload]\nname = "busy"\nformat = "synthetic"\ngenerator = "poisson"\n'
                                     "rate = 4.0\nduration_s = 3.0\nmax_requests = 10\nmean_prompt_tokens = 64\n"
                                     "mean_output_tokens = 16\nmax_prompt_tokens = 128\nmax_output_tokens = 32\n")
    pids = neighbours(os.cpu_count() or 1, 600)
    try:
        rc = main(["evaluate", "--workload", str(tmp_path / "w.toml"), "--strategies", "static-k2", "--engine",
                   "torch", "--profile", str(CI_PROFILE), "--out", str(tmp_path / "run"), "--no-capacity",
                   "--no-shift"])
    finally:
        stop(pids)
    out = capsys.readouterr().out
    assert rc == 0
    summary = json.loads((tmp_path / "run" / "eval" / "summary.json").read_text())
    assert summary["disturbed"] and summary["host_load"]["disturbed"], summary["host_load"]
    assert "measurements disturbed" in out
    assert main(["report", str(tmp_path / "run")]) == 0
    assert "measurements disturbed" in (tmp_path / "run" / "report.html").read_text()
    capsys.readouterr()
    assert main(["gate", "--baseline", str(tmp_path / "run"), "--candidate", str(tmp_path / "run")]) == 2
    assert "disturbed host" in capsys.readouterr().err
