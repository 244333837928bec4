"""`autospec run` as a pipeline: profile (reused) → fit → tune → evaluate (sim + torch) → report."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autospec.strategy import load_preset

from stage_helpers import synthetic_workload, write_synthetic_run

WORKLOAD = synthetic_workload("pipeline-test", rate=20, duration_s=1, max_requests=10, prompt_tokens=32,
                              output_tokens=8, bundled_prompts=True)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autospec", "run", *args], capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_pipeline_writes_every_stage_and_the_report(tmp_path):
    profiled = write_synthetic_run(tmp_path / "profiled")
    (tmp_path / "w.toml").write_text(WORKLOAD)
    config = tmp_path / "run.toml"
    config.write_text(f"""
workload = "w.toml"
max_batch = 4
[profile]
reuse = "{profiled}"
[tune]
trials = 5
strategies = ["no-sd", "static-k2", "k-schedule"]
[evaluate]
strategies = ["no-sd", "static-k2"]
real_strategies = ["no-sd"]
""")
    out = tmp_path / "run"
    res = run_cli(str(config), "--out", str(out), "--json")
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout)
    assert list(result["stages"]) == ["profile", "fit", "tune", "evaluate (simulator)", "evaluate (torch engine)",
                                      "report"]
    # before the real replay starts, how long it will take by the simulator's clock
    assert "[evaluate] the torch engine replays the workload's 10 requests under 2 strategies x 1 repeat: about " \
        in " ".join(res.stderr.split()), res.stderr
    for rel in ("profile/latency.parquet", "fit/models.json", "tune/best.toml", "tune/trials.parquet",
                "deploy/vllm_speculative_config.json", "deploy/autospec_strategy.toml", "eval-sim/eval/summary.json",
                "eval-torch/eval/requests.parquet", "report.html", "summary.md", "manifest.json", "config.toml"):
        assert (out / rel).is_file(), rel
    tuned = load_preset(out / "tune" / "best.toml").name
    sim = json.loads((out / "eval-sim" / "eval" / "summary.json").read_text())["strategies"]
    real = json.loads((out / "eval-torch" / "eval" / "summary.json").read_text())["strategies"]
    # deploy/'s pick is evaluated beside the study's best when the confirmation chose another trial
    deployed = load_preset(out / "deploy" / "autospec_strategy.toml").name
    extra = {deployed} if result["tune"]["deployed"]["number"] != result["tune"]["best"]["number"] else set()
    assert set(sim) == {"no-sd", "static-k2", tuned} | extra and set(real) == {"no-sd", tuned} | extra
    assert "Simulator" in (out / "report.html").read_text() or "simulator" in (out / "report.html").read_text()
    # the pick was confirmed on the torch engine (the default [tune] confirm_top = 2) and the report says so
    confirmed = result["tune"]["confirmed"]
    assert confirmed["status"] == "confirmed" and confirmed["recommended"], confirmed
    assert result["tune"]["deployed"]["number"] == confirmed["recommended_trial"]
    assert "Confirmed on the torch engine" in (out / "summary.md").read_text()
    # deploy/'s pick is the recommendation whose regret at ±30% load and prompt-mix shifts the report shows
    assert f"Recommendation: {result['tune']['deployed']['name']} (deploy/'s pick" in (out / "summary.md").read_text()


def test_bad_run_config_is_one_line_and_exit_2(tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('stages = ["profile", "sing"]\n')
    res = run_cli(str(config), "--out", str(tmp_path / "r"))
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "stages" in res.stderr
    assert not (tmp_path / "r").exists()
    config.write_text('workload = "missing.toml"\n[profile]\nreuse = "nowhere"\n')
    res = run_cli(str(config), "--out", str(tmp_path / "r"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "r").exists()


def test_a_vllm_run_on_a_torch_profile_is_one_line_and_exit_2(tmp_path):
    """`[engine] kind = "vllm"` reusing a torch profile: the simulator and the confirmation follow the
    profile, so the run would compare unlike engines; refused before any stage (without vLLM: the
    install hint, also before any stage)."""
    from autospec.serving.vllm.engine import VLLM_MISSING, vllm_available

    profiled = write_synthetic_run(tmp_path / "profiled")
    (tmp_path / "w.toml").write_text(WORKLOAD)
    config = tmp_path / "run.toml"
    config.write_text(f'workload = "w.toml"\n[engine]\nkind = "vllm"\n[profile]\nreuse = "{profiled}"\n')
    res = run_cli(str(config), "--out", str(tmp_path / "r"))
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    expected = "profile.reuse measured the torch engine" if vllm_available() else VLLM_MISSING.split(":")[0]
    assert expected in res.stderr
    assert not (tmp_path / "r").exists()


def test_the_real_replays_length_is_the_simulators_makespans_and_unknown_ones_count_as_their_mean():
    from autospec.evaluate import EvaluateSpec
    from autospec.pipeline import real_replay_estimate

    sim = {"workload": {"requests": 3000.0}, "strategies": {
        "no-sd": {"makespan_s": {"mean": 3000.0}}, "static-k2": {"makespan_s": {"mean": 1800.0}}}}
    real = EvaluateSpec(workload="w.toml", strategies=["no-sd", "static-k2", "static-k5"], engine="torch", repeats=2)
    # (3000 + 1800) / 2 per strategy, x 3 strategies x 2 repeats = 14,400 s
    assert real_replay_estimate(real, sim) == (
        "[evaluate] the torch engine replays the workload's 3000 requests under 3 strategies x 2 repeats: about "
        "4h00m by the simulator's clock (a window bounds it: max_requests or duration_s in the workload)")
    unknown = EvaluateSpec(workload="w.toml", strategies=["no-sd"], engine="torch")
    assert real_replay_estimate(unknown, {**sim, "strategies": {}}) is None
