"""Every strategy preset is lossless on the torch engine: T=0 output is token-identical to `no-sd` on
the bundled pair, and T=1 output follows the target's exact distribution on a tiny pair.

Short requests test every preset cheaply; the long-request tests (below "long requests") run the
serving loop on requests long enough for the policies' per-request state to engage — acceptance and
KLD histories, running rates, DSDE's warm-up, the schedulers' attained service — and assert that it
did: trimming verifiers trimmed, adaptive draft lengths changed, schedulers preempted or reordered.

The oracles need the true match length, which only the simulator knows; they are checked there.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest

import autospec.policies  # noqa: F401  (registers every built-in policy: the length registry below)
from autospec.engines.torch_engine import TorchSDEngine
from autospec.generate import run_generate
from autospec.latency import LinearCoeffs, LinearLatencyModel
from autospec.policies.base import REGISTRIES
from autospec.serving.factory import load_tokenizer, needs_latency_model, quick_latency_model
from autospec.serving.loop import serve
from autospec.serving.records import ServeRequest
from autospec.serving.step import StepSettings
from autospec.strategy import Strategy, StrategySpec, build_strategy, list_presets, load_preset
from autospec.workloads.default_prompts import bundled_prompt_sets
from autospec.workloads.prompts import load_prompts
from engine.test_t1_distribution import (
    LONG_TOKENS,
    N_TOKENS,
    PROMPT,
    chi_square_p,
    conditional_pit,
    exact_distribution,
    target_conditionals,
    uniformity_p,
)

from autospec_testing import shared_file

STRATEGIES = [name for name in list_presets() if name not in ("oracle", "oracle-m")]


@pytest.fixture(scope="module")
def bundled_setup(bundled_pair):
    engine = TorchSDEngine(*bundled_pair)
    tokenizer = load_tokenizer(bundled_pair[0])
    prompts = load_prompts(shared_file("humaneval.jsonl.gz"), limit=3)
    prompts += load_prompts(shared_file("mt_bench_questions.jsonl"), limit=2)
    ids = [tokenizer.encode(p.text) for p in prompts]
    model = quick_latency_model(engine)
    reference = run_generate(engine, ids, build_strategy(load_preset("no-sd")), max_tokens=20,
                             batch_size=5).token_ids
    return engine, ids, model, reference


@pytest.mark.parametrize("name", STRATEGIES)
def test_t0_identical_to_no_sd(bundled_setup, name):
    engine, ids, model, reference = bundled_setup
    spec = load_preset(name)
    result = run_generate(engine, ids, build_strategy(spec), max_tokens=20, batch_size=5,
                          latency_model=model if needs_latency_model(spec) else None)
    assert result.token_ids == reference


# A latency model under which drafting pays (draft passes 10x cheaper than target passes), so that
# model-based policies really draft and trim on the tiny pair and the distribution test is not vacuous.
DRAFTING_PAYS = LinearLatencyModel(draft=LinearCoeffs(1e-7, 1e-6, 1e-3), target=LinearCoeffs(1e-7, 1e-6, 1e-2))


@pytest.fixture(scope="module")
def tiny_setup(tiny_pair):
    target, draft = tiny_pair
    engine = TorchSDEngine(target, draft, temperature=1.0, seed=11)
    return engine, exact_distribution(target, 1.0)


def sample(engine, strategy):
    result = run_generate(engine, [PROMPT] * 6000, strategy, max_tokens=N_TOKENS, batch_size=1000,
                          ignore_eos=True, latency_model=DRAFTING_PAYS)
    return Counter(tuple(t) for t in result.token_ids), result


@pytest.mark.parametrize("name", STRATEGIES)
def test_t1_follows_the_target_distribution(tiny_setup, name):
    engine, expected = tiny_setup
    # Each strategy draws from its own seed, so its sample does not depend on which tests ran before it
    # on the shared engine (a changed policy elsewhere would otherwise shift every later test's draws).
    engine.generator.manual_seed(zlib.crc32(name.encode()))
    samples, result = sample(engine, build_strategy(load_preset(name)))
    if name != "no-sd":
        assert result.drafted > 0, "the strategy never drafted: the test would prove nothing"
    assert chi_square_p(samples, expected) > 1e-3


@pytest.mark.parametrize("name", ["dspark", "adaspec"])
def test_confidence_trimming_with_sampled_proposals_is_biased(tiny_setup, name):
    """Why those presets propose greedily: with sampled proposals the verified prefix depends on a random
    draw, and the output distribution measurably leaves the target's (DSpark App. A)."""
    engine, expected = tiny_setup
    strategy = build_strategy(load_preset(name))
    strategy = dataclasses.replace(strategy, execution=strategy.execution.model_copy(
        update={"draft_sampling": "sample"}))
    samples, result = sample(engine, strategy)
    assert result.verified < result.drafted  # the verifier really trimmed
    assert chi_square_p(samples, expected) < 1e-6


# --- long requests: the policies' per-request state engages ----------------------------------------------

# Length policies whose draft length follows state kept across rounds (acceptance or confidence history,
# KLD history, a GP's observations, running rates). The others draft a fixed K, a K per batch size, a
# per-token confidence threshold, or the oracle's match length.
ADAPTIVE_LENGTH = {"adaspec", "adaedl", "dsde", "gp-lcb", "smartspec"}
STATELESS_LENGTH = {"static", "none", "batch-schedule", "threshold", "oracle", "oracle-m"}


def beyond_static_k(name: str) -> bool:
    spec = load_preset(name)
    return spec.length.policy != "static" or spec.verify.policy != "all" or spec.schedule.policy != "fcfs"


# The long T=1 test runs the presets with something beyond a static K under FCFS (per-request state to
# engage); static K with every draft verified is the short test's and test_t1_distribution's.
LONG_T1_STRATEGIES = [name for name in STRATEGIES if beyond_static_k(name)]


def test_every_length_policy_is_classified():
    """A new length policy must say whether the long tests should see its draft length adapt."""
    assert set(REGISTRIES["length"]) == ADAPTIVE_LENGTH | STATELESS_LENGTH
    assert not ADAPTIVE_LENGTH & STATELESS_LENGTH


@dataclass
class Served:
    """What `serve` did with one strategy, as the long tests check it."""

    outputs: list[list[int]]  # per request, in request order
    drafted: int
    verified: int
    rounds: dict[int, list[int]]  # per request: tokens drafted in each of its rounds, in order
    preempted: int
    admitted: list[int]  # request ids by first admission


def replay(engine: TorchSDEngine, strategy: Strategy, prompts: list[list[int]], max_tokens: int, slots: int,
           model: LinearLatencyModel) -> Served:
    """Every prompt arrives at 0 and generates exactly `max_tokens` tokens through the serving loop (the
    loop `evaluate` runs: continuous batching over `slots`, the schedule policy admits and preempts)."""
    requests = [ServeRequest(i, 0.0, p, max_tokens) for i, p in enumerate(prompts)]
    settings = StepSettings(k_max=engine.k_max, temperature=engine.temperature, latency_model=model)
    rec = serve(engine, strategy, requests, max_batch=slots, settings=settings, keep_outputs=True)
    steps = rec.steps
    rounds: dict[int, list[int]] = {}
    for ids, ks in zip(steps.req_ids, steps.k):
        for rid, k in zip(ids, ks):
            rounds.setdefault(rid, []).append(k)
    by_id = sorted(rec.requests, key=lambda r: r.req_id)
    return Served(outputs=[list(r.output or []) for r in by_id], drafted=sum(map(sum, steps.k)),
                  verified=sum(map(sum, steps.l)), rounds=rounds, preempted=sum(steps.preempted),
                  admitted=[r.req_id for r in sorted(rec.requests, key=lambda r: (r.admitted_s, r.req_id))])


def assert_state_engaged(spec: StrategySpec, run: Served) -> None:
    if spec.length.policy != "none":
        assert run.drafted > 0, "the strategy never drafted: the test would prove nothing"
    if spec.verify.policy != "all":
        assert run.verified < run.drafted, f"the {spec.verify.policy} verifier never trimmed a draft"
    if spec.length.policy in ADAPTIVE_LENGTH:
        # a request's last round is left out: the tokens still to generate may cut it short
        assert any(len(set(ks[:-1])) > 1 for ks in run.rounds.values()), \
            f"no request's {spec.length.policy} draft length changed across its rounds"
    # [chosen] LAPS-SD is left out: a request now keeps the lowest queue it reached (attained service only
    # grows), and on these 6 equal requests its dispatch is FCFS's; its preemption path is checked on the
    # simulator (tests/policies/test_policies_preemption.py, tests/policies/test_policies_scheduling.py).
    if spec.schedule.policy not in ("fcfs", "laps-sd"):
        assert run.preempted > 0 or run.admitted != sorted(run.admitted), \
            f"the {spec.schedule.policy} scheduler neither preempted nor reordered anyone"


LONG_T0_TOKENS = 48  # past DSDE's 30-token warm-up and LAPS-SD's 10-round stability window [chosen]
LONG_T0_SLOTS = 4  # for 6 requests: the schedulers choose whom to admit and whom to preempt
# [chosen] A fixed time model of the bundled pair's shape on a CPU (reports/ci-profile's fit: a verified
# token ~2.5% of a target pass, a draft pass ~1/5 of one — halved here, or AdaSpec's drafter, which stops
# for good once its mean confidence says drafting does not pay, drafts almost nothing): drafting pays, and
# verifying a token costs enough that a trimming verifier cuts the unlikely ones. Fixed rather than
# measured, so the policies' decisions do not follow the machine's load.
BUNDLED_MODEL = LinearLatencyModel(draft=LinearCoeffs(1.5e-7, 3.5e-5, 6e-4),
                                   target=LinearCoeffs(5e-7, 1.5e-4, 6e-3))


@pytest.fixture(scope="module")
def long_t0_setup(bundled_pair):
    engine = TorchSDEngine(*bundled_pair)
    tokenizer = load_tokenizer(bundled_pair[0])
    # the bundled prompt sets (built in: never skipped), two per domain
    ids = [tokenizer.encode(p.text) for prompts in bundled_prompt_sets(limit=2).values() for p in prompts]
    reference = replay(engine, build_strategy(load_preset("no-sd")), ids, LONG_T0_TOKENS, LONG_T0_SLOTS,
                       BUNDLED_MODEL)
    assert all(len(o) == LONG_T0_TOKENS for o in reference.outputs)
    return engine, ids, reference


@pytest.mark.parametrize("name", STRATEGIES)
def test_t0_long_requests_identical_to_no_sd_with_state_engaged(long_t0_setup, name):
    """48-token requests through the serving loop, 6 requests on 4 slots: token-identical to no-sd, and the
    policies' state did its work (trimming verifiers trimmed, adaptive lengths changed, schedulers acted)."""
    engine, ids, reference = long_t0_setup
    spec = load_preset(name)
    run = replay(engine, build_strategy(spec), ids, LONG_T0_TOKENS, LONG_T0_SLOTS, BUNDLED_MODEL)
    assert run.outputs == reference.outputs
    assert_state_engaged(spec, run)


LONG_T1_REQUESTS = 160
# Half the requests wait: the schedulers choose. LAS and LAPS-SD schedule by measured time, so their
# draws differ from run to run: a lossless sampler fails each of their p > 1e-3 assertions 0.1% of runs.
LONG_T1_SLOTS = 80
LONG_T1_LATE = 30  # the late window: positions after DSDE's 30-token warm-up
# [chosen] Drafting pays on the tiny pair (a draft pass 1/10 of a target pass), and a verified token costs
# ~0.6% of a pass per request, ~50% over a full batch of LONG_T1_SLOTS: the trimming verifiers trim.
TINY_MODEL = LinearLatencyModel(draft=LinearCoeffs(1e-7, 1e-6, 1e-3), target=LinearCoeffs(1e-7, 6e-5, 1e-2))


@pytest.fixture(scope="module")
def long_t1_engine(tiny_pair):
    return TorchSDEngine(*tiny_pair, temperature=1.0, seed=11)


def long_t1_pit(engine: TorchSDEngine, target, strategy: Strategy, seed: int) -> tuple[np.ndarray, Served]:
    engine.generator.manual_seed(seed)
    run = replay(engine, strategy, [PROMPT] * LONG_T1_REQUESTS, LONG_TOKENS, LONG_T1_SLOTS, TINY_MODEL)
    tokens = np.array(run.outputs)
    return conditional_pit(target_conditionals(target, PROMPT, run.outputs), tokens, seed=seed), run


@pytest.mark.parametrize("name", LONG_T1_STRATEGIES)
def test_t1_long_requests_follow_the_target_conditionals(long_t1_engine, tiny_pair, name):
    """T=1, 40-token continuations: every token, the late ones (after the per-request state engaged)
    included, follows the target's exact conditional distribution given its prefix.

    Exact, not approximate: `conditional_pit` maps each token through the target's exact conditional
    distribution given the prompt and the tokens before it (teacher-forced, float64); if the sampler is
    lossless the values are i.i.d. U(0, 1) whatever the length, so a chi-square test of uniformity needs
    no enumeration of the 6^40 continuations. Tested on all positions and on the late window alone, where
    a bias from state built up over the rounds would show undiluted."""
    spec = load_preset(name)
    u, run = long_t1_pit(long_t1_engine, tiny_pair[0], build_strategy(spec), zlib.crc32(name.encode()))
    assert_state_engaged(spec, run)
    assert uniformity_p(u) > 1e-3
    assert uniformity_p(u[:, LONG_T1_LATE:]) > 1e-3


def test_t1_long_requests_see_the_bias_of_sampled_proposals(long_t1_engine, tiny_pair):
    """The power of the long test: DSpark with sampled proposals (its verified prefix then depends on a
    random draw, DSpark App. A) fails it."""
    strategy = build_strategy(load_preset("dspark"))
    strategy = dataclasses.replace(strategy, execution=strategy.execution.model_copy(
        update={"draft_sampling": "sample"}))
    u, run = long_t1_pit(long_t1_engine, tiny_pair[0], strategy, seed=5)
    assert run.verified < run.drafted
    assert uniformity_p(u) < 1e-6
