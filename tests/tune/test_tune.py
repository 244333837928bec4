"""`autospec tune` and `deploy/`: artifacts, resume, SIGKILL safety, two workers on one PostgreSQL
study, deployable configs, bad input. Trials run on the simulator over a synthetic profile."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import optuna
import pandas as pd
import pytest

from autospec.config import PairSpec
from autospec.deploy import CONFIG_FILE, STRATEGY_FILE, vllm_form, write_deploy
from autospec.fit import fit_profile, write_fit
from autospec.strategy import StrategySpec, apply_overrides, load_preset
from autospec.tune import named_by_its_k, open_storage

from stage_helpers import synthetic_workload, write_synthetic_run

WORKLOAD = synthetic_workload("tune-test", rate=40, duration_s=2, max_requests=60, prompt_tokens=64,
                              output_tokens=24)
FEW = "no-sd,static-k2,k-schedule,lp-sjf"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("tune")
    run = write_synthetic_run(root / "profiled")
    write_fit(run, fit_profile(run))
    workload = root / "w.toml"
    workload.write_text(WORKLOAD)
    return run, workload


def tune_cli(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autospec", "tune", *args], capture_output=True, text=True,
                          timeout=600, **kwargs)


def base_args(setup, out: Path, trials: int, *extra: str) -> list[str]:
    run, workload = setup
    return ["--workload", str(workload), "--profile", str(run), "--out", str(out), "--trials", str(trials),
            "--strategies", FEW, "--scope", "all", "--slo-ttft", "0.5", "--slo-tpot", "0.02", *extra]


def study_of(out: Path) -> optuna.Study:
    summary = json.loads((out / "tune" / "summary.json").read_text())
    return optuna.load_study(study_name=summary["study_name"], storage=open_storage(summary["storage"]))


def test_tune_writes_every_artifact_and_resumes(setup, tmp_path):
    out = tmp_path / "run"
    first = tune_cli(*base_args(setup, out, 6), "--json")
    assert first.returncode == 0, first.stderr
    summary = json.loads(first.stdout)
    for name in ("best.toml", "trials.parquet", "summary.json", "study.journal"):
        assert (out / "tune" / name).is_file(), name
    for name in (STRATEGY_FILE, CONFIG_FILE, "README.md"):
        assert (out / "deploy" / name).is_file(), name
    trials = pd.read_parquet(out / "tune" / "trials.parquet")
    assert len(trials) == 6 and set(trials["params_strategy"]) <= set(FEW.split(","))
    # the first trials are the candidates at their preset values, in order
    assert list(trials["params_strategy"][:4]) == FEW.split(",")
    best = load_preset(out / "tune" / "best.toml")  # a loadable preset
    assert best.name == summary["best"]["name"]
    done = trials["value"].dropna()
    feasible = trials[trials["feasible"]]
    expected = feasible["value"].max() if len(feasible) else None
    if expected is not None:
        assert summary["best"]["value"] == pytest.approx(expected)
    assert summary["best"]["value"] <= done.max() + 1e-12

    # the same command continues the same study up to the new total; nothing is re-run
    again = tune_cli(*base_args(setup, out, 9), "--json")
    assert again.returncode == 0, again.stderr
    trials2 = pd.read_parquet(out / "tune" / "trials.parquet")
    assert len(trials2) == 9
    pd.testing.assert_series_equal(trials2["value"][:6], trials["value"], check_names=False)


def test_jobs_share_the_study_between_processes(setup, tmp_path):
    """--jobs 2: a helper process and the tune process split the trials on the default journal storage —
    exactly --trials counted trials, every number once, both processes ran some, nothing left RUNNING."""
    out = tmp_path / "run"
    result = tune_cli(*base_args(setup, out, 12, "--no-prune", "--jobs", "2"), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["run"]["jobs"] == 2 and summary["run"]["helpers_failed"] == []
    trials = study_of(out).get_trials(deepcopy=False)
    assert sorted(t.number for t in trials) == list(range(len(trials)))
    assert [t.state.name for t in trials].count("COMPLETE") == 12 == len(trials)
    workers = {t.user_attrs["worker"] for t in trials}
    assert len(workers) == 2 and str(os.getpid()) not in {w.split(":")[1] for w in workers}
    # the candidates' defaults were each run once, by one process or the other
    assert sorted(t.params["strategy"] for t in trials[:4]) == sorted(FEW.split(","))


def test_sigkill_mid_study_loses_no_completed_trial(setup, tmp_path):
    out = tmp_path / "run"
    args = base_args(setup, out, 40, "--no-prune")
    proc = subprocess.Popen([sys.executable, "-m", "autospec", "tune", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    journal = out / "tune" / "study.journal"
    completed: dict[int, float] = {}
    deadline = time.time() + 300
    try:
        while time.time() < deadline and proc.poll() is None:
            time.sleep(0.5)
            if not journal.exists():
                continue
            try:
                storage = open_storage(str(journal))
                names = optuna.get_all_study_names(storage)
                if not names:
                    continue
                study = optuna.load_study(study_name=names[0], storage=storage)
                done = [t for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
            except Exception:  # the database is being created
                continue
            if len(done) >= 4:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                break
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == -signal.SIGKILL, "tune finished before it could be killed"
    storage = open_storage(str(journal))
    study = optuna.load_study(study_name=optuna.get_all_study_names(storage)[0], storage=storage)
    completed = {t.number: t.value for t in study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"}
    assert len(completed) >= 4

    resumed = tune_cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    after = {t.number: t for t in study_of(out).get_trials(deepcopy=False)}
    for number, value in completed.items():
        assert after[number].state.name == "COMPLETE" and after[number].value == value
    assert sum(t.state.name in ("COMPLETE", "PRUNED") for t in after.values()) >= 40


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for root in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (root / name).is_file():
            return str(root / name)
    return None


@pytest.fixture
def postgres():
    """A throwaway PostgreSQL server (Debian's postgresql; .ci/run installs it), as the postgres user
    when running as root (the server refuses root)."""
    initdb, pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) are not installed")
    # pytest's tmp_path is private to root; the server's user needs its own folder it can reach
    base = Path(tempfile.mkdtemp(prefix="autospec-pg-"))
    data, sock = base / "pgdata", base / "pgsock"
    sock.mkdir()
    as_user: list[str] = []
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        for path in (base, sock):
            shutil.chown(path, "postgres")
    port = _free_port()
    try:
        subprocess.run([*as_user, initdb, "-D", str(data), "-U", "postgres", "--auth=trust"], check=True,
                       capture_output=True)
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-w", "-l", str(base / "pg.log"), "-o",
                        f"-p {port} -k {sock} -c listen_addresses=127.0.0.1", "start"], check=True,
                       capture_output=True)
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


@pytest.mark.slow
def test_two_workers_share_one_postgresql_study(setup, tmp_path, postgres):
    trials = 24
    workers = [subprocess.Popen([sys.executable, "-m", "autospec", "tune",
                                 *base_args(setup, tmp_path / f"w{i}", trials, "--storage", postgres,
                                            "--study-name", "shared", "--no-prune")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for i in range(2)]
    errors = [w.communicate(timeout=600)[1] for w in workers]
    assert [w.returncode for w in workers] == [0, 0], [e[-2000:] for e in errors]
    study = optuna.load_study(study_name="shared", storage=postgres)
    all_trials = study.get_trials(deepcopy=False)
    numbers = [t.number for t in all_trials]
    assert sorted(numbers) == list(range(len(numbers)))  # every trial exactly once
    assert len({t._trial_id for t in all_trials}) == len(all_trials)
    done = [t for t in all_trials if t.state.name == "COMPLETE"]
    assert trials <= len(done) <= trials + 1  # MaxTrialsCallback: a racing worker may add one
    assert len({t.user_attrs["worker"] for t in all_trials}) == 2  # both workers ran trials
    # and both summaries name the same study
    starts = {json.loads((tmp_path / f"w{i}" / "tune" / "summary.json").read_text())["study_name"] for i in range(2)}
    assert starts == {"shared"}
    assert all(t.state.name in ("COMPLETE", "PRUNED") for t in all_trials)


def test_deploy_configs_for_schedule_static_and_unsupported(tmp_path):
    pair = PairSpec()
    sched = apply_overrides(load_preset("k-schedule"), {"length.k": [5, 4, 3, 2, 2, 1, 1]})
    form, rows = vllm_form(sched, max_batch=8)
    assert form.length.policy == "static" and rows == [(1, 1, 5), (2, 2, 4), (3, 4, 3), (5, 8, 2)]
    info = write_deploy(tmp_path / "a", sched, pair, 8, validate=False)
    cfg = json.loads((tmp_path / "a" / CONFIG_FILE).read_text())
    assert info["vllm_supported"] is True
    assert cfg == {"method": "draft_model", "model": str(pair.draft), "num_speculative_tokens": 5,
                   "num_speculative_tokens_per_batch_size": [[1, 1, 5], [2, 2, 4], [3, 4, 3], [5, 8, 2]],
                   "draft_sample_method": "greedy"}
    assert load_preset(tmp_path / "a" / STRATEGY_FILE) == sched

    zero = apply_overrides(load_preset("k-schedule"), {"length.k": [0] * 7})
    write_deploy(tmp_path / "z", zero, pair, 8, validate=False)
    assert json.loads((tmp_path / "z" / CONFIG_FILE).read_text()) == {}  # no SD: start vLLM without one

    info = write_deploy(tmp_path / "b", load_preset("adaspec"), pair, 8, validate=False)
    bad = json.loads((tmp_path / "b" / CONFIG_FILE).read_text())
    assert info["vllm_supported"] is False and bad["supported"] is False
    assert "adaspec" in bad["notes"][0] and set(bad) == {"supported", "strategy", "notes"}
    assert "not expressible" in (tmp_path / "b" / "README.md").read_text()


@pytest.mark.parametrize("case", ["unknown-strategy", "empty-space", "bad-storage", "missing-profile", "oracle"])
def test_bad_input_is_one_line_and_exit_2(setup, tmp_path, case):
    run, workload = setup
    out = tmp_path / "out"
    args = {"unknown-strategy": ["--strategies", "static-k2,no-such-policy"],
            "empty-space": ["--strategies", " , "],
            "bad-storage": ["--storage", "notadb://nowhere/x", "--strategies", "static-k2"],
            "missing-profile": ["--strategies", "static-k2"],
            "oracle": ["--strategies", "oracle"]}[case]
    profile = tmp_path / "nope" if case == "missing-profile" else run
    res = tune_cli("--workload", str(workload), "--profile", str(profile), "--out", str(out), "--trials", "2", *args)
    assert res.returncode == 2, res.stderr
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "Traceback" not in res.stderr
    assert not (out / "tune" / "summary.json").exists() and not (out / "deploy").exists()


def test_opening_a_fresh_shared_storage_retries_the_table_creation_race(tmp_path, monkeypatch):
    """Workers started together on an empty database race to create Optuna's tables; PostgreSQL
    reports the loser's CREATE TABLE as "already exists" (a ProgrammingError). The loser retries and
    opens the tables the winner made; any other ProgrammingError is a one-line InputError."""
    from sqlalchemy.exc import ProgrammingError

    import autospec.tune as tune_module
    from autospec.errors import InputError

    real = optuna.storages.RDBStorage
    calls = []

    class Racing(real):  # a subclass: Optuna checks isinstance(storage, RDBStorage)
        def __init__(self, url, **kwargs):
            calls.append(url)
            if len(calls) == 1:
                raise ProgrammingError("CREATE TABLE studies", {}, Exception('relation "studies" already exists'))
            super().__init__(url, **kwargs)

    monkeypatch.setattr(optuna.storages, "RDBStorage", Racing)
    monkeypatch.setattr(tune_module.time, "sleep", lambda s: None)
    spec = tune_module.TuneSpec(workload=tmp_path / "w.toml", profile=tmp_path, study_name="race",
                                storage=f"sqlite:///{tmp_path / 'race.db'}")
    study = tune_module.open_study(spec, tmp_path, {})
    assert len(calls) == 2 and study.study_name == "race"

    def broken(url, **kwargs):
        raise ProgrammingError("SELECT", {}, Exception("permission denied for table studies"))

    monkeypatch.setattr(optuna.storages, "RDBStorage", broken)
    with pytest.raises(InputError, match="cannot open the Optuna storage: .*permission denied"):
        tune_module.open_study(spec, tmp_path / "other", {})


def test_a_trial_that_moves_a_static_presets_k_is_named_by_its_k(tmp_path):
    """static-k4 searched to K = 2 is static-k2, with its description; the trial's own execution knobs stay.
    A static preset of the user's, or one whose other sections differ from the bundled static-kN's, keeps
    its name (only the bundled naming says what K a name means)."""
    static = load_preset("static-k4")
    moved = named_by_its_k(apply_overrides(static, {"length.k": 2, "execution.sm_split": 0.3}))
    assert moved.name == "static-k2" and moved.strategy == load_preset("static-k2").strategy
    assert moved.length.params["k"] == 2 and moved.execution.sm_split == 0.3
    assert named_by_its_k(apply_overrides(static, {"length.k": 4})).name == "static-k4"
    mine = static.model_copy(update={"strategy": static.strategy.model_copy(update={"name": "my-static"})})
    assert named_by_its_k(apply_overrides(mine, {"length.k": 2})).name == "my-static"
    dspark = apply_overrides(static, {"length.k": 2, "verify.policy": "dspark", "execution.draft_sampling": "greedy"})
    assert named_by_its_k(dspark).name == "static-k4"


def test_scope_engine_searches_what_vllm_runs_and_deploys_the_best_deployable(setup, tmp_path):
    """--scope engine (the default) drops what vLLM cannot run and refuses it by name; --scope all may
    find a better scheduler, but deploy/ still holds the best trial vLLM can run, and the sweep of
    static-k4's K means no static K is left untried."""
    run, workload = setup
    common = ["--workload", str(workload), "--profile", str(run), "--slo-ttft", "0.5", "--slo-tpot", "0.02"]
    refused = tune_cli(*common, "--out", str(tmp_path / "r"), "--trials", "2", "--strategies", "static-k4,lp-sjf")
    assert refused.returncode == 2 and "lp-sjf" in refused.stderr and "--scope all" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1

    out = tmp_path / "all"
    res = tune_cli(*common, "--out", str(out), "--trials", "12", "--strategies", "lp-sjf,static-k4",
                   "--scope", "all", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    trials = pd.read_parquet(out / "tune" / "trials.parquet")
    ks = set(trials.loc[trials["params_strategy"] == "static-k4", "params_static-k4.length.k"].astype(int))
    assert ks == set(range(1, 9))  # every static K was tried
    deployable = summary["best_deployable"]
    assert deployable["strategy"] == "static-k4" and summary["deploy"]["strategy"] == deployable["name"]
    assert summary["deploy"]["vllm_supported"] is True
    static = trials[(trials["params_strategy"] == "static-k4") & trials["feasible"]]
    assert deployable["value"] == pytest.approx(static["value"].max())  # the best static K found
    k = deployable["params"]["static-k4.length.k"]
    assert json.loads((out / "deploy" / CONFIG_FILE).read_text())["num_speculative_tokens"] == k
    assert deployable["name"].endswith(f"-static-k{k}")  # named by the K it deploys, not by static-k4
    named = {StrategySpec.model_validate(t.user_attrs["spec"]).name for t in study_of(out).trials
             if t.params.get("strategy") == "static-k4"}
    assert named == {f"static-k{k}" for k in range(1, 9)}
    if summary["best"]["number"] != deployable["number"]:  # a scheduler won: named, not deployed
        assert summary["best"]["strategy"] == "lp-sjf"
        assert "not deployable on vLLM" in summary["deploy"]["notes"][0]


@pytest.mark.parametrize("case", ["a-folder", "no-folder", "not-a-journal", "deep-json"])
def test_a_bad_journal_storage_is_one_line(tmp_path, case):
    """--storage naming a file that cannot be Optuna's journal: one line naming it, nothing else."""
    from autospec.errors import InputError
    from autospec.tune import open_storage

    path = {"a-folder": tmp_path, "no-folder": tmp_path / "nowhere" / "s.journal"}.get(case, tmp_path / "s.journal")
    if case == "not-a-journal":
        path.write_text("garbage\nmore garbage\n")
    elif case == "deep-json":
        path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(InputError, match="journal") as err:
        open_storage(str(path))
    assert "\n" not in str(err.value) and err.value.field == "storage"


def test_when_no_trial_meets_the_slo_the_closest_is_best_and_one_line_says_so(tmp_path):
    """Under the capacity objective every infeasible trial has constraint 1.0 and capacity 0, so trial
    order decided the 'best'; the attainment each capacity search reached ranks them instead."""
    from autospec.tune import TuneSpec, none_feasible, ranked_trials

    spec = TuneSpec(workload=tmp_path / "w.toml", profile=tmp_path, objective="capacity")
    study = optuna.create_study(direction="maximize")
    for number, (scale, reached) in enumerate([(0.125, 0.40), (0.125, 0.70), (0.0625, 0.55)]):
        study.add_trial(optuna.trial.create_trial(
            params={"strategy": f"s{number}"}, distributions={"strategy": optuna.distributions.CategoricalDistribution(
                ["s0", "s1", "s2"])}, value=0.0,
            user_attrs={"constraint": [1.0], "capacity_best_attainment": [scale, reached]}))
    ranked = ranked_trials(study, spec)
    assert [t.number for t in ranked] == [1, 2, 0]
    line = none_feasible(ranked[0], spec, "tuned-s1")
    assert line.startswith("no configuration meets the SLO") and "capacity at the SLO 0 req/s" in line
    assert "tuned-s1 (trial 1), reached 70.0% SLO attainment at 0.125x the workload's rate" in line
    study.add_trial(optuna.trial.create_trial(
        params={"strategy": "s0"}, distributions={"strategy": optuna.distributions.CategoricalDistribution(
            ["s0", "s1", "s2"])}, value=1.5, user_attrs={"constraint": [0.0]}))
    best = ranked_trials(study, spec)[0]
    assert best.number == 3 and none_feasible(best, spec, "tuned-s0") is None
    # a trial that met the SLO for no request at any load names no load (the max over zeros is arbitrary)
    nowhere = optuna.trial.create_trial(params={}, distributions={}, value=0.0,
                                        user_attrs={"constraint": [1.0], "capacity_best_attainment": [1.0, 0.0]})
    assert none_feasible(nowhere, spec, "tuned-s0").endswith("reached 0% SLO attainment at every load searched")
    # goodput replays only the workload's own rate: its line claims no capacity and no other load
    goodput = TuneSpec(workload=tmp_path / "w.toml", profile=tmp_path, objective="goodput")
    short = optuna.trial.create_trial(params={}, distributions={}, value=0.0, user_attrs={"constraint": [0.3]})
    line = none_feasible(short, goodput, "tuned-s0")
    assert line.endswith("at the workload's rate; the closest, tuned-s0 (trial -1), reached 60.0% SLO attainment")
    assert "capacity" not in line and "any load" not in line


def test_a_strategy_drawn_again_takes_its_earlier_trials_numbers_without_a_replay(setup, tmp_path, monkeypatch):
    """no-sd and static-k4's eight Ks are nine strategies: the three trials past them can only draw one of
    them again. Those are scored from the trial that ran it (`same_as`), with no replay, and the numbers
    are the ones a fresh capacity search of that strategy finds (the replay is seeded and deterministic)."""
    import autospec.tune as tune_module
    from autospec.serving.capacity import CapacitySpec, replay_capacity

    run, workload = setup
    replayed: list[str] = []
    real_run_trial = tune_module.run_trial

    def counted(spec, replay, strategy, on_finish=None):
        replayed.append(strategy.name)
        return real_run_trial(spec, replay, strategy, on_finish=on_finish)

    monkeypatch.setattr(tune_module, "run_trial", counted)
    spec = tune_module.TuneSpec(workload=workload, profile=run, trials=12, strategies=["no-sd", "static-k4"],
                                slo={"ttft_s": 0.5, "tpot_s": 0.02})
    summary = tune_module.run_tune(spec, tmp_path / "run")
    assert summary["run"]["trials_total"] == 12
    assert sorted(replayed) == sorted(["no-sd"] + [f"static-k{k}" for k in range(1, 9)])  # each strategy once

    trials = study_of(tmp_path / "run").get_trials(deepcopy=False)
    repeats = [t for t in trials if "same_as" in t.user_attrs]
    assert len(repeats) == 3 and all(t.number >= 9 for t in repeats)
    replay = tune_module.open_replay(spec)
    for repeat in repeats:
        first = trials[repeat.user_attrs["same_as"]]
        assert "same_as" not in first.user_attrs and first.user_attrs["spec"] == repeat.user_attrs["spec"]
        assert repeat.value == first.value
        assert repeat.constraints == first.constraints
        for key in ("constraint", "capacity_rps", "slo_attainment", "tpot_mean"):
            assert repeat.user_attrs.get(key) == first.user_attrs.get(key), key
        strategy = StrategySpec.model_validate(repeat.user_attrs["spec"])
        fresh = replay_capacity(replay, strategy, spec.seed, CapacitySpec(target=spec.min_attainment))
        assert repeat.value == pytest.approx(float(fresh.rps or 0.0), rel=1e-12)
    frame = pd.read_parquet(tmp_path / "run" / "tune" / "trials.parquet")
    assert frame["user_attrs_same_as"].notna().sum() == 3


def test_under_capacity_tpe_reads_a_trial_feasible_exactly_when_the_tuner_does(setup, tmp_path):
    """TPE counts a trial feasible only when every constraint set on it is ≤ 0. Under the capacity
    objective a strategy is feasible when some load meets the target; the workload's own rate here is
    past what static-k2 keeps at this SLO (attainment well under 0.9 there) while a lower load meets it, so a
    constraint on the own rate's attainment would make TPE search for that instead of capacity."""
    import autospec.tune as tune_module

    run, workload = setup
    spec = tune_module.TuneSpec(workload=workload, profile=run, trials=4, strategies=FEW.split(","),
                                scope="all", slo={"ttft_s": 0.5, "tpot_s": 0.02})
    tune_module.run_tune(spec, tmp_path / "run")
    trials = study_of(tmp_path / "run").get_trials(deepcopy=False)
    assert len(trials) == 4
    for trial in trials:
        tpe_feasible = sum(max(v, 0.0) for v in trial.constraints.values()) <= 0
        assert set(trial.constraints) == {"capacity"}
        assert tpe_feasible == (trial.user_attrs["capacity_scale"] > 0)
    # the case that tells them apart is in the study: feasible by capacity, short of the target at 1x
    assert any(t.user_attrs["capacity_scale"] > 0 and t.user_attrs["slo_attainment"] < spec.min_attainment
               for t in trials)
