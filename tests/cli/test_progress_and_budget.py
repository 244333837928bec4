"""Progress lines with an ETA off a terminal (autospec.progress), and `--time-budget` on tune and run."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.errors import InputError
from autospec.fit import fit_profile, write_fit
from autospec.progress import Reporter, format_duration, parse_duration

from stage_helpers import synthetic_workload, write_synthetic_run

LINE = re.compile(r"^tune: (\d+)/(\d+) trials, \S+ elapsed, ETA \S+$")
FEW = "no-sd,static-k2,k-schedule,static-k4"  # all deployable on vLLM: tune's default --scope engine
ASKED = 2000  # far more trials than a 1 s budget can hold: each is a simulated replay + a database commit


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_plain_lines_are_throttled_carry_an_eta_and_end_with_a_last_line():
    clock, stream = FakeClock(), io.StringIO()
    rep = Reporter("tune", terminal=False, stream=stream, interval_s=10.0, clock=clock).start()
    task = rep.task(total=40, unit="trials")
    for done in range(1, 13):  # a trial every 2 s, so a line at most every 10 s: 1st, 6th, 11th trial
        clock.now += 2.0
        task.update(done)
    assert stream.getvalue().splitlines() == [
        "tune: 1/40 trials, 2s elapsed, ETA 1m18s",
        "tune: 6/40 trials, 12s elapsed, ETA 1m08s",
        "tune: 11/40 trials, 22s elapsed, ETA 58s",
    ]
    rep.stop()  # the end: the unfinished task's state, although the interval has not passed
    assert stream.getvalue().splitlines()[-1] == "tune: 12/40 trials, 24s elapsed, ETA 56s"


def test_a_finished_task_reports_at_once_and_a_budget_caps_the_eta():
    clock, stream = FakeClock(), io.StringIO()
    rep = Reporter("evaluate", terminal=False, stream=stream, interval_s=1e9, clock=clock).start()
    advance = rep.track("no-sd (repeat 1/1)", 3)
    clock.now = 1.0
    advance(object())  # a finished request's record counts as one
    clock.now = 3.0
    advance()
    advance()
    budgeted = rep.task(total=100, unit="trials", budget_s=30.0)
    clock.now = 13.0
    budgeted.update(1)  # 10 s per trial says 16m30s, but the budget ends in 20 s
    rep.stop()
    assert stream.getvalue().splitlines() == [
        "evaluate: no-sd (repeat 1/1) 1/3, 1s elapsed, ETA 2s",
        "evaluate: no-sd (repeat 1/1) 3/3, 3s elapsed, ETA 0s",
        "evaluate: 1/100 trials, 10s elapsed, ETA 20s",
    ]


def test_after_an_error_no_progress_line_follows():
    clock, stream = FakeClock(), io.StringIO()
    rep = Reporter("profile", terminal=False, stream=stream, interval_s=1e9, clock=clock).start()
    rep.track("latency grid", 10)(1)
    before = stream.getvalue()
    rep.stop(completed=False)
    assert stream.getvalue() == before


def test_resumed_work_is_not_counted_in_the_rate():
    clock, stream = FakeClock(), io.StringIO()
    rep = Reporter("tune", terminal=False, stream=stream, interval_s=0.0, clock=clock).start()
    task = rep.task(total=40, unit="trials")
    task.start_at(30)  # 30 trials were in the study already
    clock.now = 5.0
    task.update(31)
    assert stream.getvalue().splitlines() == ["tune: 31/40 trials, 5s elapsed, ETA 45s"]
    clock.now = 6.0
    rep.stop()  # that count was just printed: the end adds no second line for it
    assert stream.getvalue().splitlines() == ["tune: 31/40 trials, 5s elapsed, ETA 45s"]


@pytest.mark.parametrize("text, seconds", [("90", 90.0), ("1.5", 1.5), ("90s", 90.0), ("20m", 1200.0),
                                           ("1h", 3600.0), ("1h30m", 5400.0), ("2M", 120.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "10x", "5s5", "0", "-3", "0s", "inf", "nan", "m"])
def test_bad_durations_are_input_errors(text):
    with pytest.raises(InputError) as exc:
        parse_duration(text)
    assert "--time-budget" in exc.value.one_line()


def test_format_duration():
    assert [format_duration(s) for s in (0, 45, 80, 190, 7500, None)] == ["0s", "45s", "1m20s", "3m10s",
                                                                          "2h05m", "?"]


# --- the commands ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def profiled(tmp_path_factory):
    root = tmp_path_factory.mktemp("budget")
    run = write_synthetic_run(root / "profiled")
    write_fit(run, fit_profile(run))
    workload = root / "w.toml"
    workload.write_text(synthetic_workload("budget-test", rate=40, duration_s=2, max_requests=60,
                                           prompt_tokens=64, output_tokens=24))
    return run, workload


def _cli(*args: str) -> subprocess.CompletedProcess:
    # a real process: stderr is a pipe (not a terminal), as in CI; every update prints (interval 0)
    return subprocess.run([sys.executable, "-m", "autospec", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "AUTOSPEC_PROGRESS_INTERVAL": "0", "COLUMNS": "200"})


def test_tune_stops_at_its_time_budget_with_progress_on_stderr_and_clean_json(profiled, tmp_path):
    run, workload = profiled
    res = _cli("tune", "--workload", str(workload), "--profile", str(run), "--out", str(tmp_path / "t"),
               "--trials", str(ASKED), "--strategies", FEW, "--slo-ttft", "0.5", "--slo-tpot", "0.02",
               "--time-budget", "1s", "--json")
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads(res.stdout)  # stdout is the one JSON object, nothing else
    budget = summary["run"]
    assert budget["time_budget_s"] == 1.0 and budget["budget_spent"] is True
    assert 1 <= budget["trials_run"] < ASKED and budget["trials_total"] == budget["trials_run"]
    lines = [line for line in res.stderr.splitlines() if line.startswith("tune: ")]
    assert lines and all(LINE.match(line) for line in lines), res.stderr
    counts = [int(LINE.match(line).group(1)) for line in lines]
    assert counts == sorted(counts) and counts[-1] == budget["trials_total"]
    assert all(int(LINE.match(line).group(2)) == ASKED for line in lines)


def test_tune_prints_how_many_trials_ran_within_the_budget(profiled, tmp_path):
    run, workload = profiled
    res = _cli("tune", "--workload", str(workload), "--profile", str(run), "--out", str(tmp_path / "t"),
               "--trials", str(ASKED), "--strategies", FEW, "--time-budget", "1")
    assert res.returncode == 0, res.stderr[-3000:]
    trials = json.loads((tmp_path / "t" / "tune" / "summary.json").read_text())["run"]["trials_run"]
    assert re.search(rf"time budget 1s: {trials} trials? ran within it, then it was spent", res.stdout), res.stdout


def test_run_applies_the_budget_to_its_tune_stage_and_records_it(profiled, tmp_path):
    run, workload = profiled
    out = tmp_path / "run"
    for part in ("profile", "fit"):  # a profiled + fitted run directory, tuned by `run`
        shutil.copytree(run / part, out / part)
    config = tmp_path / "c.toml"
    # confirm_top = 0: the budget bounds the search; the confirmation after it (run's default, 2 candidates on
    # the torch engine, ~40 s) is tested in tests/tune/test_confirm.py
    config.write_text(f'stages = ["tune"]\nworkload = "{workload}"\n[tune]\ntrials = {ASKED}\nconfirm_top = 0\n'
                      f'strategies = {json.dumps(FEW.split(","))}\n')
    res = CliRunner().invoke(app, ["run", str(config), "--out", str(out), "--time-budget", "1s", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["tune"]["run"]["budget_spent"] is True
    recorded = tomllib.loads((out / "config.toml").read_text())
    assert recorded["tune"]["time_budget"] == 1.0
    assert json.loads((out / "manifest.json").read_text())["config"]["tune"]["time_budget"] == 1.0


def test_bad_budgets_are_one_line_and_exit_2(profiled, tmp_path):
    run, workload = profiled
    runner = CliRunner()
    for args in (["tune", "--workload", str(workload), "--profile", str(run), "--out", str(tmp_path / "t"),
                  "--time-budget", "10x"],
                 ["run", "--out", str(tmp_path / "r"), "--time-budget", "0"]):
        res = runner.invoke(app, args)
        assert res.exit_code == 2, res.output
        assert res.stderr.count("\n") == 1 and res.stderr.startswith("error:") and "--time-budget" in res.stderr
    config = tmp_path / "c.toml"
    config.write_text('[tune]\ntime_budget = "soon"\n')
    res = runner.invoke(app, ["run", str(config), "--out", str(tmp_path / "r")])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and "tune.time_budget" in res.stderr, res.output
    assert not (tmp_path / "t").exists() and not (tmp_path / "r").exists()
