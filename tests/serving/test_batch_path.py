"""The simulator's batch path (serving/batch.py, engines/sim_batch.py) replays exactly what the per-request
path replays (issue 18): the same request records, step log and clock — bit for bit, not to a tolerance —
for the strategies it takes, on every clock layout the simulator has (the torch engine's padded batches,
vLLM's packed rows with a drafting round's cost and fused prefill), at T = 0 and T > 0, on workloads that
idle, queue, fill the batch and finish requests at their prefill. And it is taken only where it is exact.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from autospec.engines.sim import SimEngine
from autospec.fit import FittedSimEngine, fit_profile, load_fit, write_fit
from autospec.latency import LinearCoeffs
from autospec.serving.batch import batch_path_problem
from autospec.serving.loop import serve
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.step import StepSettings
from autospec.strategy import build_strategy, load_preset, spec_from_dict

from stage_helpers import K_MAX, write_synthetic_run

CI_PROFILE = Path(__file__).resolve().parents[2] / "reports" / "ci-profile"
STRATEGIES = {
    "static-k3": {"strategy": {"name": "static-k3"}, "length": {"policy": "static", "k": 3}},
    "no-sd": {"strategy": {"name": "no-sd"}, "length": {"policy": "none"}},
    # K falls to 0 at batch 6 and above: steps without drafts between steps with them
    "batch-schedule": {"strategy": {"name": "sched"},
                       "length": {"policy": "batch-schedule", "edges": [1, 3, 6], "k": [4, 2, 0]}},
    # one K per step from the step's totals, learning α from Σ accepted / Σ verified (TotalsLengthPolicy)
    "smartspec": {"strategy": {"name": "smartspec"}, "length": {"policy": "smartspec"}},
    # a length per request from its true match length (and, for `oracle`, the engine's step clock)
    "oracle-m": {"strategy": {"name": "oracle-m"}, "length": {"policy": "oracle-m"}},
    "oracle": {"strategy": {"name": "oracle"}, "length": {"policy": "oracle"}},
    # per-request lengths from per-request acceptance and a GP over step costs (RequestLengthPolicy)
    "gp-lcb": {"strategy": {"name": "gp-lcb"}, "length": {"policy": "gp-lcb"}},
    # per-request lengths from each request's KLD history, after a warm-up (RequestLengthPolicy)
    "dsde": {"strategy": {"name": "dsde"}, "length": {"policy": "dsde"}},
}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run = write_synthetic_run(tmp_path_factory.mktemp("batch-path"))
    write_fit(run, fit_profile(run))
    return run


def _engine(base: FittedSimEngine, layout: str, temperature: float) -> SimEngine:
    # every prompt's attention over itself priced too (fit's prefill term in L²)
    costs = dataclasses.replace(base.costs, prefill_square=(2e-8, 3e-9))
    if layout == "packed-round":  # vLLM's structure: fused prefill, a drafting round's own cost, each draft
        # pass weighed by its place in the round, SD's target passes on their own clock, and the drafter
        # proposing for requests in the step that prefills them (sim.SimEngine._admitted)
        costs = dataclasses.replace(costs, draft_round=LinearCoeffs(alpha=2e-7, gamma=3e-5, delta=4e-4),
                                    draft_pass_weights=(0.7, 1.4, 1.1, 1.0, 0.9),
                                    drafting_target=LinearCoeffs(alpha=3e-7, gamma=2e-4, delta=6e-3, lam=1e-4,
                                                                 multi=5e-4))
    return SimEngine(base.traces, costs, k_max=K_MAX, temperature=temperature, seed=7,
                     padded_batches=layout == "padded", fused_prefill=layout == "packed-round")


def _requests(kind: str) -> list[ServeRequest]:
    rng = np.random.default_rng(3)
    n = 60
    if kind == "burst":  # everything at t = 0: a queue, full batches
        arrivals = np.zeros(n)
    else:  # Poisson, with gaps the engine idles through
        arrivals = np.cumsum(rng.exponential(0.05, n))
    prompts = rng.integers(5, 120, n)
    outputs = rng.integers(1, 40, n)  # some max_tokens = 1: finished at their prefill
    outputs[::11] = 1
    return [ServeRequest(i, float(arrivals[i]), SyntheticPrompt(int(prompts[i]), 100, i), int(outputs[i]),
                         ("code", "chat", "")[i % 3]) for i in range(n)]


def _replay(engine_of, spec, requests, batch_path: bool, max_batch: int = 8, latency_model=None):
    engine = engine_of()
    strategy = build_strategy(spec_from_dict(spec) if isinstance(spec, dict) else spec)
    settings = StepSettings(k_max=K_MAX, temperature=engine.temperature, latency_model=latency_model)
    records = serve(engine, strategy, requests, max_batch=max_batch, settings=settings, batch_path=batch_path)
    return records, engine


def _same(per_request, batched) -> None:
    (a, engine_a), (b, engine_b) = per_request, batched
    ra, rb = a.requests_frame(), b.requests_frame()
    assert list(ra.columns) == list(rb.columns) and len(ra) == len(rb)
    for column in ra.columns:
        for x, y in zip(ra[column], rb[column]):
            if isinstance(x, float) and np.isnan(x):
                assert np.isnan(y), column
            else:
                assert np.asarray(x).tolist() == np.asarray(y).tolist(), (column, x, y)
    sa, sb = a.steps_frame(), b.steps_frame()
    assert list(sa.columns) == list(sb.columns) and len(sa) == len(sb) > 0
    for column in sa.columns:
        assert [np.asarray(v).tolist() for v in sa[column]] == [np.asarray(v).tolist() for v in sb[column]], column
    for name in ("prefill_req", "prefill_t", "prefill_before"):
        assert getattr(a.steps, name) == getattr(b.steps, name), name
    assert engine_a.now() == engine_b.now()  # the clock, to the bit
    assert engine_a.totals == engine_b.totals


@pytest.mark.parametrize("layout", ["padded", "packed", "packed-round"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("strategy", list(STRATEGIES))
@pytest.mark.parametrize("workload", ["poisson", "burst"])
def test_the_batch_path_replays_what_the_per_request_path_replays(run, layout, temperature, strategy, workload):
    base = FittedSimEngine.from_dirs(run, k_max=K_MAX, temperature=temperature, seed=7)
    requests = _requests(workload)
    engine_of = lambda: _engine(base, layout, temperature)  # noqa: E731
    model = load_fit(run).latency_model
    _same(_replay(engine_of, STRATEGIES[strategy], requests, False, latency_model=model),
          _replay(engine_of, STRATEGIES[strategy], requests, True, latency_model=model))


def test_a_batch_larger_than_the_replay_sizes_nothing_by_it(run):
    """--max-batch 1e9 (a hostile flag) once made the batch path allocate 45 GiB of columns; the rows it
    needs are never more than the replay's requests, and it replays what the per-request path does."""
    base = FittedSimEngine.from_dirs(run, k_max=K_MAX, temperature=0.0, seed=7)
    requests = _requests("burst")
    engine_of = lambda: _engine(base, "padded", 0.0)  # noqa: E731
    _same(_replay(engine_of, load_preset("static-k2"), requests, False, max_batch=10**9),
          _replay(engine_of, load_preset("static-k2"), requests, True, max_batch=10**9))


@pytest.mark.skipif(not (CI_PROFILE / "profile").is_dir(), reason="the committed CI profile")
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_on_a_real_profile_at_scale(temperature):
    """The committed torch profile (its real traces and fitted clock): 400 requests, batches of 16."""
    base = FittedSimEngine.from_dirs(CI_PROFILE, temperature=temperature, seed=1)
    rng = np.random.default_rng(0)
    requests = [ServeRequest(i, float(t), SyntheticPrompt(int(p), 100, i), int(o), "")
                for i, (t, p, o) in enumerate(zip(np.cumsum(rng.exponential(0.02, 400)), rng.integers(20, 300, 400),
                                                  rng.integers(1, 200, 400)))]

    def engine_of():
        return SimEngine(base.traces, base.costs, temperature=temperature, seed=1,
                         padded_batches=base.padded_batches, fused_prefill=base.fused_prefill)

    for name in ("static-k4", "no-sd"):
        spec = load_preset(name)
        _same(_replay(engine_of, spec, requests, False, 16), _replay(engine_of, spec, requests, True, 16))


def test_it_is_taken_only_where_it_is_exact(run):
    engine = FittedSimEngine.from_dirs(run, k_max=K_MAX)
    static = build_strategy(load_preset("static-k2"))
    ok = dict(kv_budget_tokens=None, max_concurrency=None, keep_outputs=False)
    assert batch_path_problem(engine, static, **ok) is None
    assert "KV budget" in batch_path_problem(engine, static, **{**ok, "kv_budget_tokens": 1000})
    assert "concurrency" in batch_path_problem(engine, static, **{**ok, "max_concurrency": 4})
    assert "output token" in batch_path_problem(engine, static, **{**ok, "keep_outputs": True})
    assert "token by token" in batch_path_problem(engine, build_strategy(load_preset("adaedl")), **ok)
    pooled = build_strategy(spec_from_dict({**STRATEGIES["gp-lcb"],
                                            "length": {"policy": "gp-lcb", "sm_pool": [0.25, 0.5]}}))
    assert "SM split" in batch_path_problem(engine, pooled, **ok)
    assert batch_path_problem(engine, build_strategy(load_preset("gp-lcb")), **ok) is None  # per request
    assert batch_path_problem(engine, build_strategy(load_preset("smartspec")), **ok) is None  # step totals
    assert "FCFS" in batch_path_problem(engine, build_strategy(load_preset("las")), **ok)
    requests = _requests("poisson")
    settings = StepSettings(k_max=K_MAX, latency_model=load_fit(run).latency_model)
    with pytest.raises(ValueError, match="KV budget"):
        serve(engine, static, requests, max_batch=4, settings=settings, kv_budget_tokens=10_000, batch_path=True)
    # by default a replay that cannot take it runs the per-request path, with the same result as asked for
    a = serve(FittedSimEngine.from_dirs(run, k_max=K_MAX), build_strategy(load_preset("static-k2")), requests,
              max_batch=4, settings=settings, kv_budget_tokens=10_000)
    b = serve(FittedSimEngine.from_dirs(run, k_max=K_MAX), build_strategy(load_preset("static-k2")), requests,
              max_batch=4, settings=settings, kv_budget_tokens=10_000, batch_path=False)
    assert a.steps.req_ids == b.steps.req_ids and isinstance(a.steps.req_ids[0], list)
