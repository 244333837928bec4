"""A corpus of hand-made bad inputs, one per way a user (or a crash, or a copy gone wrong) can break a file
or a flag, run through the real command line (`autospec.cli.main`, what the console script calls).

Every case must end the same way (issue 17): exit code 2, exactly one line on stderr that starts with
`error:` and names the problem, no traceback, and nothing written anywhere. The files are built here,
from numbers and words this project wrote; none comes from a third party.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Callable

import pytest

from autospec.cli import main

from stage_helpers import K_MAX, synthetic_workload, write_synthetic_run

REPO = Path(__file__).resolve().parents[2]
CI_PROFILE = REPO / "reports" / "ci-profile"
WORKLOAD = synthetic_workload("hostile", rate=4, duration_s=3, max_requests=8, prompt_tokens=32, output_tokens=8,
                              domains=False)
DEEP = "[" * 100_000 + "]" * 100_000  # nested past Python's recursion limit


def _files(root: Path) -> dict[str, int | None]:
    """Every path under `root`, with its modification time for a regular file (a folder's changes when
    the --out check creates and removes its probe folder: that is not a write of an artifact)."""
    return {str(p.relative_to(root)): p.stat().st_mtime_ns if p.is_file() else None for p in root.rglob("*")}


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> dict[str, Path]:
    """Valid inputs the cases break one thing in: a fitted synthetic run, a workload, an evaluation."""
    root = tmp_path_factory.mktemp("valid")
    run = write_synthetic_run(root / "run")
    assert main(["fit", str(run)]) == 0
    (root / "w.toml").write_text(WORKLOAD)
    rc = main(["evaluate", "--workload", str(root / "w.toml"), "--strategies", "static-k2", "--engine", "sim",
               "--profile", str(run), "--out", str(root / "eval-run"), "--k-max", str(K_MAX), "--no-capacity",
               "--no-shift"])
    assert rc == 0
    return {"run": run, "workload": root / "w.toml", "eval": root / "eval-run"}


def refuse(tmp_path: Path, capsys, argv: list, needle: str) -> str:
    """Run the CLI in `tmp_path`; assert the one-line refusal (exit 2, `needle` in it) and that nothing
    under `tmp_path` was written or touched. Returns the line."""
    before = _files(tmp_path)
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        rc = main([str(a) for a in argv])
    finally:
        os.chdir(cwd)
    out = capsys.readouterr()
    lines = out.err.strip("\n").split("\n")
    assert rc == 2, (rc, out.err, out.out[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error:"), out.err
    assert "Traceback" not in out.err + out.out
    assert needle.lower() in lines[0].lower(), (needle, lines[0])
    assert _files(tmp_path) == before, "a refused command wrote or touched files"
    return lines[0]


def copy_run(valid: dict[str, Path], tmp_path: Path) -> Path:
    run = tmp_path / "run"
    shutil.copytree(valid["run"], run)
    return run


def edit_json(path: Path, edit: Callable[[dict], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def sim_eval(valid: dict[str, Path], run: Path, out: Path) -> list:
    return ["evaluate", "--workload", valid["workload"], "--strategies", "static-k2", "--engine", "sim",
            "--profile", run, "--out", out, "--k-max", K_MAX, "--no-capacity", "--no-shift"]


# --- fit/models.json: the simulator's clock and acceptance, hand-edited or corrupted -------------------

def _models(key: str, value) -> Callable[[dict], None]:
    def edit(data: dict) -> None:
        target = data
        *parents, last = key.split(".")
        for part in parents:
            target = target[part]
        if value is KeyError:
            del target[last]
        else:
            target[last] = value
    return edit


@pytest.mark.parametrize("key, value, needle", [
    ("linear.target.alpha", float("nan"), "finite"),
    ("linear.target.alpha", float("inf"), "finite"),
    ("linear.target.alpha", -1e-6, "greater than or equal"),
    ("linear.target.alpha", "0.1", "valid number"),
    ("linear.draft", "x", "linear.draft"),
    ("linear", {}, "linear"),
    ("clock.target", None, "clock.target"),
    ("clock.target.delta", 1e308, "less than or equal"),
    ("prefill.target", KeyError, "prefill"),
    ("prefill.target.fixed_s", -5.0, "prefill.target.fixed_s"),
    ("prefill.draft.per_square_token_s", -1e-9, "prefill.draft.per_square_token_s"),
    ("k_max", "8", "k_max"),
    ("per_position_acceptance.code", [1.5, 0.5], "per_position_acceptance"),
    ("sps.values", [], "sps"),
    ("calibration.chosen", "nonsense", "chosen calibrator"),
])
def test_a_broken_fit_is_refused_naming_the_field(valid, tmp_path, capsys, key, value, needle):
    run = copy_run(valid, tmp_path)
    edit_json(run / "fit" / "models.json", _models(key, value))
    line = refuse(tmp_path, capsys, sim_eval(valid, run, tmp_path / "out"), needle)
    assert "models.json" in line


def test_a_fit_whose_clock_never_advances_is_refused(valid, tmp_path, capsys):
    run = copy_run(valid, tmp_path)

    def zero(data: dict) -> None:
        for table in ("linear", "clock"):
            for model in ("draft", "target"):
                data[table][model].update(alpha=0.0, gamma=0.0, delta=0.0, lam=0.0, multi=0.0)
    edit_json(run / "fit" / "models.json", zero)
    refuse(tmp_path, capsys, sim_eval(valid, run, tmp_path / "out"), "never advance")


def test_json_nested_past_the_parser_is_an_input_error(valid, tmp_path, capsys):
    run = copy_run(valid, tmp_path)
    (run / "fit" / "models.json").write_text(DEEP)
    refuse(tmp_path, capsys, sim_eval(valid, run, tmp_path / "out"), "nested too deeply")


# --- profile/: the measurements the fit reads ----------------------------------------------------------

def test_profile_tables_with_impossible_values_are_refused(valid, tmp_path, capsys):
    import numpy as np

    from autospec.artifacts import read_parquet, write_parquet
    from autospec.calibration import ACCEPTANCE_COLUMNS, LATENCY_COLUMNS

    for table, columns, column, value, needle in (
            ("acceptance", ACCEPTANCE_COLUMNS, "match_len", -3, "match_len"),
            ("acceptance", ACCEPTANCE_COLUMNS, "match_len", 99, "match_len"),
            ("latency", LATENCY_COLUMNS, "median_s", np.nan, "median_s"),
            ("latency", LATENCY_COLUMNS, "median_s", -0.01, "median_s"),
            ("latency", LATENCY_COLUMNS, "phase", "warp", "phase"),
            ("latency", LATENCY_COLUMNS, "median_s", "0.005", "median_s")):
        case = tmp_path / f"{table}-{column}-{value}"
        case.mkdir()
        run = copy_run(valid, case)
        shutil.rmtree(run / "fit")
        frame = read_parquet(run / "profile" / f"{table}.parquet", columns)
        if isinstance(value, str) and column == "median_s":  # the whole column as text
            frame[column] = frame[column].astype(str)
        else:
            frame.loc[3, column] = value
        write_parquet(run / "profile" / f"{table}.parquet", frame)
        line = refuse(case, capsys, ["fit", run], needle)
        assert f"{table}.parquet" in line and ("row 3" in line or "column of numbers" in line)


def test_a_profile_json_of_the_wrong_shape_is_refused(valid, tmp_path, capsys):
    run = copy_run(valid, tmp_path)
    shutil.rmtree(run / "fit")
    edit_json(run / "profile" / "profile.json", _models("settings.k_max", "x"))
    refuse(tmp_path, capsys, ["fit", run], "settings.k_max")


# --- the summaries report and gate read ---------------------------------------------------------------

@pytest.mark.parametrize("key, value, needle", [
    ("strategies", "x", "strategies"),
    ("strategies", {}, "strategies"),
    ("engine", "torch", "engine"),
    ("workload", [1, 2], "workload"),
    ("findings", ["a"], "findings"),
    ("host_load", 3, "host_load"),  # found by test_fuzz: the report's warning lines read it as an object
    ("strategies.static-k2.tpot_mean.mean", "fast", "tpot_mean"),
])
def test_report_refuses_a_summary_of_the_wrong_shape(valid, tmp_path, capsys, key, value, needle):
    run = tmp_path / "r"
    shutil.copytree(valid["eval"], run)

    def edit(data: dict) -> None:
        target = data
        *parents, last = key.split(".")
        for part in parents:
            target = target[part]
        target[last] = value
    edit_json(run / "eval" / "summary.json", edit)
    line = refuse(tmp_path, capsys, ["report", run, "-o", tmp_path / "report.html"], needle)
    assert "summary.json" in line


def test_report_refuses_a_tune_summary_without_its_best_trial(valid, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(valid["eval"], run)
    (run / "tune").mkdir()
    (run / "tune" / "summary.json").write_text('{"schema_version": 1}')
    line = refuse(tmp_path, capsys, ["report", run], "best")
    assert "tune/summary.json" in line


def test_report_refuses_requests_without_the_columns_it_plots(valid, tmp_path, capsys):
    from autospec.artifacts import read_parquet, write_parquet

    run = tmp_path / "r"
    shutil.copytree(valid["eval"], run)
    frame = read_parquet(run / "eval" / "requests.parquet")
    write_parquet(run / "eval" / "requests.parquet", frame.drop(columns=["output_len"]))
    refuse(tmp_path, capsys, ["report", run], "output_len")


def test_report_refuses_a_summary_that_is_a_pipe_or_a_folder(valid, tmp_path, capsys):
    run = tmp_path / "r"
    shutil.copytree(valid["eval"], run)
    (run / "eval" / "summary.json").unlink()
    os.mkfifo(run / "eval" / "summary.json")
    refuse(tmp_path, capsys, ["report", run, "-o", tmp_path / "x.html"], "not a regular file")
    (run / "eval" / "summary.json").unlink()
    (run / "eval" / "summary.json").mkdir()
    refuse(tmp_path, capsys, ["report", run, "-o", tmp_path / "x.html"], "not a regular file")


@pytest.mark.parametrize("value, needle", [(float("inf"), "finite"), (float("-inf"), "finite"),
                                           (1e308, "plausible"), ("1", "finite number")])
def test_gate_refuses_metrics_that_are_not_measurements(valid, tmp_path, capsys, value, needle):
    bad = tmp_path / "bad.json"
    shutil.copyfile(valid["eval"] / "eval" / "summary.json", bad)
    edit_json(bad, lambda d: d["strategies"]["static-k2"]["goodput"].update(mean=value))
    refuse(tmp_path, capsys, ["gate", "--baseline", valid["eval"], "--candidate", bad], "goodput")


def test_gate_refuses_a_disturbed_measurement_unless_told(valid, tmp_path, capsys):
    bad = tmp_path / "busy.json"
    shutil.copyfile(valid["eval"] / "eval" / "summary.json", bad)
    edit_json(bad, lambda d: d.update(disturbed=True, host_load={
        "disturbed": True, "note": "measurements disturbed: other processes used 97% of the CPU time"}))
    line = refuse(tmp_path, capsys, ["gate", "--baseline", valid["eval"], "--candidate", bad], "disturbed host")
    assert "97%" in line and "--allow-disturbed" in line
    rc = main(["gate", "--baseline", str(bad), "--candidate", str(bad), "--allow-disturbed"])
    assert rc == 0
    capsys.readouterr()


def test_gate_flags_out_of_range_are_one_line(valid, tmp_path, capsys):
    base = valid["eval"]
    refuse(tmp_path, capsys, ["gate", "--baseline", base, "--candidate", base, "--collapse-floor", "nan"],
           "collapse-floor")
    refuse(tmp_path, capsys, ["gate", "--baseline", base, "--candidate", base, "--collapse-floor", "high"],
           "collapse-floor")
    refuse(tmp_path, capsys, ["gate", "--candidate", base], "--baseline")
    refuse(tmp_path, capsys, ["gate", "--baseline", base, "--candidate", tmp_path / "deep.json"], "file not found")
    (tmp_path / "deep.json").write_text(DEEP)
    refuse(tmp_path, capsys, ["gate", "--baseline", base, "--candidate", tmp_path / "deep.json"],
           "nested too deeply")


# --- strategy presets --------------------------------------------------------------------------------

@pytest.mark.parametrize("content, needle", [
    (bytes(range(256)), "UTF-8"),
    ('[strategy]\nname = "caf\xe9"\n'.encode("latin-1"), "UTF-8"),
    (("x = " + "[" * 5000 + "]" * 5000 + "\n").encode(), "nested too deeply"),
    (b"[strategy\nname = 1\n", "invalid TOML"),
    (b'[strategy]\nname = "no-sd"\n[length]\npolicy = "static"\nk = 3\n', "no-sd"),
    (b'[strategy]\nname = "k100"\n[length]\npolicy = "static"\nk = 100\n', "K_max"),
])
def test_bad_preset_files_are_refused(valid, tmp_path, capsys, content, needle):
    preset = tmp_path / "p.toml"
    preset.write_bytes(content)
    argv = sim_eval(valid, valid["run"], tmp_path / "out")
    argv[argv.index("static-k2")] = preset
    refuse(tmp_path, capsys, argv, needle)


def test_a_preset_name_too_long_for_the_os_is_refused(valid, tmp_path, capsys):
    argv = sim_eval(valid, valid["run"], tmp_path / "out")
    argv[argv.index("static-k2")] = "x" * 100_000
    refuse(tmp_path, capsys, argv, "not a preset name or file")


# --- workloads and traces -------------------------------------------------------------------------

@pytest.mark.parametrize("workload, needle", [
    (WORKLOAD.replace('generator = "poisson"', 'generator = "gamma"\ncv = 1e6'), "cv"),
    (WORKLOAD.replace('generator = "poisson"', 'generator = "onoff"\non_s = 1e-9\noff_s = 1e-9'), "on_s"),
    (WORKLOAD.replace("seed = 0", "seed = -1"), "seed"),
    (WORKLOAD.replace("rate = 4.0", "rate = 1e12"), "rate"),
    (WORKLOAD.replace("rate = 4.0", "rate = true"), "expected a number"),
    (WORKLOAD.replace("rate = 4.0", 'rate = "4"'), "expected a number"),
    (WORKLOAD.replace('generator = "poisson"', 'generator = "poisson"\ndomains = { "" = 1 }'), "domain"),
])
def test_workload_specs_that_would_hang_or_fill_memory_are_refused(valid, tmp_path, capsys, workload, needle):
    path = tmp_path / "w.toml"
    path.write_text(workload)
    argv = sim_eval(valid, valid["run"], tmp_path / "out")
    argv[argv.index(valid["workload"])] = path
    refuse(tmp_path, capsys, argv, needle)


@pytest.mark.parametrize("rows, needle", [
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1e30,10\n", "more than any model reads"),
    ("TIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1,2,10\n", "appears twice"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+00:00,10,10\n2023-11-16 18:15:47,10,10\n"
     "2023-11-16 18:15:48+02:00,10,10\n", "UTC offset"),
])
def test_bad_traces_are_refused_naming_the_line(valid, tmp_path, capsys, rows, needle):
    (tmp_path / "trace.csv").write_text(rows)
    (tmp_path / "w.toml").write_text('[workload]\ntrace = "trace.csv"\nformat = "azure"\nprompts = []\n')
    argv = sim_eval(valid, valid["run"], tmp_path / "out")
    argv[argv.index(valid["workload"])] = tmp_path / "w.toml"
    line = refuse(tmp_path, capsys, argv, needle)
    assert "trace.csv:" in line


def test_mixed_utc_offsets_are_put_in_order():
    """Offsets are normalised to UTC (docs/inputs.md): 18:15:48+02:00 is 16:15:48 UTC, the earliest."""
    import tempfile

    from autospec.workloads.loaders import load_azure

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.csv"
        path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+00:00,10,1\n"
                        "2023-11-16 18:15:48+02:00,20,2\n2023-11-16 18:15:47-01:00,30,3\n")
        rows = list(load_azure(path).requests())
    assert [(r.prompt_len, r.arrival_s) for r in sorted(rows, key=lambda r: r.arrival_s)] == [
        (20, 0.0), (10, 7198.0), (30, 10799.0)]


# --- prompt files ---------------------------------------------------------------------------------

@pytest.mark.parametrize("make, needle", [
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.mkdir(), "directory"),
    (lambda p: p.write_bytes(b'{"prompt": "a"}\n{"prompt": "caf\xe9"}\n'), "UTF-8"),
    (lambda p: p.write_text('{"prompt": "a"}\n' + "[" * 100_000 + "\n"), "nested too deeply"),
    (lambda p: p.write_text('{"prompt": "' + "word " * 3000 + '"}\n'), "context window"),
])
def test_bad_prompt_files_are_refused(tmp_path, capsys, make, needle):
    make(tmp_path / "prompts.jsonl")
    refuse(tmp_path, capsys, ["generate", "--prompts", tmp_path / "prompts.jsonl", "--max-tokens", "4"], needle)


# --- run configs and flags ------------------------------------------------------------------------------

@pytest.mark.parametrize("config, needle", [
    ("stages = []\n", "stages"),
    ("stages = [\"report\"]\n", "nothing to report"),
    ('stages = ["profile", "fit", "evaluate"]\n[evaluate]\nstrategies = ["no-such-preset"]\n',
     "evaluate.strategies"),
    ('stages = ["profile", "fit", "tune"]\n[tune]\nstrategies = ["no-such-preset"]\n', "tune.strategies"),
    ("[engine]\ndevice = \"tpu\"\n", "engine.device"),
    ("[engine]\nseed = -1\n", "engine.seed"),
    ("[profile]\nquick = \"yes\"\n", "profile.quick"),
    ("[pair]\ndraft = \"\"\n", "pair.draft"),
    ('stages = ["profile", "fit", "evaluate"]\n[evaluate]\nstrategies = []\n', "evaluate.strategies"),
    ("x = " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply"),
    ('stages = ["profile", "fit", "tune"]\n[tune]\njobs = true\n', "tune.jobs"),
    ('stages = ["profile", "fit", "tune"]\n[tune]\njobs = 2.0\n', "tune.jobs"),
    ('stages = ["profile", "fit", "evaluate"]\n[evaluate]\njobs = "3"\n', "evaluate.jobs"),
    ('stages = ["profile", "fit", "tune"]\n[tune]\nstorage = ""\n', "tune.storage"),
    # the tune stage's storage is checked before profile/ and fit/ are written (they were left behind)
    ('stages = ["profile", "fit", "tune"]\n[tune]\nstorage = "/no/such/folder/study.journal"\n', "tune.storage"),
    ('stages = ["profile", "fit", "tune"]\n[tune]\nstorage = "sqlite:///:memory:"\n', "tune.storage"),
    ('stages = ["profile", "fit", "tune"]\n[tune]\nstorage = "postgresql+psycopg2://u:secret@127.0.0.1:9/db"\n',
     "tune.storage"),
])
def test_bad_run_configs_are_refused_before_any_stage_writes(tmp_path, capsys, config, needle):
    (tmp_path / "run.toml").write_text(config)
    refuse(tmp_path, capsys, ["run", tmp_path / "run.toml", "--out", tmp_path / "out"], needle)


# a raw production trace: prompts of up to 3,000 tokens, past the bundled pair's 2,048 positions
LONG_WORKLOAD = synthetic_workload("long", rate=4, duration_s=3, max_requests=8, prompt_tokens=1500, output_tokens=8,
                                   domains=False)


@pytest.mark.parametrize("command", ["run", "profile", "evaluate-torch", "tune-confirm"])
def test_a_workload_longer_than_the_pairs_context_is_refused_before_any_engine_runs(valid, tmp_path, capsys, command):
    """Every command that replays the workload on the real engine refuses it up front, naming the workload
    file, a request, how many more and the clip that fits — not minutes in, once the profile reached its
    prompts (`autospec run` on a raw trace did that) or after the whole search (a confirmation)."""
    (tmp_path / "long.toml").write_text(LONG_WORKLOAD)
    (tmp_path / "run.toml").write_text('workload = "long.toml"\n')
    argv = {
        "run": ["run", tmp_path / "run.toml", "--out", tmp_path / "out"],
        "profile": ["profile", "--quick", "--workload", tmp_path / "long.toml", "--out", tmp_path / "out"],
        "evaluate-torch": ["evaluate", "--workload", tmp_path / "long.toml", "--strategies", "static-k2",
                           "--engine", "torch", "--out", tmp_path / "out", "--k-max", K_MAX],
        "tune-confirm": ["tune", "--workload", tmp_path / "long.toml", "--profile", valid["run"], "--trials", "2",
                         "--strategies", "static-k2", "--k-max", K_MAX, "--confirm-top", "1", "--out",
                         tmp_path / "out"],
    }[command]
    line = refuse(tmp_path, capsys, argv, "more than the models' context window of 2048")
    assert "long.toml [workload]: request " in line and "more of its 8 requests" in line, line
    assert "max_prompt_tokens + max_output_tokens <=" in line, line


def test_the_context_window_is_the_smaller_models_and_unknown_when_no_config_names_one(tmp_path):
    from autospec.config import PairSpec
    from autospec.serving.factory import check_workload_fits, context_window
    from autospec.workloads.trace import Trace

    configs = {"target": {"max_position_embeddings": 4096}, "draft": {"text_config": {"max_position_embeddings": 1024}},
               "plain": {"hidden_size": 8}, "odd": {"max_position_embeddings": True}}
    for name, cfg in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    assert context_window(PairSpec(target=tmp_path / "target", draft=tmp_path / "draft")) == 1024
    assert context_window(PairSpec(target=tmp_path / "target", draft=None)) == 4096
    unknown = PairSpec(target=tmp_path / "plain", draft=tmp_path / "odd")
    assert context_window(unknown) is None
    # nothing to check against: the engine that loads such a model decides
    check_workload_fits(Trace.from_arrays([0.0], [100_000], [10]), unknown, 8, path=tmp_path / "w.toml")


@pytest.mark.parametrize("argv, needle", [
    (["evaluate", "--workload", "w.toml", "--strategies", "no-sd", "--engine", "sim", "--profile", "p",
      "--out", "out", "--seed", "-1"], "--seed"),
    (["generate", "--device", "tpu"], "device"),
    (["generate", "--max-tokens", "many"], "--max-tokens"),
    (["evaluate", "--workload", "w.toml", "--strategies", "no-sd", "--engine", "sim", "--profile", "p",
      "--out", "out", "--temperature", "inf"], "temperature"),
    (["presets", "extra"], "unexpected extra argument"),
    (["no-such-command"], "no such command"),
    (["gate"], "--baseline"),
])
def test_bad_flags_get_one_line(tmp_path, capsys, argv, needle):
    refuse(tmp_path, capsys, argv, needle)


def test_an_output_path_that_cannot_be_written_is_refused_before_any_work(valid, tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    for out, needle in ((tmp_path / "a-file", "not a directory"), (tmp_path / "a-file" / "below", "not a directory"),
                        (Path("/proc/autospec-hostile"), "cannot write")):
        refuse(tmp_path, capsys, sim_eval(valid, valid["run"], out), needle)
        refuse(tmp_path, capsys, ["report", valid["eval"], "-o", out / "r.html"], needle)
    refuse(tmp_path, capsys, ["report", valid["eval"], "-o", tmp_path], "is a directory")


def test_an_empty_path_is_refused_not_read_as_the_current_folder(valid, tmp_path, capsys):
    # `--out "$OUT"` with OUT unset: the run must not land in whatever folder the shell is in
    refuse(tmp_path, capsys, sim_eval(valid, valid["run"], ""), "an empty path")
    refuse(tmp_path, capsys, ["report", valid["eval"], "-o", ""], "an empty path")
    refuse(tmp_path, capsys, ["report", ""], "an empty path")
    refuse(tmp_path, capsys, ["evaluate", "--workload", " ", "--out", "x"], "an empty path")
    # a Path flag's default goes through the same check (run's --out defaults to runs/default)
    refuse(tmp_path, capsys, ["run", tmp_path / "missing.toml"], "not found")


# --- tune's Optuna storage --------------------------------------------------------------------------------

def _tune(valid: dict[str, Path], out: Path, *extra) -> list:
    return ["tune", "--workload", valid["workload"], "--profile", valid["run"], "--trials", "2", "--strategies",
            "static-k2", "--k-max", str(K_MAX), "--out", out, *extra]


@pytest.fixture(scope="module")
def journal(valid, tmp_path_factory) -> Path:
    """A real journal of a two-trial study (what the bad journals below are cut from)."""
    out = tmp_path_factory.mktemp("journal") / "run"
    assert main([str(a) for a in _tune(valid, out)]) == 0
    return out / "tune" / "study.journal"


@pytest.mark.parametrize("make, needle", [
    (lambda p, real: p.write_text("hello world\n"), "not an Optuna journal"),
    (lambda p, real: p.write_text("\n"), "not an Optuna journal"),
    (lambda p, real: p.write_text("hello world"), "not an Optuna journal"),  # no newline: never truncated
    (lambda p, real: p.write_text(real + "\n"), "not an Optuna journal"),
    (lambda p, real: p.write_text(real + "garbage\n"), "not an Optuna journal"),
    (lambda p, real: p.write_text('{"op_code": 99, "worker_id": "w"}\n'), "not an Optuna journal"),
    (lambda p, real: p.write_text('{"op_code": "0", "worker_id": "w"}\n'), "not an Optuna journal"),
    (lambda p, real: p.write_bytes(bytes(range(256)) * 4), "not UTF-8"),
    (lambda p, real: os.mkfifo(p), "not a regular file"),
])
def test_a_journal_that_cannot_hold_the_study_is_refused_untouched(valid, journal, tmp_path, capsys, make, needle):
    path = tmp_path / "bad.journal"
    make(path, journal.read_text())
    refuse(tmp_path, capsys, _tune(valid, tmp_path / "out", "--storage", path), needle)


def test_a_journal_name_the_file_system_cannot_hold_is_refused(valid, tmp_path, capsys):
    refuse(tmp_path, capsys, _tune(valid, tmp_path / "out", "--storage", tmp_path / ("n" * 300 + ".journal")),
           "File name too long")


def test_device_files_are_not_journals(valid, tmp_path, capsys):
    for device in ("/dev/zero", "/dev/null"):  # /dev/zero filled memory, /dev/null failed its fsync
        refuse(tmp_path, capsys, _tune(valid, tmp_path / "out", "--storage", device), "not a regular file")


def test_a_record_cut_off_by_a_kill_is_dropped_and_the_study_resumes(valid, journal, tmp_path, capsys):
    """SIGKILL mid-write leaves half a record: Optuna skips it reading but would glue its next append onto
    it (a journal no run could read again); tune drops it under Optuna's lock and resumes."""
    lines = journal.read_text().splitlines(keepends=True)
    path = tmp_path / "cut.journal"
    path.write_text("".join(lines) + lines[-1][: len(lines[-1]) // 2])
    argv = [str(a) for a in _tune(valid, tmp_path / "out", "--storage", path, "--trials", "3")]
    assert main(argv) == 0
    assert "dropped the cut-off last record" in capsys.readouterr().err
    text = path.read_text()
    assert text.startswith("".join(lines)) and text.endswith("\n")
    assert main(argv) == 0  # and it reads back whole
    assert "dropped" not in capsys.readouterr().err


def test_a_study_run_with_other_settings_or_not_by_autospec_is_refused(valid, journal, tmp_path, capsys):
    import optuna

    from autospec.tune import open_storage

    name = optuna.get_all_study_names(open_storage(str(journal)))[0]
    for extra in (["--objective", "multi"], ["--strategies", "static-k4"], ["--max-batch", "4"]):
        path = tmp_path / "copy.journal"
        shutil.copy(journal, path)
        line = refuse(tmp_path, capsys, _tune(valid, tmp_path / "out", "--storage", path, "--study-name", name,
                                              *extra), "--study-name")
        assert name in line
    foreign = tmp_path / "foreign.journal"
    study = optuna.create_study(study_name="foreign", storage=open_storage(str(foreign)))
    study.optimize(lambda t: t.suggest_float("x", 0, 1), n_trials=2)
    refuse(tmp_path, capsys, _tune(valid, tmp_path / "out", "--storage", foreign, "--study-name", "foreign"),
           "not made by autospec tune")


def test_a_journal_cut_mid_study_resumes_its_killed_trials(valid, journal, tmp_path, capsys):
    """Cut at half its length (a kill mid-study, its last record half-written): the trial that was running
    never recorded its strategy, which must not make the study look foreign; the study resumes."""
    text = journal.read_text()
    path = tmp_path / "half.journal"
    path.write_text(text[: len(text) // 2])
    assert main([str(a) for a in _tune(valid, tmp_path / "out", "--storage", path, "--trials", "3")]) == 0


def test_a_study_from_before_the_settings_attribute_is_judged_by_its_default_name(valid, journal, tmp_path,
                                                                                   capsys):
    legacy = tmp_path / "legacy.journal"  # the study's user attributes (op_code 2) removed: no settings digest
    legacy.write_text("".join(line for line in journal.read_text().splitlines(keepends=True)
                              if json.loads(line)["op_code"] != 2))
    import optuna

    from autospec.tune import open_storage

    name = optuna.get_all_study_names(open_storage(str(legacy)))[0]
    refuse(tmp_path, capsys, _tune(valid, tmp_path / "out", "--storage", legacy, "--study-name", name,
                                   "--max-batch", "4"), "other settings")
    assert main([str(a) for a in _tune(valid, tmp_path / "out", "--storage", legacy, "--trials", "3")]) == 0


def test_an_in_memory_sqlite_storage_is_refused(valid, tmp_path, capsys):
    refuse(tmp_path, capsys, _tune(valid, tmp_path / "out", "--storage", "sqlite:///:memory:"), "in-memory")


def test_a_bare_postgresql_url_uses_the_installed_driver():
    """SQLAlchemy 2.1 binds postgresql:// to psycopg 3; the `postgres` extra installs psycopg2."""
    import importlib.util

    from autospec.tune import _rdb_url

    if importlib.util.find_spec("psycopg") is None and importlib.util.find_spec("psycopg2") is not None:
        assert _rdb_url("postgresql://u@h/db") == "postgresql+psycopg2://u@h/db"
        assert _rdb_url("postgres://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert _rdb_url("postgresql+psycopg2://u@h/db") == "postgresql+psycopg2://u@h/db"
    assert _rdb_url("sqlite:///t.db") == "sqlite:///t.db"
