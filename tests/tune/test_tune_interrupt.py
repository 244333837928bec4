"""Stopping `autospec tune` and coming back (issue 17): Ctrl-C ends in one line saying how to resume, and
a resumed study fails and retries the trial a killed worker left RUNNING at once, instead of keeping it
RUNNING for ever when it is resumed within Optuna's heartbeat grace period; credentials never reach the
files autospec writes."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autospec.config import RunSpec, dump_run_spec, public_run_config, redact_url
from autospec.fit import fit_profile, write_fit
from autospec.tune import WORKER, fail_orphaned_trials, open_storage

from stage_helpers import synthetic_workload, write_synthetic_run

WORKLOAD = synthetic_workload("tune-stop", rate=40, duration_s=4, max_requests=120, prompt_tokens=64,
                              output_tokens=32)


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune-stop")
    run = write_synthetic_run(root / "profiled")
    write_fit(run, fit_profile(run))
    (root / "w.toml").write_text(WORKLOAD)
    return run, root / "w.toml"


def _args(setup, out: Path, trials: int) -> list[str]:
    run, workload = setup
    return ["--workload", str(workload), "--profile", str(run), "--out", str(out), "--trials", str(trials),
            "--strategies", "no-sd,static-k2,k-schedule", "--scope", "all", "--no-prune"]


def _study(out: Path) -> optuna.Study | None:
    journal = out / "tune" / "study.journal"
    if not journal.exists():
        return None
    try:
        storage = open_storage(str(journal))
        names = optuna.get_all_study_names(storage)
        return optuna.load_study(study_name=names[0], storage=storage) if names else None
    except Exception:  # the database is being created
        return None


def _dead_pid() -> tuple[int, str]:
    """A pid whose process has exited, with the start time it had (a worker that is gone)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    start = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    proc.wait()
    return proc.pid, start


def test_a_running_trial_of_a_dead_worker_is_failed_and_its_parameters_retried(tmp_path):
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", study_name="s")
    host = socket.gethostname()
    pid, start = _dead_pid()
    orphans = {}
    for worker in (f"{host}:{pid}:{start}", WORKER, f"elsewhere:{pid}:{start}", ""):
        study.enqueue_trial({"x": float(len(orphans))})
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 10)})
        if worker:
            trial.set_user_attr("worker", worker)
        orphans[worker] = trial.number
    failed = fail_orphaned_trials(study)
    assert failed == [orphans[f"{host}:{pid}:{start}"]]  # only the dead local worker's
    states = {t.number: t.state.name for t in study.get_trials()}
    assert states[failed[0]] == "FAIL"
    assert [states[orphans[w]] for w in (WORKER, f"elsewhere:{pid}:{start}", "")] == ["RUNNING"] * 3
    retried = [t for t in study.get_trials() if t.state.name == "WAITING"]
    assert [t.system_attrs["fixed_params"] for t in retried] == [{"x": 0.0}]


@pytest.mark.slow
def test_ctrl_c_stops_tune_with_one_line_and_the_same_command_resumes(setup, tmp_path):
    out = tmp_path / "run"
    args = [sys.executable, "-m", "autospec", "tune", *_args(setup, out, 60)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.3)
            study = _study(out)
            if study is not None and sum(t.state.name == "COMPLETE" for t in study.get_trials()) >= 2:
                os.kill(proc.pid, signal.SIGINT)
                break
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    lines = [line for line in err.splitlines() if line.strip() and not line.startswith(("tune", "["))]
    assert "Traceback" not in err
    assert any("interrupted after" in line and "re-run the same command to resume" in line for line in lines), err
    study = _study(out)
    done = sum(t.state.name in ("COMPLETE", "PRUNED") for t in study.get_trials())
    assert 2 <= done < 60 and not [t for t in study.get_trials() if t.state.name == "RUNNING"]

    resumed = subprocess.run([sys.executable, "-m", "autospec", "tune", *_args(setup, out, done + 3)],
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((out / "tune" / "summary.json").read_text())
    assert "RUNNING" not in summary["trials"] and summary["run"]["trials_total"] == done + 3


def test_storage_passwords_are_never_written():
    assert redact_url("postgresql://bob:s3cret@db:5432/optuna") == "postgresql://bob:***@db:5432/optuna"
    assert redact_url("postgresql://db/x?sslmode=require&password=s3cret") == \
        "postgresql://db/x?sslmode=require&password=***"
    assert redact_url("sqlite:////tmp/study.db") == "sqlite:////tmp/study.db"
    spec = RunSpec.model_validate({"tune": {"storage": "postgresql://bob:s3cret@db/optuna"}})
    assert "s3cret" not in dump_run_spec(spec) and "s3cret" not in json.dumps(public_run_config(spec))
    assert spec.tune.storage == "postgresql://bob:s3cret@db/optuna"  # the run itself still connects with it
