"""The composite GitHub Action (`action.yml` at the repository root) that users copy into their CI.

Static checks: it is a composite action, every `${{ inputs.X }}` is declared, inputs reach the scripts
only through `env:`, and every flag its `autospec` command lines pass is one the real CLI's `--help`
lists. Then the action's own steps run here, verbatim, as a GitHub runner would run them (bash -eo
pipefail, inputs substituted into `env:`, step outputs through $GITHUB_OUTPUT), on the committed profile
`reports/ci-profile` and a tiny synthetic workload on the simulator: a first run writes the baseline, a
second one gates against it and passes, a planted regression fails, bad input exits 2. Only setup-python
and the pip install itself are not run (they need the network): the install script is syntax-checked and
its extras guard, which exits before pip, is run.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml  # PyYAML: a hard dependency of transformers (and huggingface_hub), which autospec requires
from typer.testing import CliRunner

from autospec.cli import app
from autospec.config import bundled_workload

from stage_helpers import synthetic_workload

REPO = Path(__file__).resolve().parents[2]
ACTION_FILE = REPO / "action.yml"
ACTION = yaml.safe_load(ACTION_FILE.read_text())
STEPS = ACTION["runs"]["steps"]
PROFILE = REPO / "reports" / "ci-profile"
EXPR = re.compile(r"\$\{\{\s*(.*?)\s*\}\}")
# `autospec <subcommand> ...` at the start of a script line: the commands the action runs (an `echo`
# or a `python -c "from autospec..."` is not one)
COMMAND = re.compile(r"^[ \t]*autospec[ \t]+([a-z][a-z-]*)(.*)$", re.MULTILINE)
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def run_scripts() -> list[tuple[dict, str]]:
    return [(step, step["run"]) for step in STEPS if "run" in step]


def cli_options(command: str) -> set[str]:
    """Option names `autospec COMMAND --help` lists: the first column of its Options box."""
    res = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    section, names = None, set()
    for line in res.output.splitlines():
        if line.startswith("╭"):
            section = line
        elif section and "Options" in section:
            row = re.match(r"^│ {1,4}(?:\*\s+)?(-[^<│]*)", line)  # the names, up to "<type>"
            if row:  # a row may list a long and a short name: "--out   -o"
                names.update(re.findall(r"--?[A-Za-z][\w-]*", row.group(1)))
    return names


# --- the file itself ---------------------------------------------------------------------------------


def test_is_a_composite_action_whose_expressions_name_declared_inputs():
    assert ACTION["runs"]["using"] == "composite"
    declared = set(ACTION["inputs"])
    used = set(re.findall(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}", ACTION_FILE.read_text()))
    assert used and used <= declared, f"undeclared inputs: {sorted(used - declared)}"
    # what the brief promises users: these inputs exist, baseline is the only one without a default
    assert {"python-version", "install", "extras", "torch-index-url", "profile", "workload", "strategies",
            "engine", "baseline", "metric", "max-regression", "noise", "repeats", "out", "slo-ttft",
            "slo-tpot"} <= declared
    assert [n for n, spec in ACTION["inputs"].items() if spec.get("required")] == ["baseline"]
    assert all("description" in spec for spec in ACTION["inputs"].values())
    assert ACTION["inputs"]["engine"]["default"] == "sim"
    assert set(ACTION["outputs"]) == {"verdict", "summary"}


def test_inputs_reach_scripts_only_through_env_and_steps_are_bash():
    ids = [step.get("id") for step in STEPS]
    for step, script in run_scripts():
        assert step["shell"] == "bash", step.get("name")
        # an expression inside `run:` would be pasted into the script: shell injection from PR text
        assert "${{" not in script, step.get("name")
        for value in (step.get("env") or {}).values():
            for expr in EXPR.findall(str(value)):
                if expr.startswith("steps."):  # a step output must come from a step that runs earlier
                    ref = expr.split(".")[1]
                    assert ref in ids[:STEPS.index(step)], f"{step.get('name')}: {expr}"
                else:
                    assert expr.startswith("inputs."), f"{step.get('name')}: unexpected expression {expr}"
    for output in ACTION["outputs"].values():
        ref = EXPR.fullmatch(output["value"]).group(1).split(".")[1]
        assert ref in ids


def test_every_script_parses_as_bash():
    for step, script in run_scripts():
        res = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True)
        assert res.returncode == 0, f"{step.get('name')}: {res.stderr}"


def test_every_autospec_flag_in_the_action_is_accepted_by_the_cli():
    commands = [(m.group(1), m.group(2)) for _, script in run_scripts()
                for m in COMMAND.finditer(script.replace("\\\n", " "))]  # one line per command
    assert {sub for sub, _ in commands} == {"evaluate", "gate"}
    known = {sub: cli_options(sub) for sub, _ in commands}
    assert {"--workload", "--strategies", "--engine", "--profile", "--out"} <= known["evaluate"]  # the parser works
    for sub, rest in commands:
        flags = set(FLAG.findall(rest))
        assert flags, sub
        assert flags <= known[sub], f"autospec {sub} has no {sorted(flags - known[sub])}"


def test_help_parser_rejects_what_the_cli_does_not_have():
    # the check above can fail: a flag the CLI lacks is not in the parsed set
    assert "--candidate" in cli_options("gate") and "--candidate" not in cli_options("evaluate")
    assert "--out" in cli_options("report") and "-o" in cli_options("report")


# --- running the action's steps ----------------------------------------------------------------------


class Runner:
    """Runs the action's `run:` steps the way a GitHub runner does, in a workspace folder."""

    def __init__(self, workspace: Path, inputs: dict[str, str]):
        self.workspace = workspace
        unknown = set(inputs) - set(ACTION["inputs"])
        assert not unknown, unknown
        self.inputs = {name: str(spec.get("default", "")) for name, spec in ACTION["inputs"].items()} | inputs
        self.outputs: dict[str, dict[str, str]] = {}
        self.summary = workspace / "step_summary.md"

    def value(self, template: str) -> str:
        """Substitute `${{ inputs.X }}` and `${{ steps.ID.outputs.K }}`; any other expression is an error."""
        def one(m: re.Match) -> str:
            parts = m.group(1).split(".")
            if parts[0] == "inputs" and len(parts) == 2:
                return self.inputs[parts[1]]
            if parts[0] == "steps" and len(parts) == 4 and parts[2] == "outputs":
                return self.outputs.get(parts[1], {}).get(parts[3], "")
            raise AssertionError(f"the test runner does not know {m.group(0)}")
        return EXPR.sub(one, str(template))

    def step(self, step: dict, **extra_env: str) -> subprocess.CompletedProcess:
        out_file = self.workspace / f".github_output_{STEPS.index(step)}"
        out_file.write_text("")
        env = {**os.environ, **{k: self.value(v) for k, v in (step.get("env") or {}).items()},
               # this venv's autospec and python, as setup-python + pip install would put them on PATH
               "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               "GITHUB_ACTION_PATH": str(REPO), "GITHUB_WORKSPACE": str(self.workspace),
               "GITHUB_OUTPUT": str(out_file), "GITHUB_STEP_SUMMARY": str(self.summary), **extra_env}
        # GitHub's `shell: bash` is `bash --noprofile --norc -eo pipefail {0}`
        res = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
                             cwd=self.workspace, env=env, capture_output=True, text=True, timeout=600)
        if "id" in step:
            self.outputs[step["id"]] = dict(line.split("=", 1) for line in out_file.read_text().splitlines() if line)
        return res

    def run(self) -> subprocess.CompletedProcess:
        """Every `run:` step after the install, stopping at the first failure as a job does; returns the
        last step's result."""
        for step in [s for s, script in run_scripts() if "pip install" not in script]:
            res = self.step(step)
            if res.returncode != 0:
                break
        return res

    def output(self, name: str) -> str:
        return self.value(ACTION["outputs"][name]["value"])


def by_id(step_id: str) -> dict:
    return next(s for s in STEPS if s.get("id") == step_id)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory) -> Path:
    """A user's repository: a workload spec and (committed, read-only here) the CI profile."""
    root = tmp_path_factory.mktemp("repo")
    (root / "ci").mkdir()
    (root / "ci" / "workload.toml").write_text(synthetic_workload(
        "action-tiny", rate=8, duration_s=4, max_requests=16, prompt_tokens=32, output_tokens=24, seed=3))
    return root


def user_inputs(**extra: str) -> dict[str, str]:
    return {"profile": str(PROFILE), "workload": "ci/workload.toml", "baseline": "ci/baseline.json", **extra}


@pytest.fixture(scope="module")
def baseline(workspace) -> Path:
    """The first run of the action, before a baseline exists: the evaluation is written, the gate has
    nothing to compare with (exit 2, verdict error); its summary is what the user commits as baseline."""
    runner = Runner(workspace, user_inputs(out="runs/first"))
    res = runner.run()
    assert res.returncode == 2, res.stdout + res.stderr
    assert runner.output("verdict") == "error"
    assert "could not run (exit 2)" in runner.summary.read_text()
    assert "ci/baseline.json" in res.stderr  # the gate's one line names the missing file
    summary = workspace / runner.output("summary")
    assert summary == workspace / "runs/first/eval/summary.json" and summary.is_file()
    shutil.copyfile(summary, workspace / "ci" / "baseline.json")
    return workspace / "ci" / "baseline.json"


def test_candidate_run_passes_and_writes_the_verdict_to_the_step_summary(workspace, baseline):
    runner = Runner(workspace, user_inputs(out="runs/candidate"))
    res = runner.run()
    assert res.returncode == 0, res.stdout + res.stderr
    assert runner.output("verdict") == "pass"
    candidate = json.loads((workspace / runner.output("summary")).read_text())
    assert set(candidate["strategies"]) == {"no-sd", "static-k2", "static-k4"}  # the default strategies
    assert candidate["workload"]["name"] == "action-tiny"
    text = runner.summary.read_text()
    assert text.startswith("# Speculative-decoding gate")
    assert "## autospec gate: PASS" in text
    for strategy in ("no-sd", "static-k2", "static-k4"):
        assert f"| {strategy} | goodput" in text
    assert "static-k4 | accepted_per_step" in text  # the acceptance-collapse check ran too


def test_planted_regression_fails_the_action(workspace, baseline, tmp_path):
    # the gate step alone, on the first run's evaluation (the baseline's own numbers)
    runner = Runner(workspace, user_inputs(out="runs/first", baseline=str(tmp_path / "better.json")))
    better = json.loads(baseline.read_text())
    # the baseline claims 30% more static-k2 goodput than the code now delivers
    better["strategies"]["static-k2"]["goodput"] = {k: v * 1.3 for k, v in
                                                    better["strategies"]["static-k2"]["goodput"].items()}
    (tmp_path / "better.json").write_text(json.dumps(better))
    runner.summary.unlink(missing_ok=True)
    res = runner.step(by_id("gate"))
    assert res.returncode == 1, res.stdout + res.stderr
    assert runner.output("verdict") == "fail"
    text = runner.summary.read_text()
    assert text.startswith("# Speculative-decoding gate") and "## autospec gate: FAIL" in text
    assert "**REGRESSION**" in text


def test_workload_is_a_file_or_a_bundled_name(workspace):
    runner = Runner(workspace, {"workload": "bursty", "baseline": "unused.json"})
    res = runner.step(by_id("workload"))
    assert res.returncode == 0, res.stderr
    assert Path(runner.outputs["workload"]["path"]) == bundled_workload("bursty")
    for bad in ("no-such-workload", "ci/missing.toml"):
        runner = Runner(workspace, {"workload": bad, "baseline": "unused.json"})
        res = runner.step(by_id("workload"))
        assert res.returncode == 2 and f"workload: {bad} is neither" in res.stdout, res.stdout + res.stderr
        assert "path" not in runner.outputs["workload"]


def test_bad_evaluate_input_stops_the_action_with_exit_2(workspace):
    runner = Runner(workspace, user_inputs(out="runs/bad", strategies="no-such-strategy"))
    res = runner.run()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stdout + res.stderr
    assert "gate" not in runner.outputs  # the job stopped before the gate
    assert not (workspace / "runs/bad/eval/summary.json").exists()


def test_extras_on_a_requirement_stop_before_pip(workspace):
    """`autospec==0.1.0[vllm]` is no requirement: the install step says where extras go, exit 2."""
    install = next(s for s, script in run_scripts() if "pip install" in script)
    runner = Runner(workspace, {"install": "autospec==0.1.0", "extras": "vllm", "baseline": "unused.json"})
    # should the guard ever break, pip must not touch this venv: dry run, no index
    res = runner.step(install, PIP_DRY_RUN="1", PIP_NO_INDEX="1")
    assert res.returncode == 2, res.stdout + res.stderr
    assert "::error::extras: put them in install (e.g. autospec[vllm]==VERSION)" in res.stdout
