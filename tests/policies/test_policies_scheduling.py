"""Schedule policies: LAPS-SD queues and promotion, FCFS, LAS, LP-SJF, output-length prediction, and
LAPS-SD against FCFS on a simulated mix of short and long jobs."""

from __future__ import annotations

import math

import pytest

from autospec.contract import RequestView
from autospec.policies import Pick, build_schedule
from autospec.policies.laps_sd import LapsSdSchedule, estimated_time, queue_bounds, queue_index
from autospec.policies.lp_sjf import LpSjfSchedule
from autospec.policies.output_length import OracleNoisePredictor

from policy_harness import mixed_jobs, simulate
from policy_helpers import make_outcome


def view(rid: int, *, arrival: float = 0.0, attained: float = 0.0, max_tokens: int = 100,
         generated: int = 0, predicted: float | None = None) -> RequestView:
    return RequestView(req_id=rid, prompt_len=10, generated_len=generated, max_tokens=max_tokens,
                       arrival_s=arrival, attained_service_s=attained, predicted_output_len=predicted)


# --- LAPS-SD ----------------------------------------------------------------------------------------

def test_queue_bounds_and_index():
    bounds = queue_bounds(5, 2.0, 0.72)
    assert bounds == pytest.approx([0.72, 1.44, 2.88, 5.76, math.inf])
    assert [queue_index(x, bounds) for x in (0.0, 0.71, 0.72, 1.5, 3.0, 100.0)] == [0, 0, 1, 2, 3, 4]


def test_estimated_time_eq6():
    # (4·100·0.01 + 100·0.05) / (4·0.5 + 1) = 9/3
    assert estimated_time(100, 0.5, 4, 0.01, 0.05) == pytest.approx(3.0)


def _feed_rounds(policy, rid: int, accepted: list[int]) -> None:
    for a in accepted:
        # 4 drafts in 0.04 s (T_SSM 0.01), verify 0.05 s: a round is 0.09 s, S_1^up = 8·0.09 = 0.72
        policy.observe(make_outcome([4], [a], draft_time=0.04, verify_time=0.05, req_ids=[rid]))


def test_promotion_to_perceptible_after_stable_window():
    policy = LapsSdSchedule(predictor_sigma=0.0)
    policy.pick(0.0, [view(7)], [], 1)
    _feed_rounds(policy, 7, [2] * 9)
    assert not policy.is_perceptible(7)
    _feed_rounds(policy, 7, [2])
    st = policy.state(7)
    assert policy.is_perceptible(7) and st.acceptance == pytest.approx(0.5)
    assert st.estimate_s == pytest.approx(3.0)
    assert st.queue == 3  # 3.0 s lies in Q4 = [2.88, 5.76)


def test_unstable_acceptance_stays_non_perceptible():
    policy = LapsSdSchedule(predictor_sigma=0.0)
    policy.pick(0.0, [view(7)], [], 1)
    _feed_rounds(policy, 7, [2, 3] * 10)  # rates 0.5/0.75: spread 0.25 >= δ
    assert not policy.is_perceptible(7)


def test_dispatch_order_and_preemption_rules():
    policy = LapsSdSchedule(predictor_sigma=0.0, s1_up_s=1.0)  # bounds 1, 2, 4, 8, ∞
    long_np = view(1, arrival=0.0, attained=3.0)  # NP demoted to Q3
    fresh = view(2, arrival=5.0)  # NP in Q1
    pick = policy.pick(6.0, [fresh], [long_np], 1)
    assert pick == Pick(run=(2,), admit=(2,), preempt=(1,))  # NP requests may be preempted

    # a perceptible request keeps its slot even against a Q1 newcomer
    policy.pick(0.0, [view(3, max_tokens=400)], [], 1)
    _feed_rounds(policy, 3, [2] * 10)
    assert policy.is_perceptible(3)
    pick = policy.pick(7.0, [view(4, arrival=6.0)], [view(3, max_tokens=400, attained=0.9)], 1)
    assert pick.run == (3,) and pick.preempt == ()


def test_perceptible_first_then_sjf_then_fcfs_within_a_queue():
    policy = LapsSdSchedule(predictor_sigma=0.0, s1_up_s=100.0)  # everything in Q1
    for rid, length in ((10, 300), (11, 100)):
        policy.pick(0.0, [view(rid, max_tokens=length)], [], 1)
        _feed_rounds(policy, rid, [2] * 10)
    waiting = [view(20, arrival=1.0), view(10, max_tokens=300), view(21, arrival=0.5), view(11, max_tokens=100)]
    pick = policy.pick(2.0, waiting, [], 4)
    # PC by remaining T̃ (100 tokens before 300), then NP by arrival
    assert pick.run == (11, 10, 21, 20)


# --- FCFS, LAS, LP-SJF ------------------------------------------------------------------------------

def test_fcfs_fills_free_slots_by_arrival_and_never_preempts():
    policy = build_schedule("fcfs")
    # `waiting` comes in arrival order (the SchedulePolicy contract; the serving loop keeps it so)
    pick = policy.pick(0.0, [view(2, arrival=1.0), view(3, arrival=2.0)], [view(1, arrival=5.0)], 2)
    assert pick == Pick(run=(1, 2), admit=(2,), preempt=())
    # a full batch admits nobody, however long the queue
    pick = policy.pick(0.0, [view(4, arrival=0.0)], [view(1, arrival=5.0), view(2, arrival=1.0)], 2)
    assert pick == Pick(run=(2, 1), admit=(), preempt=())


def test_las_runs_least_attained_and_preempts():
    policy = build_schedule("las")
    pick = policy.pick(0.0, [view(2, attained=0.0, arrival=3.0)], [view(1, attained=1.5)], 1)
    assert pick == Pick(run=(2,), admit=(2,), preempt=(1,))


def test_lp_sjf_order_and_preemption():
    waiting = [view(2, max_tokens=300, arrival=1.0), view(3, max_tokens=20, arrival=2.0)]
    running = [view(1, max_tokens=500, generated=10)]
    # non-preemptive: the running job keeps its slot, the shortest waiting job gets the free one
    pick = LpSjfSchedule(predictor_sigma=0.0).pick(3.0, waiting, running, 2)
    assert pick == Pick(run=(1, 3), admit=(3,), preempt=())
    # preemptive: shortest remaining first over everyone (490 remaining loses to 20 and 300)
    pick = LpSjfSchedule(predictor_sigma=0.0, preemptive=True).pick(3.0, waiting, running, 2)
    assert pick == Pick(run=(3, 2), admit=(3, 2), preempt=(1,))
    # remaining, not total: a long job that is nearly done goes first
    pick = LpSjfSchedule(predictor_sigma=0.0, preemptive=True).pick(
        3.0, [view(4, max_tokens=50)], [view(5, max_tokens=500, generated=480)], 1)
    assert pick.run == (5,)


def test_oracle_noise_predictor():
    assert OracleNoisePredictor(sigma=0.0).predict(view(1, max_tokens=120)) == 120.0
    noisy = OracleNoisePredictor(sigma=0.07, seed=3)
    a, b = noisy.predict(view(1, max_tokens=1000)), noisy.predict(view(1, max_tokens=1000))
    assert a == b and a != 1000.0 and 700 < a < 1400  # one draw per request, 7% log-scale error
    errors = [abs(noisy.predict(view(i, max_tokens=1000)) / 1000 - 1) for i in range(400)]
    assert 0.03 < sum(errors) / len(errors) < 0.08
    # a prediction the loop supplies wins
    sjf = LpSjfSchedule(predictor_sigma=0.0)
    assert sjf.lengths.total(view(9, max_tokens=1000, predicted=50.0)) == 50.0


# --- behaviour --------------------------------------------------------------------------------------

def test_laps_sd_beats_fcfs_on_mixed_lengths():
    ratios = []
    for seed in range(5):
        fcfs = simulate(build_schedule("fcfs"), mixed_jobs(60, seed), slots=1)["mean_latency"]
        laps = simulate(build_schedule("laps-sd"), mixed_jobs(60, seed), slots=1)["mean_latency"]
        ratios.append(laps / fcfs)
    assert all(r < 1.0 for r in ratios), ratios
    assert sum(ratios) / len(ratios) < 0.9, ratios
