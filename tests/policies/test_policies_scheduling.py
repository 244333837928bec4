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

from policy_harness import mixed_jobs, simulate, varying_jobs
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


def test_oscillating_rounds_with_a_stable_running_total_become_perceptible_at_the_threshold():
    """§4.3: stability is judged on the running rate (total accepted ÷ total processed), not each
    round's. Rounds accept 1, 2, 1, 2, … of 4: every round's rate is 0.25 or 0.5 (spread 0.25, never
    stable), but the running rate is 0.375 after every even round and 0.375 − 1/(8n) after odd round n.
    Its spread over the last γ = 10 rounds is 1/(8·n_min), n_min the first odd round in the window:
    1/8 after round 10 (window 1..10), 1/24 < δ = 0.05 after round 11 (window 2..11)."""
    policy = LapsSdSchedule(predictor_sigma=0.0)
    policy.pick(0.0, [view(7)], [], 1)
    _feed_rounds(policy, 7, [1, 2] * 5)
    assert not policy.is_perceptible(7)  # round 10: spread 0.125
    _feed_rounds(policy, 7, [1])
    st = policy.state(7)
    assert policy.is_perceptible(7)
    assert st.acceptance == pytest.approx(16 / 44)  # the running rate after round 11: 16 of 44
    # Eq. 6 with that A_i: (4·100·0.01 + 100·0.05) / (4·16/44 + 1) = 9 / 2.4545 = 3.667 s → Q4
    assert st.estimate_s == pytest.approx(9.0 / (4 * 16 / 44 + 1))
    assert st.queue == 3


def test_a_drifting_running_rate_stays_non_perceptible_until_it_settles():
    policy = LapsSdSchedule(predictor_sigma=0.0)
    policy.pick(0.0, [view(7)], [], 1)
    # one round all accepted, then none: the running rate after round n is 1/n, so over rounds
    # k..k+9 it moves by 1/k − 1/(k+9): 0.056 for k = 9 (≥ δ), 0.047 for k = 10 (< δ)
    _feed_rounds(policy, 7, [4] + [0] * 17)
    assert not policy.is_perceptible(7)
    rates = list(policy.state(7).rates)
    assert max(rates) - min(rates) == pytest.approx(1 / 9 - 1 / 18)
    _feed_rounds(policy, 7, [0])
    assert policy.is_perceptible(7) and policy.state(7).acceptance == pytest.approx(4 / 76)


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


def test_perceptible_requests_go_by_predicted_time_not_by_length():
    """Eq. 6 makes the order acceptance-aware: 100 tokens at A = 0 take (4·100·0.01 + 100·0.05)/1 = 9 s,
    150 tokens at A = 1 take (6 + 7.5)/5 = 2.7 s. LAPS-SD runs the 150-token request first; LP-SJF,
    which sees only lengths, runs the 100-token one first."""
    policy = LapsSdSchedule(predictor_sigma=0.0, s1_up_s=100.0)  # both in Q1
    hard, easy = view(30, max_tokens=100), view(31, max_tokens=150, arrival=0.5)
    for v, accepted in ((hard, 0), (easy, 4)):
        policy.pick(0.0, [v], [], 1)
        _feed_rounds(policy, v.req_id, [accepted] * 10)
        assert policy.is_perceptible(v.req_id)
    assert policy.state(30).estimate_s == pytest.approx(9.0)
    assert policy.state(31).estimate_s == pytest.approx(2.7)
    assert policy.pick(3.0, [hard, easy], [], 1).run == (31,)
    assert LpSjfSchedule(predictor_sigma=0.0).pick(3.0, [hard, easy], [], 1).run == (30,)
    # remaining, not total: after 120 of 150 tokens the easy one's remaining T̃ is 2.7·30/150 = 0.54 s
    assert policy.remaining_estimate(view(31, max_tokens=150, generated=120)) == pytest.approx(0.54)


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


def test_laps_sd_against_las_and_lp_sjf_on_varying_acceptance():
    """Requests of different lengths (16–400 tokens) and different per-draft acceptance (0.2–0.95),
    each round's acceptance drawn (so per-round rates jump between 0 and 1), batch 1 as in the paper.

    What LAPS-SD's rule implies, and is asserted: the running acceptance rate settles, so every long
    request becomes perceptible before it finishes (judged per round, about a quarter did); once
    perceptible they are served shortest-predicted-time first and no longer preempted, so long
    requests finish far sooner than under LAS (which keeps preempting them for newcomers) and LAPS-SD
    preempts a small fraction of what LAS does. Not asserted, because it does not hold here: LAPS-SD
    beating LP-SJF. LP-SJF's lengths come from an oracle with 7% noise; LAPS-SD knows lengths as well
    but spends each request's first rounds in the LAS-like feedback queues and then pins perceptible
    requests to the slot, and its mean latency stays 10–40% above LP-SJF's on this harness."""
    las_long, laps_long, las_all, laps_all = [], [], [], []
    for seed in range(5):
        runs = {}
        for name in ("las", "lp-sjf", "laps-sd"):
            jobs = varying_jobs(80, seed, rate=0.25)  # fresh jobs (simulate advances them), same draws
            runs[name] = (jobs, simulate(build_schedule(name), jobs, slots=1))
        jobs, laps = runs["laps-sd"]
        longs = [j.req_id for j in jobs if j.output_len >= 160]
        assert len(longs) >= 20
        assert sum(r in laps["perceptible"] for r in longs) >= 0.9 * len(longs), seed
        assert not runs["las"][1]["perceptible"] and not runs["lp-sjf"][1]["perceptible"]

        def long_mean(out: dict, longs=longs) -> float:
            return sum(out["latency"][r] for r in longs) / len(longs)

        las = runs["las"][1]
        assert long_mean(laps) < 0.9 * long_mean(las), seed
        assert laps["preemptions"] * 10 < las["preemptions"], seed
        assert runs["lp-sjf"][1]["preemptions"] == 0  # non-preemptive by default
        las_long.append(long_mean(las))
        laps_long.append(long_mean(laps))
        las_all.append(las["mean_latency"])
        laps_all.append(laps["mean_latency"])
    assert sum(laps_long) < 0.8 * sum(las_long), (laps_long, las_long)
    assert sum(laps_all) < sum(las_all), (laps_all, las_all)
