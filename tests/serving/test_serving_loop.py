"""The continuous-batching loop: completion, timestamps, losslessness under preemption, KV budget,
and the simulator hooks (idle_until, swap_cost_s, true_match_len) on a clocked fake engine."""

from __future__ import annotations

import numpy as np
import pytest

from autospec.engines.base import GenRequest
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError
from autospec.serving.loop import serve
from autospec.serving.metrics import Slo, compute_metrics
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.step import StepSettings
from autospec.strategy import build_strategy, load_preset, spec_from_dict

from serving_fakes import ClockedFakeEngine

K_MAX = 4


def strategy(k: int, schedule: str = "fcfs", length: str = "static"):
    length_section = {"policy": length, "k": k} if length == "static" else {"policy": length}
    return build_strategy(spec_from_dict({"strategy": {"name": f"{length}-{schedule}"}, "length": length_section,
                                          "schedule": {"policy": schedule}}))


def synthetic_requests(n: int, vocab: int, *, gap_s: float, seed: int = 0) -> list[ServeRequest]:
    rng = np.random.default_rng(seed)
    return [ServeRequest(i, i * gap_s, SyntheticPrompt(int(rng.integers(2, 9)), vocab, i), int(rng.integers(3, 12)))
            for i in range(n)]


def greedy(target, prompt: list[int], max_tokens: int) -> list[int]:
    """Plain target-only greedy decoding, one token per verify(0)."""
    engine = TorchSDEngine(target, None, k_max=K_MAX)
    rid = engine.add([GenRequest(prompt, max_tokens, ignore_eos=True)]).req_ids[0]
    while not engine.is_finished(rid):
        engine.verify({rid: 0})
    return engine.output(rid)


@pytest.fixture(scope="module")
def las_run(tiny_pair):
    """LAS with 2 slots and a tight KV budget on the tiny pair: arrivals during service, preemptions."""
    target, draft = tiny_pair
    engine = TorchSDEngine(target, draft, k_max=K_MAX)
    requests = synthetic_requests(9, 6, gap_s=0.003)
    records = serve(engine, strategy(3, "las"), requests, max_batch=2, kv_budget_tokens=40,
                    settings=StepSettings(k_max=K_MAX), keep_outputs=True)
    return requests, records, records.requests_frame(), records.steps_frame()


def test_every_request_finishes_with_its_max_tokens(las_run):
    requests, _, frame, _ = las_run
    assert list(frame["req_id"]) == [r.req_id for r in requests]
    assert list(frame["output_len"]) == [r.max_tokens for r in requests]
    assert [len(o) for o in frame["output"]] == [r.max_tokens for r in requests]
    assert frame["finish_s"].notna().all()


def test_token_timestamps_are_monotone_and_after_arrival(las_run):
    _, _, frame, steps = las_run
    for row in frame.itertuples():
        times = np.asarray(row.token_times)
        assert np.all(np.diff(times) >= 0)
        assert row.arrival_s <= row.admitted_s <= row.first_token_s == times[0]
        assert times[-1] == row.finish_s
    assert np.all(np.diff(steps["end_s"]) >= 0)


def test_t0_outputs_equal_plain_greedy_under_preemption(las_run, tiny_pair):
    requests, _, frame, _ = las_run
    assert frame["preemptions"].sum() > 0, "the test needs preemptions to mean anything"
    for req, output in zip(requests, frame["output"]):
        assert list(output) == greedy(tiny_pair[0], list(req.prompt), req.max_tokens), req.req_id


def test_t0_outputs_equal_plain_greedy_under_a_concurrency_limit(tiny_pair):
    """Closed loop (2 requests in flight, LAS preempting under a tight KV budget): SD stays lossless."""
    target, draft = tiny_pair
    requests = synthetic_requests(7, 6, gap_s=0.0)
    records = serve(TorchSDEngine(target, draft, k_max=K_MAX), strategy(3, "las"), requests, max_batch=2,
                    kv_budget_tokens=30, settings=StepSettings(k_max=K_MAX), keep_outputs=True, max_concurrency=2)
    frame = records.requests_frame()
    sent, finish = frame["sent_s"].to_numpy(), frame["finish_s"].to_numpy()
    assert max(np.count_nonzero((sent <= t) & (finish > t)) for t in sent) <= 2
    assert (frame["sent_s"] > frame["arrival_s"]).any(), "the limit must hold requests back"
    for req, output in zip(requests, frame["output"]):
        assert list(output) == greedy(target, list(req.prompt), req.max_tokens), req.req_id


def test_kv_budget_and_slots_are_respected(las_run):
    _, _, _, steps = las_run
    assert steps["kv_tokens"].max() <= 40
    assert steps["batch"].max() <= 2


def test_per_round_records_match_the_step_log(las_run):
    _, _, frame, steps = las_run
    appearances = steps.explode("req_ids")["req_ids"].value_counts()
    for row in frame.itertuples():
        assert len(row.rounds_drafted) == len(row.rounds_verified) == len(row.rounds_accepted) \
            == appearances.get(row.req_id, 0)
        assert np.all(np.asarray(row.rounds_accepted) <= np.asarray(row.rounds_verified))
        assert np.all(np.asarray(row.rounds_verified) <= np.asarray(row.rounds_drafted))
    # every output token is a prefill token or one committed by a step
    prefills = 1 + frame["preemptions"]
    assert (frame["output_len"] == prefills + steps.explode("c")["c"].groupby(
        steps.explode("req_ids")["req_ids"].to_numpy()).sum().reindex(frame["req_id"]).fillna(0).to_numpy()).all()


def test_fcfs_never_preempts_and_batches_arrivals(tiny_pair):
    target, draft = tiny_pair
    requests = synthetic_requests(6, 6, gap_s=0.0)
    records = serve(TorchSDEngine(target, draft, k_max=K_MAX), strategy(2), requests, max_batch=4,
                    settings=StepSettings(k_max=K_MAX))
    frame, steps = records.requests_frame(), records.steps_frame()
    assert frame["preemptions"].sum() == 0
    assert steps["batch"].max() == 4
    assert list(frame["output_len"]) == [r.max_tokens for r in requests]


# --- the simulator hooks, on a fake engine with a virtual clock ------------------------------------


def test_idle_until_jumps_to_arrivals_and_times_follow_the_engine_clock():
    engine = ClockedFakeEngine(k_max=K_MAX)
    requests = [ServeRequest(0, 5.0, SyntheticPrompt(10, 1, 0), 4), ServeRequest(1, 60.0, SyntheticPrompt(10, 1, 1), 4)]
    frame = serve(engine, strategy(2), requests, max_batch=4, settings=StepSettings(k_max=K_MAX)).requests_frame()
    assert engine.idle_calls[:2] == [5.0, 60.0]  # nothing running: the loop idled to each arrival
    assert frame["first_token_s"].tolist() == pytest.approx([5.0 + engine.prefill_s, 60.0 + engine.prefill_s])
    assert (frame["finish_s"] < [6.0, 61.0]).all()


def test_preemption_charges_the_swap_cost_and_resumes_the_trace():
    engine = ClockedFakeEngine(k_max=K_MAX, swap_s_per_token=1e-3)
    requests = [ServeRequest(i, 0.001 * i, SyntheticPrompt(20, 1, i), 30) for i in range(6)]
    records = serve(engine, strategy(3, "las"), requests, max_batch=2, settings=StepSettings(k_max=K_MAX))
    frame, steps = records.requests_frame(), records.steps_frame()
    assert frame["preemptions"].sum() > 0
    assert steps["swap_s"].sum() > 0
    # a request's preempt_cost_s: the swap charged at its preemptions plus its token share of each
    # re-admission's prefill (at most the whole prefill of each)
    swap, reprefill = steps["swap_s"].sum(), frame["preempt_cost_s"].sum() - steps["swap_s"].sum()
    assert 0 < reprefill <= frame["preemptions"].sum() * engine.prefill_s + 1e-12 and swap > 0
    assert list(frame["output_len"]) == [30] * 6
    assert engine.max_active <= 2


def test_oracle_gets_the_true_match_length_from_the_engine():
    engine = ClockedFakeEngine(k_max=K_MAX)
    requests = [ServeRequest(i, 0.0, SyntheticPrompt(8, 1, i), 25) for i in range(4)]
    records = serve(engine, build_strategy(load_preset("oracle-m")), requests, max_batch=4,
                    settings=StepSettings(k_max=K_MAX))
    m = compute_metrics(records.requests_frame(), records.steps_frame(), Slo(ttft_s=1, tpot_s=1))
    assert m["acceptance_rate"] == 1.0  # the oracle drafts exactly what will be accepted
    assert m["accepted_per_step"] > 1.0


def test_the_cost_aware_oracle_refuses_an_engine_without_a_step_clock():
    engine = ClockedFakeEngine(k_max=K_MAX)  # knows the match length, not its own clock
    requests = [ServeRequest(i, 0.0, SyntheticPrompt(8, 1, i), 25) for i in range(2)]
    with pytest.raises(InputError, match="step clock"):
        serve(engine, build_strategy(load_preset("oracle")), requests, max_batch=2, settings=StepSettings(k_max=K_MAX))


def test_kv_budget_holds_back_admissions_on_the_fake_engine():
    engine = ClockedFakeEngine(k_max=K_MAX)
    requests = [ServeRequest(i, 0.0, SyntheticPrompt(30, 1, i), 20) for i in range(5)]
    records = serve(engine, strategy(2), requests, max_batch=5, kv_budget_tokens=100,
                    settings=StepSettings(k_max=K_MAX))
    steps = records.steps_frame()
    assert steps["kv_tokens"].max() <= 100
    assert steps["batch"].max() < 5  # the budget, not the slots, limited the batch
    assert list(records.requests_frame()["output_len"]) == [20] * 5


def test_a_request_larger_than_the_kv_budget_is_refused():
    requests = [ServeRequest(0, 0.0, SyntheticPrompt(90, 1, 0), 20)]
    with pytest.raises(InputError, match="KV"):
        serve(ClockedFakeEngine(), strategy(2), requests, max_batch=2, kv_budget_tokens=100,
              settings=StepSettings(k_max=K_MAX))


def test_waiting_queue_reaches_the_policy_in_arrival_order_after_preemptions():
    """The SchedulePolicy contract FCFS relies on: a preempted request rejoins the queue at its
    arrival position, not at the back."""
    strat = strategy(3, "las")
    seen: list[list[tuple[float, int]]] = []
    pick = strat.schedule.pick

    def spy(now, waiting, running, slots):
        seen.append([(v.arrival_s, v.req_id) for v in waiting])
        return pick(now, waiting, running, slots)

    strat.schedule.pick = spy  # type: ignore[method-assign]
    requests = [ServeRequest(i, 0.001 * i, SyntheticPrompt(20, 1, i), 30) for i in range(6)]
    records = serve(ClockedFakeEngine(k_max=K_MAX), strat, requests, max_batch=2, settings=StepSettings(k_max=K_MAX))
    assert records.requests_frame()["preemptions"].sum() > 0  # LAS preempted, so requests re-queued
    assert any(len(q) > 2 for q in seen)
    assert all(q == sorted(q) for q in seen)
