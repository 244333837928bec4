"""The engine contract (autospec/engines/base.py): every engine is an `Engine` and offers exactly the
optional capabilities its docstring claims; an engine with only the required members — and a length
policy with only the `LengthPolicy` methods — replays a workload to the same tokens, per-step counts
and clock as the full simulator, so the loop calls no optional member without asking first."""

from __future__ import annotations

import dataclasses
import inspect
import re

import numpy as np
import pytest

from autospec.engines.base import (
    CAPABILITIES,
    BatchedDraftRounds,
    DraftSampling,
    Engine,
    FrontierStep,
    StepSmSplit,
    capabilities_of,
    offers,
)
from autospec.engines.sim import SimEngine
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError
from autospec.fit import FittedSimEngine, fit_profile, write_fit
from autospec.policies.base import FixedLengthPolicy, LengthPolicy
from autospec.serving.loop import serve
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.step import StepSettings
from autospec.strategy import apply_overrides, build_strategy, load_preset

from stage_helpers import K_MAX, write_synthetic_run

REQUIRED = ("k_max", "temperature", "add", "draft", "verify", "remove", "output", "now", "idle_until")


class RequiredOnly:
    """A real engine seen through the required `Engine` members only: each forwards to the wrapped
    engine, and nothing else is reachable (no __getattr__, __slots__), so calling an optional
    capability that was not asked for raises AttributeError. Counts the `draft` calls it forwards."""

    __slots__ = ("_engine", "draft_calls")

    def __init__(self, engine):
        self._engine = engine
        self.draft_calls = 0

    @property
    def k_max(self):
        return self._engine.k_max

    @property
    def temperature(self):
        return self._engine.temperature

    def add(self, requests):
        return self._engine.add(requests)

    def draft(self, req_ids):
        self.draft_calls += 1
        return self._engine.draft(req_ids)

    def verify(self, plan):
        return self._engine.verify(plan)

    def remove(self, req_ids):
        return self._engine.remove(req_ids)

    def output(self, req_id):
        return self._engine.output(req_id)

    def now(self):
        return self._engine.now()

    def idle_until(self, t):
        return self._engine.idle_until(t)


class KeepDraftingOnly:
    """A real length policy seen through the `LengthPolicy` methods only (no `fixed_lengths`): the step
    must ask it token by token."""

    __slots__ = ("_policy",)

    def __init__(self, policy):
        self._policy = policy

    def begin_step(self, ctx):
        self._policy.begin_step(ctx)

    def keep_drafting(self, ctx, drafts):
        return self._policy.keep_drafting(ctx, drafts)

    def observe(self, ctx, outcome):
        self._policy.observe(ctx, outcome)


def claimed(cls: type) -> set[str]:
    """The capabilities an engine class's docstring lists on its `Capabilities:` line."""
    m = re.search(r"Capabilities:\s*([A-Za-z,\s]+?)\s*\(", inspect.getdoc(cls) or "")
    assert m, f"{cls.__name__}'s docstring has no 'Capabilities: ...' line"
    return {name.strip() for name in m.group(1).split(",")}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = write_synthetic_run(tmp_path_factory.mktemp("contract"))
    write_fit(run, fit_profile(run))
    return run


@pytest.mark.parametrize("which", ["torch", "sim"])
def test_each_engine_is_an_engine_and_offers_exactly_the_capabilities_its_docstring_claims(which, tiny_pair,
                                                                                           run_dir):
    if which == "torch":
        cls, engine = TorchSDEngine, TorchSDEngine(*tiny_pair, k_max=K_MAX)
    else:
        cls, engine = SimEngine, FittedSimEngine.from_dirs(run_dir)
    names = {c.__name__ for c in CAPABILITIES}
    assert claimed(cls) <= names, f"unknown capabilities in {cls.__name__}'s docstring: {claimed(cls) - names}"
    assert isinstance(engine, Engine)
    assert {c.__name__ for c in capabilities_of(engine)} == claimed(cls)
    assert {c.__name__ for c in CAPABILITIES if isinstance(engine, c)} == claimed(cls)


def test_required_members_are_exactly_the_documented_ones(run_dir):
    bare = RequiredOnly(FittedSimEngine.from_dirs(run_dir))
    assert isinstance(bare, Engine) and not capabilities_of(bare)
    for member in REQUIRED:  # drop any one required member and it is no Engine
        body = {k: v for k, v in vars(RequiredOnly).items() if k not in (member, *RequiredOnly.__slots__)}
        lacking = type(f"Without_{member}", (), body)(bare._engine)
        assert not isinstance(lacking, Engine), member


def test_a_method_set_to_none_is_not_offered(run_dir):
    """The typing rule for blocking a protocol method, which Python 3.11's isinstance skips for a
    method-only protocol whose class defines the method; `offers` applies it on every version."""
    sim = FittedSimEngine.from_dirs(run_dir)
    assert offers(sim, BatchedDraftRounds) and offers(sim, FrontierStep)
    sim.draft_rounds = None
    sim.frontier_step = None
    assert not offers(sim, BatchedDraftRounds) and not offers(sim, FrontierStep)


def test_the_simulator_offers_draft_sampling_and_a_per_step_split_a_cpu_torch_engine_no_split(tiny_pair, run_dir):
    """The simulator replays a strategy's proposal rule (DraftSampling) and applies GP-LCB's per-step
    SM split (StepSmSplit); a torch engine on a CPU has no SMs to split, so it does not offer
    StepSmSplit and a strategy that chooses a split per step is refused before anything runs."""
    sim = FittedSimEngine.from_dirs(run_dir)
    assert offers(sim, DraftSampling) and offers(sim, StepSmSplit)
    torch_cpu = TorchSDEngine(*tiny_pair, k_max=K_MAX)
    assert offers(torch_cpu, DraftSampling) and not offers(torch_cpu, StepSmSplit)
    chooser = build_strategy(apply_overrides(load_preset("gp-lcb"), {"length.sm_pool": [0.25, 0.5]}))
    with pytest.raises(InputError) as err:
        serve(torch_cpu, chooser, REQUESTS[:2], max_batch=2, settings=StepSettings(k_max=K_MAX))
    assert err.value.field == "length.sm_pool" and "\n" not in str(err.value)
    assert torch_cpu.totals["prefill_s"] == 0.0  # refused before the first admission


def _replay(engine, strategy, requests, latency_model):
    rec = serve(engine, strategy, requests, max_batch=6, keep_outputs=True,
                settings=StepSettings(k_max=K_MAX, latency_model=latency_model))
    return rec.requests_frame().set_index("req_id"), rec.steps_frame()


def _assert_same_replay(a, b):
    (req_a, steps_a), (req_b, steps_b) = a, b
    assert req_a["output"].tolist() == req_b["output"].tolist()  # the committed tokens, per request
    for col in ("req_ids", "k", "l", "accepted", "c"):
        assert steps_a[col].map(list).tolist() == steps_b[col].map(list).tolist(), col
    np.testing.assert_allclose(steps_a["end_s"], steps_b["end_s"], rtol=1e-9)
    np.testing.assert_allclose(steps_a["draft_s"], steps_b["draft_s"], rtol=1e-9)


REQUESTS = [ServeRequest(i, 0.01 * i, SyntheticPrompt(30 + 7 * i, 100, i), 40 + 3 * i, ("code", "chat")[i % 2])
            for i in range(24)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_an_engine_with_only_the_required_members_replays_like_the_full_simulator(run_dir, temperature):
    """Static K fixes lengths up front: the full simulator drafts every round in one `draft_rounds`
    call, the bare engine gets one `draft` call per round — same tokens, counts and clock."""
    full = FittedSimEngine.from_dirs(run_dir, temperature=temperature, seed=5)
    bare = RequiredOnly(FittedSimEngine.from_dirs(run_dir, temperature=temperature, seed=5))
    assert offers(full, BatchedDraftRounds) and not capabilities_of(bare)
    fast = _replay(full, build_strategy(load_preset("static-k3")), REQUESTS, full.latency_model)
    slow = _replay(bare, build_strategy(load_preset("static-k3")), REQUESTS, full.latency_model)
    _assert_same_replay(fast, slow)
    steps = slow[1]
    assert (steps["k"].map(max) == 3).all()  # every step drafted 3 rounds ...
    assert bare.draft_calls == 3 * len(steps)  # ... through one `draft` call each


def test_a_length_policy_without_fixed_lengths_is_asked_token_by_token_to_the_same_replay(run_dir):
    static = build_strategy(load_preset("static-k3"))
    asked = dataclasses.replace(build_strategy(load_preset("static-k3")),
                                length=KeepDraftingOnly(build_strategy(load_preset("static-k3")).length))
    assert isinstance(static.length, FixedLengthPolicy)
    assert isinstance(asked.length, LengthPolicy) and not offers(asked.length, FixedLengthPolicy)
    plain, token_by_token = FittedSimEngine.from_dirs(run_dir, seed=5), FittedSimEngine.from_dirs(run_dir, seed=5)
    _assert_same_replay(_replay(plain, static, REQUESTS, plain.latency_model),
                        _replay(token_by_token, asked, REQUESTS, plain.latency_model))
