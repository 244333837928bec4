"""Preemption on the real simulator (a small fitted synthetic run): what a preemption costs, what a
preempted request keeps, and that no request is evicted before its prefill bought it a round
(issue 15, benchmarks/scheduling_thrash.py).

The simulator models preemption by recompute: the re-admission prefills prompt + generated tokens,
and that is the only charge — a switch cost at preemption on top of it priced the same KV rebuild twice.
"""

from __future__ import annotations

from collections import defaultdict

import pytest

from autospec.engines.base import SwapCost, offers
from autospec.fit import FittedSimEngine as SimEngine
from autospec.fit import fit_profile, load_fit, write_fit
from autospec.policies.las import LasSchedule
from autospec.serving.loop import serve
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.step import StepSettings
from autospec.strategy import build_strategy, load_preset, spec_from_dict

from stage_helpers import K_MAX, write_synthetic_run

MAX_BATCH = 4


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = write_synthetic_run(tmp_path_factory.mktemp("preemption"))
    write_fit(run, fit_profile(run))
    return run


def _requests(n: int, *, gap_s: float = 0.0, output: int = 24) -> list[ServeRequest]:
    # prompts of 40..100 tokens, so a re-prefill's size depends on the request
    return [ServeRequest(i, i * gap_s, SyntheticPrompt(40 + 5 * (i % 13), 100, i), output, ("code", "chat")[i % 2])
            for i in range(n)]


def _engine(run, fused: bool = False) -> SimEngine:
    base = SimEngine.from_dirs(run, k_max=K_MAX, temperature=0.0, seed=0)
    if not fused:
        return base
    return SimEngine(base.traces, base.costs, k_max=K_MAX, temperature=0.0, seed=0, fused_prefill=True)


def _settings(run) -> StepSettings:
    return StepSettings(k_max=K_MAX, temperature=0.0, latency_model=load_fit(run).latency_model)


def test_a_preemption_is_charged_one_re_prefill_and_no_switch_cost(run):
    """All requests arrive at 0, so the clock never idles: it must be exactly the passes and prefills
    the engine charged. A swap cost at preemption would add to it on top of the re-prefill."""
    engine = _engine(run)
    assert not offers(engine, SwapCost)
    records = serve(engine, build_strategy(load_preset("las")), _requests(16), max_batch=MAX_BATCH,
                    settings=_settings(run))
    req, steps = records.requests_frame(), records.steps_frame()
    assert req["preemptions"].sum() > 16  # LAS round-robins the queue: many preemptions
    assert steps["swap_s"].sum() == 0.0
    totals = engine.totals
    assert engine.now() == pytest.approx(totals["prefill_s"] + totals["draft_s"] + totals["verify_s"], rel=1e-9)
    assert steps["prefill_s"].sum() == pytest.approx(totals["prefill_s"], rel=1e-9)
    # each preempted request is charged its share of its re-admissions' prefill, and nothing more
    preempted = req[req["preemptions"] > 0]
    assert (preempted["preempt_cost_s"] > 0).all()
    assert (req.loc[req["preemptions"] == 0, "preempt_cost_s"] == 0).all()
    prompts = req["prompt_len"]
    # ≤ one batch's fixed cost each
    first_prefills = engine.costs.prefill_time(int(prompts.sum()), int((prompts ** 2).sum()))
    assert req["preempt_cost_s"].sum() == pytest.approx(totals["prefill_s"] - first_prefills, rel=0.25)
    assert req["preempt_cost_s"].sum() < totals["prefill_s"]


class _RecordingLas(LasSchedule):
    """The real LAS policy, also noting the attained service it is shown and how many steps it observed."""

    name = "las"

    def __init__(self, **params):
        super().__init__(**params)
        self.steps = 0
        self.seen: list[tuple[int, int, float, bool]] = []  # (steps observed, req_id, attained, waiting)

    def pick(self, now, waiting, running, slots):
        for views, is_waiting in ((waiting, True), (running, False)):
            self.seen.extend((self.steps, r.req_id, r.attained_service_s, is_waiting) for r in views)
        return super().pick(now, waiting, running, slots)

    def observe(self, outcome):
        self.steps += 1
        super().observe(outcome)


def test_attained_service_survives_preemption_and_re_admission(run):
    """E_i is the step time of every round the request ran, before and after each preemption: the
    view a waiting (preempted) request shows the policy carries it, and re-admission does not reset it."""
    strategy = build_strategy(load_preset("las"))
    policy = _RecordingLas()
    strategy.schedule = policy
    records = serve(_engine(run), strategy, _requests(16), max_batch=MAX_BATCH, settings=_settings(run))
    assert sum(r.preemptions for r in records.requests) > 0
    s = records.steps
    step_s = [d + v for d, v in zip(s.draft_s, s.verify_s)]
    ran: dict[int, list[int]] = defaultdict(list)
    for i, ids in enumerate(s.req_ids):
        for rid in ids:
            ran[rid].append(i)
    preempted_views = 0
    for steps_done, rid, attained, waiting in policy.seen:
        expected = sum(step_s[i] for i in ran[rid] if i < steps_done)
        assert attained == pytest.approx(expected, rel=1e-9, abs=1e-12)
        preempted_views += int(waiting and expected > 0)
    assert preempted_views > 0  # preempted requests were shown to the policy with their service


def _rounds_since_admission_at_preemption(records) -> list[int]:
    """For every re-admission in the log: the rounds the request ran between its previous admission
    and its preemption."""
    s = records.steps
    events: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for rid, before in zip(s.prefill_req, s.prefill_before):
        events[rid].append((before, 0))  # a prefill sorts before the step of the same index
    for i, ids in enumerate(s.req_ids):
        for rid in ids:
            events[rid].append((i, 1))
    out = []
    for evs in events.values():
        evs.sort()
        rounds, seen = 0, False
        for _, kind in evs:
            if kind == 0:
                if seen:
                    out.append(rounds)
                seen, rounds = True, 0
            else:
                rounds += 1
    return out


def test_no_request_is_preempted_before_it_runs_a_round_after_its_prefill(run):
    """With vLLM's step structure (fused prefill) an admitted request drafts from the next step on, so
    a preemptive SJF would evict a just-prefilled long request for a shorter newcomer before it ran a
    round, paying its prefill for nothing. `min_rounds` = 1 (the default) keeps it for that round."""
    data = load_preset("lp-sjf").model_dump()
    data["schedule"] = {**data["schedule"], "preemptive": True, "predictor_sigma": 0.0}
    spec = spec_from_dict(data)
    # long requests first, then ever shorter ones, arriving one by one
    requests = [ServeRequest(i, 0.004 * i, SyntheticPrompt(60, 100, i), 48 - i, "code") for i in range(40)]
    records = serve(_engine(run, fused=True), build_strategy(spec), requests, max_batch=MAX_BATCH,
                    settings=_settings(run))
    rounds = _rounds_since_admission_at_preemption(records)
    assert rounds, "the workload must make preemptive SJF preempt"
    assert min(rounds) >= 1
    assert all(r.finish_s > 0 for r in records.requests)
