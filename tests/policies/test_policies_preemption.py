"""Preemptive schedule policies across preemptions (issue 15): LAPS-SD's queue level persists and never
climbs back when the measured thresholds grow; `min_rounds` keeps a (re-)admitted request for its
first rounds (LAS, LAPS-SD, preemptive LP-SJF)."""

from __future__ import annotations

import pytest

from autospec.contract import RequestView
from autospec.errors import InputError
from autospec.policies import Pick, build_schedule
from autospec.policies.laps_sd import LapsSdSchedule

from policy_helpers import make_outcome


def view(rid: int, *, arrival: float = 0.0, attained: float = 0.0, max_tokens: int = 100) -> RequestView:
    return RequestView(req_id=rid, prompt_len=10, generated_len=0, max_tokens=max_tokens, arrival_s=arrival,
                       attained_service_s=attained)


def _round(policy, rid: int, seconds: float, *, done: bool = False) -> None:
    """One SD round of `rid` lasting `seconds` (4 drafts, 2 accepted)."""
    policy.observe(make_outcome([4], [2], draft_time=seconds / 2, verify_time=seconds / 2, req_ids=[rid],
                                finished=[done]))


def test_laps_sd_queue_level_survives_a_growing_threshold():
    """S_1^up is 8 rounds' worth of the running mean round time. Rounds of 0.01 s put E = 0.1 s in Q2
    (S_1^up = 0.08 s); once rounds take 1 s, S_1^up = 8 s would hold 0.1 s in Q1 again. The paper's E_i
    only grows, so the request stays demoted: it must not come back above a later Q1 request and
    preempt it."""
    policy = LapsSdSchedule(predictor_sigma=0.0)
    for _ in range(4):
        _round(policy, 99, 0.01)
    demoted = view(1, arrival=0.0, attained=0.1)
    assert policy.queue_of(demoted) == 1
    policy.pick(0.0, [demoted], [], 1)  # seen (and preempted) while in Q2
    for _ in range(40):
        _round(policy, 99, 1.0)
    assert policy.bounds()[0] > 0.1  # the threshold grew past its attained service
    assert policy.queue_of(demoted) == 1
    newer = view(2, arrival=1.0, attained=0.05)  # running, in Q1
    assert policy.queue_of(newer) == 0
    pick = policy.pick(2.0, [demoted], [newer], 1)
    assert pick == Pick(run=(2,), admit=(), preempt=())


def test_laps_sd_level_only_moves_down_as_service_grows():
    policy = LapsSdSchedule(predictor_sigma=0.0, s1_up_s=1.0)  # bounds 1, 2, 4, 8, ∞
    assert [policy.queue_of(view(5, attained=e)) for e in (0.5, 1.5, 0.5, 4.5, 2.0)] == [0, 1, 1, 3, 3]


@pytest.mark.parametrize("name", ["las", "laps-sd", "lp-sjf"])
def test_min_rounds_keeps_an_admitted_request_for_its_first_rounds(name):
    extra = {"preemptive": True, "predictor_sigma": 0.0} if name == "lp-sjf" else {}
    policy = build_schedule(name, min_rounds=3, **extra)
    long = view(1, arrival=0.0, max_tokens=500)
    assert policy.pick(0.0, [long], [], 1).admit == (1,)
    # a newcomer every round: shorter, least attained, same queue and earlier in no order it could lose to
    for done_rounds in range(1, 4):
        _round(policy, 1, 0.01)
        attained = 0.01 * done_rounds
        newcomer = view(10 + done_rounds, arrival=-1.0, max_tokens=5)  # arrived "before" it: FCFS ties favour it
        pick = policy.pick(0.1 * done_rounds, [newcomer], [view(1, attained=attained, max_tokens=500)], 1)
        if done_rounds < 3:
            assert pick == Pick(run=(1,), admit=(), preempt=()), f"preempted after {done_rounds} round(s)"
        else:
            assert pick.preempt == (1,) and pick.admit == (newcomer.req_id,)


def test_min_rounds_restarts_at_each_admission_and_ignores_requests_it_never_admitted():
    policy = build_schedule("las", min_rounds=2)
    # never admitted by this policy: not protected (a request handed over mid-replay)
    assert policy.pick(0.0, [view(2)], [view(1, attained=1.0)], 1).preempt == (1,)
    _round(policy, 2, 0.5)
    _round(policy, 2, 0.5)
    pick = policy.pick(1.0, [view(1, attained=1.0)], [view(2, attained=1.0, arrival=1.0)], 1)
    assert pick.preempt == (2,) and pick.admit == (1,)  # 2 ran its 2 rounds; 1 is re-admitted
    _round(policy, 1, 0.5)
    pick = policy.pick(2.0, [view(2, attained=1.0, arrival=1.0)], [view(1, attained=1.5)], 1)
    assert pick.run == (1,)  # one round since its re-admission: kept, though 2 has less service


def test_min_rounds_must_be_positive():
    with pytest.raises(InputError, match="min_rounds"):
        build_schedule("las", min_rounds=0)
