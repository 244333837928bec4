"""Closed-loop replays (`serve(max_concurrency=N)`, `autospec evaluate --max-concurrency/--closed-loop`):
never more than N requests in flight, sends in trace order at the later of the arrival and a free slot,
latencies from the send, open loop unchanged; the vLLM client's semaphore; the CLI's bad-input contract."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autospec.errors import InputError
from autospec.evaluate import CLOSED_LOOP_CAPACITY_NOTE, EvaluateSpec, open_sim_replay, run_evaluate, spec_from_flags
from autospec.serving.loop import serve
from autospec.serving.metrics import Slo, compute_metrics, per_request_latencies
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.replay import closed_loop_requests
from autospec.serving.step import StepSettings
from autospec.serving.vllm.step_log import ClientRecord
from autospec.strategy import build_strategy, load_preset
from autospec.workloads.spec import load_workload

REPO = Path(__file__).resolve().parents[2]
PROFILE = REPO / "reports" / "ci-profile"  # a real profile + fit of the bundled pair, committed
BURSTY = REPO / "workloads" / "bursty.toml"
SD = load_preset("static-k2")


@pytest.fixture(scope="module")
def replay():
    return open_sim_replay(PROFILE, load_workload(BURSTY).cap(60), k_max=8, max_batch=8)


@pytest.fixture
def small_workload(tmp_path) -> Path:
    """bursty.toml's first 40 requests, for whole evaluations."""
    path = tmp_path / "bursty40.toml"
    path.write_text(BURSTY.read_text().replace("max_requests = 300", "max_requests = 40"))
    return path


def in_flight_at_sends(frame: pd.DataFrame) -> np.ndarray:
    """Requests sent and not finished at each send (the request that freed the slot finished then)."""
    sent, finish = frame["sent_s"].to_numpy(), frame["finish_s"].to_numpy()
    return np.array([np.count_nonzero((sent <= t) & (finish > t)) for t in sent])


@pytest.mark.parametrize("limit", [1, 3])
def test_never_more_than_n_requests_in_flight_and_sends_keep_the_trace_order(replay, limit):
    frame = dataclasses.replace(replay, max_concurrency=limit).run(SD, 0).requests_frame()
    assert in_flight_at_sends(frame).max() == limit
    assert (frame["sent_s"] > frame["arrival_s"]).sum() > len(frame) // 2, "the limit must hold requests back"
    assert (frame["sent_s"] >= frame["arrival_s"]).all()
    assert np.all(np.diff(frame["sent_s"].to_numpy()) >= 0)  # the trace's order (req_id order)
    assert (frame["admitted_s"] >= frame["sent_s"]).all()
    # a held-back request is sent exactly when a request finishes and frees its slot
    held = frame[frame["sent_s"] > frame["arrival_s"]]
    assert held["sent_s"].isin(frame["finish_s"]).all()


def test_closed_loop_with_one_user_serves_requests_one_after_another(replay):
    closed = dataclasses.replace(replay, max_concurrency=1, requests=closed_loop_requests(replay.requests))
    records = closed.run(SD, 0)
    frame, steps = records.requests_frame(), records.steps_frame()
    assert (frame["arrival_s"] == 0).all()
    sent, finish = frame["sent_s"].to_numpy(), frame["finish_s"].to_numpy()
    assert sent[0] == 0 and sent[1:] == pytest.approx(finish[:-1])  # each at the previous one's finish
    assert steps["batch"].max() == 1


def test_a_limit_that_never_binds_and_no_limit_give_the_open_loop_records(replay):
    """No limit: sent at the arrival; a limit of every request: the same records, step for step. (That
    open-loop records are identical to those before `sent_s` existed, bar that column, was checked
    against the previous commit when it was added.)"""
    open_loop = replay.run(SD, 0)
    frame = open_loop.requests_frame()
    assert (frame["sent_s"] == frame["arrival_s"]).all()
    roomy = dataclasses.replace(replay, max_concurrency=len(replay.requests)).run(SD, 0)
    pd.testing.assert_frame_equal(roomy.requests_frame(), frame)
    pd.testing.assert_frame_equal(roomy.steps_frame(), open_loop.steps_frame())


def test_latencies_count_from_the_send(replay):
    records = dataclasses.replace(replay, max_concurrency=2).run(SD, 0)
    frame, steps = records.requests_frame(), records.steps_frame()
    lat = per_request_latencies(frame)
    assert lat["ttft_s"].to_numpy() == pytest.approx((frame["first_token_s"] - frame["sent_s"]).to_numpy())
    assert lat["e2e_s"].to_numpy() == pytest.approx((frame["finish_s"] - frame["sent_s"]).to_numpy())
    assert (lat["ttft_s"] < frame["first_token_s"] - frame["arrival_s"]).any()  # the client-side wait is not in it
    metrics = compute_metrics(frame, steps, Slo())
    assert metrics["ttft_mean"] == pytest.approx(float(lat["ttft_s"].mean()))
    assert metrics["makespan_s"] == pytest.approx(frame["finish_s"].max() - frame["sent_s"].min())
    # records written before sent_s existed: arrival_s was the send time
    old = frame.drop(columns="sent_s").assign(arrival_s=frame["sent_s"])
    assert per_request_latencies(old).equals(lat)


def test_a_limit_below_one_is_refused_naming_the_field():
    requests = [ServeRequest(0, 0.0, SyntheticPrompt(4, 8, 0), 2)]
    with pytest.raises(InputError) as err:
        serve(object(), build_strategy(SD), requests, max_batch=1, settings=StepSettings(k_max=2), max_concurrency=0)
    assert err.value.field == "max_concurrency"


def test_closed_loop_evaluate_skips_the_capacity_search_and_records_the_load(small_workload):
    spec = EvaluateSpec(workload=small_workload, strategies=["static-k2"], engine="sim", profile=PROFILE,
                        max_concurrency=4, closed_loop=True)
    summary = run_evaluate(spec, None).summary
    assert summary["capacity"] is None and summary["capacity_note"] == CLOSED_LOOP_CAPACITY_NOTE
    assert summary["load"] == {"max_concurrency": 4, "closed_loop": True}
    assert summary["strategies"]["static-k2"]["throughput_vs_no_sd"]["mean"] > 0


def test_a_capped_open_loop_keeps_the_capacity_search_with_the_cap_in_every_probe(monkeypatch, small_workload):
    import autospec.serving.replay as replay_module

    limits = []

    def spy(*args, **kwargs):
        limits.append(kwargs.get("max_concurrency"))
        return serve(*args, **kwargs)

    monkeypatch.setattr(replay_module, "serve", spy)
    spec = EvaluateSpec(workload=small_workload, strategies=["static-k2"], engine="sim", profile=PROFILE,
                        max_concurrency=3)
    summary = run_evaluate(spec, None).summary
    assert summary["capacity"] is not None and summary["capacity_note"] is None
    assert len(limits) > 2 and set(limits) == {3}  # the runs at 1x and every probe of the search


def test_the_vllm_client_holds_at_most_n_requests_in_flight():
    """VllmReplayer's semaphore, with the engine call replaced by a sleep (no vLLM needed)."""
    from autospec.serving.vllm.replay import VllmReplayer

    class FakeGeneration(VllmReplayer):
        in_flight = peak = 0

        async def _generate(self, engine, r, repeat, submitted):
            FakeGeneration.in_flight += 1
            FakeGeneration.peak = max(FakeGeneration.peak, FakeGeneration.in_flight)
            await asyncio.sleep(0.01)
            FakeGeneration.in_flight -= 1
            return ClientRecord(submitted, r.max_tokens)

    requests = closed_loop_requests([ServeRequest(i, 0.0, [1, 2], 3) for i in range(7)])
    replayer = FakeGeneration(Path("t"), None, max_batch=8, max_concurrency=2)
    client = asyncio.run(replayer._submit_all(None, requests, time.perf_counter(), 0, None))
    assert FakeGeneration.peak == 2
    sent = [client[i].submitted_s for i in range(7)]
    assert sent == sorted(sent) and sent[2] >= sent[0] + 0.009  # the third waits for a slot, in trace order
    with pytest.raises(InputError):
        VllmReplayer(Path("t"), None, max_batch=8, max_concurrency=0)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autospec.cli", *args], capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "200"})


@pytest.mark.parametrize("flags, field", [(["--closed-loop"], "closed_loop"),
                                          (["--max-concurrency", "0"], "max_concurrency")])
def test_bad_load_flags_exit_2_with_one_line(tmp_path, flags, field):
    res = run_cli("evaluate", "--workload", str(BURSTY), "--engine", "sim", "--profile", str(PROFILE),
                  "--strategies", "static-k2", "--out", str(tmp_path / "run"), *flags)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0], res.stderr
    assert not (tmp_path / "run").exists()
    with pytest.raises(InputError):
        spec_from_flags(workload=BURSTY, strategies=["static-k2"], **({"closed_loop": True} if field == "closed_loop"
                                                                      else {"max_concurrency": 0}))


def test_the_closed_loop_table_says_so(tmp_path, small_workload):
    res = run_cli("evaluate", "--workload", str(small_workload), "--engine", "sim", "--profile", str(PROFILE),
                  "--strategies", "static-k2", "--out", str(tmp_path / "run"), "--closed-loop",
                  "--max-concurrency", "4")
    assert res.returncode == 0, res.stderr
    text = " ".join(res.stdout.split())  # the title wraps over a narrow table
    assert "(1 repeat, closed loop, 4 concurrent)" in text and "not searched" in text
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert json.dumps(manifest).count('"closed_loop": true') == 1
