"""GP-LCB's SM split reaches the engine (FASER §4.1; docs/policies.md §3, "SM split per step"): the split
the policy chooses for a step is the split that step's passes are priced at, the step's cost is
recorded under it, and an engine that cannot switch splits per step is refused before the replay."""

from __future__ import annotations

import pytest

from autospec.engines.sim import AcceptanceTraces, SimCosts, SimEngine
from autospec.errors import InputError
from autospec.latency import FaserModels, LinearCoeffs, LinearLatencyModel, PiecewiseLatency
from autospec.policies.gp_lcb import batch_bucket
from autospec.serving.loop import serve
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.step import StepSettings
from autospec.strategy import build_strategy, spec_from_dict

from stage_helpers import K_MAX, synthetic_acceptance

POOL = [0.25, 0.75]
# Piecewise models with an r axis (knees at 0.4 / 0.5): the draft is cheap at r = 0.75, the target at
# r = 0.25, so the two splits price the same step differently.
FASER = FaserModels(PiecewiseLatency("draft", (1e-4, 2e-3, 2e-3), (1.0, 0.5), (0.8, 0.2), 0.4),
                    PiecewiseLatency("target", (1e-4, 1e-3, 8e-3), (1.0, 0.6), (0.9, 0.5), 0.5))


def _sim(temperature: float = 0.0) -> SimEngine:
    costs = SimCosts(LinearLatencyModel(LinearCoeffs(2e-7, 3e-5, 1.5e-3), LinearCoeffs(1.1e-6, 2.4e-4, 9e-3)),
                     (0.0, 0.0), (0.0, 0.0))
    return SimEngine(AcceptanceTraces(synthetic_acceptance(), K_MAX), costs, temperature=temperature, seed=3)


def _requests(n: int = 12) -> list[ServeRequest]:
    return [ServeRequest(i, 0.0, SyntheticPrompt(20 + i, 100, i), 60, ("code", "chat")[i % 2]) for i in range(n)]


def _gp_lcb(pool: list[float], **length):
    return build_strategy(spec_from_dict({"strategy": {"name": "gp"},
                                          "length": {"policy": "gp-lcb", "sm_pool": pool, **length}}))


def test_each_step_runs_at_the_split_gp_lcb_chose_and_is_recorded_there():
    engine = _sim()
    assert FASER.draft_time(4, 1, 0.25) != pytest.approx(FASER.draft_time(4, 1, 0.75))
    applied: list[float | None] = []
    real = engine.set_step_sm_split

    def spy(r):
        applied.append(r)
        return real(r)

    engine.set_step_sm_split = spy
    strategy = _gp_lcb(POOL, refine=False)
    gp = strategy.length
    choices: list[float | None] = []
    real_begin = gp.begin_step

    def begin_step(ctx):
        real_begin(ctx)
        choices.append(gp.step_sm_split())

    gp.begin_step = begin_step
    steps = serve(engine, strategy, _requests(), max_batch=4,
                  settings=StepSettings(k_max=K_MAX, faser=FASER)).steps_frame()
    # the step asked the engine for exactly the split the policy chose, once per step, before drafting
    assert applied == choices and len(applied) == len(steps)
    assert set(applied) == set(POOL)  # the GP explored both splits
    for (_, row), r in zip(steps.iterrows(), applied):
        k, b = list(row["k"]), len(row["k"])
        # the step's passes priced at the applied r: draft on r of the SMs, the target on 1 − r
        draft = sum(FASER.draft_time(sum(1 for ki in k if ki > j), 1, r) for j in range(max(k)))
        assert row["draft_s"] == pytest.approx(draft, rel=1e-12)
        assert row["verify_s"] == pytest.approx(FASER.verify_time(b, sum(row["l"]) / b, r), rel=1e-12)
    # every step's cost went into the window of the split it ran at (Eq. 4's J̃ under (bucket, r))
    for r in POOL:
        want = [(max(row["k"]), (row["draft_s"] + row["verify_s"])
                 / (sum(row["accepted"]) / len(row["k"]) + gp.params.eps))
                for (_, row), applied_r in zip(steps.iterrows(), applied)
                if applied_r == r and batch_bucket(len(row["k"])) == 4]
        got = gp.observations((4, r))[-len(want):]
        want = want[-gp.params.window:]
        assert want and [s for s, _ in got] == [s for s, _ in want]
        assert [j for _, j in got] == pytest.approx([j for _, j in want], rel=1e-9)


def test_an_engine_that_cannot_switch_splits_is_refused_before_the_replay():
    class FixedSplit:  # every Engine member of the simulator, without StepSmSplit
        def __init__(self, sim):
            self._sim = sim
            self.k_max, self.temperature = sim.k_max, sim.temperature

        def __getattr__(self, name):
            if name == "set_step_sm_split":
                raise AttributeError(name)
            return getattr(self._sim, name)

    engine = FixedSplit(_sim())
    for member in ("add", "draft", "verify", "remove", "output", "now", "idle_until"):
        assert callable(getattr(engine, member))
    with pytest.raises(InputError) as err:
        serve(engine, _gp_lcb(POOL), _requests(2), max_batch=2, settings=StepSettings(k_max=K_MAX))
    assert err.value.field == "length.sm_pool" and "\n" not in str(err.value)
    assert engine.now() == 0.0  # nothing ran
    # without a pool nothing is chosen: the same engine serves GP-LCB at the configured split
    serve(engine, _gp_lcb([]), _requests(2), max_batch=2, settings=StepSettings(k_max=K_MAX))
    assert engine.now() > 0.0
