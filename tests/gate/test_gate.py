"""`autospec gate` on real simulated evaluations: identical runs pass, planted regressions and an acceptance
collapse fail, changes inside the noise pass, and broken inputs exit 2 with one line."""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.errors import InputError
from autospec.evaluate import HEADLINE, run_evaluate, spec_from_flags
from autospec.fit import fit_profile, write_fit
from autospec.gate import load_gate_input, metric_direction, parse_fraction, run_gate

from stage_helpers import K_MAX, synthetic_workload, write_synthetic_run

REPO = Path(__file__).resolve().parents[2]
WORKLOAD = synthetic_workload("gate-small", rate=20, duration_s=10, max_requests=30, prompt_tokens=32,
                              output_tokens=24, seed=1, domains=False)
SD = "static-k4"


def _evaluate(root: Path, out: Path, seed: int) -> Path:
    spec = spec_from_flags(workload=root / "w.toml", strategies=[SD], engine="sim", profile=root,
                           repeats=3, k_max=K_MAX, seed=seed)
    run_evaluate(spec, out)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[Path, Path]:
    """Two real sim evaluations of the same workload: seeds 0 and 7 (3 repeats each)."""
    root = write_synthetic_run(tmp_path_factory.mktemp("gate"))
    write_fit(root, fit_profile(root))
    (root / "w.toml").write_text(WORKLOAD)
    return _evaluate(root, root / "a", 0), _evaluate(root, root / "b", 7)


def _summary(run: Path) -> dict:
    return json.loads((run / "eval" / "summary.json").read_text())


def _plant(tmp_path: Path, summary: dict, name: str = "candidate.json", **changes: float) -> Path:
    """Scale metrics of the SD strategy (mean and CI), e.g. goodput=0.8; writes the edited summary."""
    out = copy.deepcopy(summary)
    for metric, factor in changes.items():
        out["strategies"][SD][metric] = {k: v * factor for k, v in out["strategies"][SD][metric].items()}
    path = tmp_path / name
    path.write_text(json.dumps(out))
    return path


def gate_cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(app, ["gate", *args], env=env)


def test_identical_runs_pass(runs, tmp_path):
    a, _ = runs
    twin = tmp_path / "twin.json"
    twin.write_text((a / "eval" / "summary.json").read_text())
    res = gate_cli("--baseline", str(a), "--candidate", str(twin))
    assert res.exit_code == 0, res.output
    assert "autospec gate: PASS" in res.output
    verdict = run_gate(a, twin, metrics=list(HEADLINE))
    assert verdict.passed and all(c.status in ("pass", "skipped") for c in verdict.checks)
    assert {c.strategy for c in verdict.checks} == {"no-sd", SD}


def test_planted_20pct_capacity_regression_fails(runs, tmp_path):
    a, _ = runs
    cand = _plant(tmp_path, _summary(a), capacity_rps=0.8)
    res = gate_cli("--baseline", str(a), "--candidate", str(cand))
    assert res.exit_code == 1, res.output
    assert "FAIL" in res.output and "REGRESSION" in res.output
    verdict = run_gate(a, cand)  # the default metric: capacity at the SLO
    (bad,) = [c for c in verdict.checks if c.failed]
    assert (bad.strategy, bad.metric, bad.status) == (SD, "capacity_rps", "regression")
    assert bad.change == pytest.approx(-0.2)


def test_without_capacity_the_gate_falls_back_to_goodput_and_says_so(runs, tmp_path):
    """A real engine's evaluation has no capacity: the default metric is then goodput, named in a note."""
    a, _ = runs
    real_like = _summary(a)
    for metrics in real_like["strategies"].values():
        metrics["capacity_rps"] = {"mean": None, "ci_low": None, "ci_high": None}
    base = tmp_path / "base.json"
    base.write_text(json.dumps(real_like))
    cand = _plant(tmp_path, real_like, goodput=0.8)
    verdict = run_gate(base, cand)
    (bad,) = [c for c in verdict.checks if c.failed]
    assert (bad.metric, bad.status) == ("goodput", "regression")
    assert any("goodput gated" in note and "no capacity_rps" in note for note in verdict.notes)
    assert run_gate(a, _plant(tmp_path, _summary(a), "g.json", goodput=0.8)).passed  # capacity unchanged


def test_lower_is_better_metrics_regress_upwards(runs, tmp_path):
    a, _ = runs
    slower = _plant(tmp_path, _summary(a), tpot_mean=1.2)
    faster = _plant(tmp_path, _summary(a), "faster.json", tpot_mean=0.8)
    assert gate_cli("--baseline", str(a), "--candidate", str(slower), "--metric", "tpot_mean").exit_code == 1
    res = gate_cli("--baseline", str(a), "--candidate", str(faster), "--metric", "tpot_mean")
    assert res.exit_code == 0 and "improved" in res.output


def test_planted_acceptance_collapse_fails_even_with_capacity_unchanged(runs, tmp_path):
    a, _ = runs
    s = _summary(a)
    acc = s["strategies"][SD]["accepted_per_step"]["mean"]
    assert acc > 0.5  # a real SD run accepts drafts
    cand = _plant(tmp_path, s, accepted_per_step=0.02 / acc,
                  committed_per_step=1.02 / s["strategies"][SD]["committed_per_step"]["mean"])
    res = gate_cli("--baseline", str(a), "--candidate", str(cand))
    assert res.exit_code == 1, res.output
    assert "COLLAPSE" in res.output
    verdict = run_gate(a, cand)
    statuses = {(c.metric, c.kind): c.status for c in verdict.checks if c.strategy == SD}
    assert statuses == {("capacity_rps", "metric"): "pass", ("accepted_per_step", "collapse"): "collapse"}
    # a drop well past 25% that stays above the τ floor is a collapse too; a small one is not
    halved = _plant(tmp_path, s, "halved.json", accepted_per_step=0.5)
    assert run_gate(a, halved).checks[-1].status == "collapse"
    assert run_gate(a, _plant(tmp_path, s, "dip.json", accepted_per_step=0.9)).passed


def test_change_inside_the_noise_band_is_ignored(runs, tmp_path):
    a, _ = runs
    s = _summary(a)
    for factor in (0.98, 0.985, 1.02):
        cand = _plant(tmp_path, s, f"c{factor}.json", capacity_rps=factor)
        assert gate_cli("--baseline", str(a), "--candidate", str(cand)).exit_code == 0
    # even under a 1% threshold a 2% dip stays inside the noise (CI + 3% floor) and is reported as such
    cand = _plant(tmp_path, s, "dip.json", capacity_rps=0.98)
    verdict = run_gate(a, cand, max_regression=0.01)
    assert verdict.passed
    assert [c.status for c in verdict.checks if c.metric == "capacity_rps" and c.strategy == SD] == ["within noise"]


def test_single_repeat_uses_the_noise_floor(runs, tmp_path):
    a, _ = runs
    s = _summary(a)
    for m in s["strategies"][SD].values():  # a one-repeat summary: the CI collapses to the mean
        m["ci_low"] = m["ci_high"] = m["mean"]
    base = tmp_path / "one.json"
    base.write_text(json.dumps(s))
    dip = _plant(tmp_path, s, capacity_rps=0.975)  # 2.5%: past a 2% threshold, inside the 3% floor
    assert run_gate(base, dip, max_regression=0.02).passed
    assert not run_gate(base, dip, max_regression=0.02, noise=0.01).passed
    assert not run_gate(base, _plant(tmp_path, s, "y.json", capacity_rps=0.8)).passed


def test_independent_seeds_pass_on_every_headline_metric(runs):
    a, b = runs
    sa, sb = _summary(a), _summary(b)
    assert sa["strategies"][SD]["goodput"] != sb["strategies"][SD]["goodput"], "seeds should give different runs"
    verdict = run_gate(a, b, metrics=list(HEADLINE))
    assert verdict.passed, verdict.markdown()


def test_strategies_in_one_file_only_are_reported_not_failed(runs, tmp_path):
    a, _ = runs
    s = _summary(a)
    s["strategies"]["adaspec"] = copy.deepcopy(s["strategies"][SD])
    cand = tmp_path / "extra.json"
    cand.write_text(json.dumps(s))
    res = gate_cli("--baseline", str(a), "--candidate", str(cand))
    assert res.exit_code == 0 and "only in the candidate (not gated): adaspec" in res.output
    res = gate_cli("--baseline", str(a), "--candidate", str(_plant(tmp_path, _summary(a), goodput=0.5)),
                   "--strategy", "no-sd")
    assert res.exit_code == 0, res.output  # the regressed static-k4 is not gated


def test_verdict_is_appended_to_the_github_step_summary(runs, tmp_path):
    a, _ = runs
    step = tmp_path / "step_summary.md"
    step.write_text("earlier step\n")
    res = gate_cli("--baseline", str(a), "--candidate", str(a), env={"GITHUB_STEP_SUMMARY": str(step)})
    assert res.exit_code == 0
    text = step.read_text()
    assert text.startswith("earlier step\n") and "| strategy | metric |" in text and "autospec gate: PASS" in text


def test_benchmark_results_gate_row_by_row(tmp_path):
    src = REPO / "benchmarks" / "results" / "engine_speed.json"
    data = json.loads(src.read_text())
    assert run_gate(src, src).passed
    data["rows"][4]["tokens_per_s"] *= 0.7  # batch 1, k 4
    cand = tmp_path / "engine_speed.json"
    cand.write_text(json.dumps(data))
    verdict = run_gate(src, cand)
    (bad,) = [c for c in verdict.checks if c.failed]
    assert (bad.strategy, bad.metric) == ("batch=1 k=4", "tokens_per_s")
    one_record = REPO / "benchmarks" / "results" / "sim_speed.json"  # no rows: one entry
    assert [c.metric for c in run_gate(one_record, one_record).checks] == [
        "wall_s", "steps_per_wall_s", "request_steps_per_wall_s"]
    assert metric_direction("err_tpot_mean") == "lower" and metric_direction("sim_goodput") == "higher"


def test_parse_fraction():
    assert parse_fraction("5%", option="x") == pytest.approx(0.05)
    assert parse_fraction("0.05", option="x") == pytest.approx(0.05)
    assert parse_fraction(" 12.5 % ", option="x") == pytest.approx(0.125)
    assert parse_fraction("100%", option="x", allow_one=True) == 1.0
    for bad in ("abc", "-5%", "5", "100%", "", "5%%"):
        with pytest.raises(InputError):
            parse_fraction(bad, option="x")


def test_broken_inputs_exit_2_with_one_line(runs, tmp_path):
    a, _ = runs
    not_json = tmp_path / "broken.json"
    not_json.write_text("{not json")
    future = tmp_path / "future.json"
    future.write_text(json.dumps({**_summary(a), "schema_version": 99}))
    neither = tmp_path / "neither.json"
    neither.write_text(json.dumps({"schema_version": 1, "hello": 1}))
    malformed = tmp_path / "malformed.json"
    malformed.write_text(json.dumps({"schema_version": 1, "strategies": {"x": {"goodput": 3}}}))
    empty_dir = tmp_path / "empty"
    empty_dir.mkdir()
    bench = REPO / "benchmarks" / "results" / "engine_speed.json"
    good = ["--baseline", str(a), "--candidate", str(a)]
    cases = {
        "file not found": ["--baseline", str(tmp_path / "missing.json"), "--candidate", str(a)],
        "not valid JSON": ["--baseline", str(a), "--candidate", str(not_json)],
        "schema_version 99": ["--baseline", str(a), "--candidate", str(future)],
        "neither": ["--baseline", str(neither), "--candidate", str(a)],
        "expected {mean": ["--baseline", str(malformed), "--candidate", str(a)],
        "no eval/summary.json": ["--baseline", str(empty_dir), "--candidate", str(a)],
        "cannot compare": ["--baseline", str(a), "--candidate", str(bench)],
        "unknown metric 'fastness'": [*good, "--metric", "fastness"],
        "not in this file": [*good, "--metric", "tokens_per_s"],
        "got 'abc'": [*good, "--max-regression", "abc"],
        "got '-5%'": [*good, "--max-regression", "-5%"],
        "strategy 'nope'": [*good, "--strategy", "nope"],
    }
    for needle, args in cases.items():
        res = gate_cli(*args, env={"COLUMNS": "400"})
        assert res.exit_code == 2, (needle, res.output)
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (needle, res.stderr)
        assert res.stdout == ""
    for needle in ("file not found", "got 'abc'"):  # and as a real process: no traceback, exit 2
        res = subprocess.run([sys.executable, "-m", "autospec", "gate", *cases[needle]], capture_output=True,
                             text=True, env={**os.environ, "COLUMNS": "400"}, timeout=120)
        assert res.returncode == 2 and res.stdout == "", (needle, res.stdout, res.stderr)
        assert res.stderr.count("\n") == 1 and needle in res.stderr and "Traceback" not in res.stderr


def test_load_gate_input_accepts_a_run_directory(runs):
    a, _ = runs
    assert load_gate_input(a).entries == load_gate_input(a / "eval" / "summary.json").entries


@pytest.mark.slow
def test_ci_benchmark_passes_against_the_committed_baseline(tmp_path):
    """What CI runs: a fresh gate_bench against reports/baseline.json (the sim is deterministic)."""
    baseline = REPO / "reports" / "baseline.json"
    assert baseline.is_file(), "reports/baseline.json is committed (benchmarks/gate_bench.py --write-baseline)"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "gate_bench.py"), "--out", str(tmp_path / "bench")],
                   check=True, capture_output=True, timeout=600)
    res = subprocess.run([sys.executable, "-m", "autospec", "gate", "--baseline", str(baseline),
                          "--candidate", str(tmp_path / "bench")], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stdout + res.stderr
    verdict = run_gate(baseline, tmp_path / "bench", metrics=list(HEADLINE))
    assert verdict.passed, verdict.markdown()


def test_unlike_runs_are_refused_unless_allowed(runs, tmp_path):
    """Like with like: a different workload, engine setting or SLO is refused with one line naming it;
    --allow-different compares anyway and lists the differences."""
    a, _ = runs
    for key, change in (("workload", {"requests": 31.0}), ("engine", {"k_max": 3}), ("slo", {"tpot_s": 0.01}),
                        ("load", {"max_concurrency": 4, "closed_loop": True}), ("load", {"max_concurrency": 4})):
        other = _summary(a)
        other[key].update(change)
        cand = tmp_path / f"{key}.json"
        cand.write_text(json.dumps(other))
        res = gate_cli("--baseline", str(a), "--candidate", str(cand))
        assert res.exit_code == 2, res.output
        line = res.output.strip()
        assert len(line.splitlines()) == 1 and f"{key}:" in line and "--allow-different" in line
        allowed = run_gate(a, cand, allow_different=True)
        assert allowed.passed and any(n.startswith(f"set-up differs (--allow-different): {key}:")
                                      for n in allowed.notes)
        assert gate_cli("--baseline", str(a), "--candidate", str(cand), "--allow-different").exit_code == 0


def test_a_summary_from_before_the_load_was_recorded_reads_as_open_loop(runs, tmp_path):
    a, _ = runs
    legacy = _summary(a)
    assert legacy.pop("load") == {"max_concurrency": None, "closed_loop": False}
    cand = tmp_path / "legacy.json"
    cand.write_text(json.dumps(legacy))
    assert run_gate(a, cand).passed
    legacy["load"] = {"max_concurrency": 2, "closed_loop": True}
    cand.write_text(json.dumps(legacy))
    with pytest.raises(InputError, match="load:"):
        run_gate(a, cand)


def test_the_manifests_models_and_prompt_set_must_match_and_a_real_engines_hardware(runs, tmp_path):
    a, _ = runs
    twin = tmp_path / "twin"
    shutil.copytree(a, twin)
    manifest = json.loads((twin / "manifest.json").read_text())
    manifest["hardware"]["cpu_model"] = "another CPU"
    (twin / "manifest.json").write_text(json.dumps(manifest))
    assert run_gate(a, twin).passed  # a simulator's result does not depend on the machine replaying it
    manifest["prompt_set"] = {"digest": "0" * 64}
    (twin / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(InputError, match="prompt set"):
        run_gate(a, twin)
    real = json.loads((a / "eval" / "summary.json").read_text())
    real["engine"]["kind"] = "torch"
    for side, hw in ((tmp_path / "r1", "one CPU"), (tmp_path / "r2", "another CPU")):
        (side / "eval").mkdir(parents=True)
        (side / "eval" / "summary.json").write_text(json.dumps(real))
        (side / "manifest.json").write_text(json.dumps({**manifest, "prompt_set": None,
                                                        "hardware": {"cpu_model": hw, "cpu_count": 2}}))
    with pytest.raises(InputError, match="hardware"):
        run_gate(tmp_path / "r1", tmp_path / "r2")
    assert run_gate(tmp_path / "r1", tmp_path / "r2", allow_different=True).passed
    # the same CPU, one run started with Intel's OpenMP preloaded (docs/vllm.md, "Install"); a manifest from
    # before the field was recorded reads as started without a preload
    same = {"cpu_model": "one CPU", "cpu_count": 2}
    (tmp_path / "r2" / "manifest.json").write_text(json.dumps({**manifest, "prompt_set": None, "hardware": {
        **same, "ld_preload": "/venv/lib/libiomp5.so"}}))
    with pytest.raises(InputError, match="ld_preload"):
        run_gate(tmp_path / "r1", tmp_path / "r2")
    (tmp_path / "r2" / "manifest.json").write_text(json.dumps({**manifest, "prompt_set": None, "hardware": {
        **same, "ld_preload": None}}))
    assert run_gate(tmp_path / "r1", tmp_path / "r2").passed


def test_a_run_directorys_manifest_that_is_not_a_json_object_is_named_in_one_line(runs, tmp_path):
    a, _ = runs
    broken = tmp_path / "broken"
    shutil.copytree(a, broken)
    for text, problem in (("[1, 2]", "expected a JSON object"), ("{oops", "not valid JSON")):
        (broken / "manifest.json").write_text(text)
        res = gate_cli("--baseline", str(a), "--candidate", str(broken))
        assert res.exit_code == 2, res.output
        line = res.output.strip()
        assert len(line.splitlines()) == 1 and "manifest.json" in line and problem in line
