"""FASER frontier overlap on the simulator (SimEngine.frontier_step) and chunk_size = "auto" through the
serving loop: lossless token for token, the serial and the overlapped time accounting, the per-step chunk
choice, and the one-line error without fitted models."""

from __future__ import annotations

import pytest

from autospec.engines.base import GenRequest
from autospec.engines.sim import AcceptanceTraces, SimCosts, SimEngine
from autospec.errors import InputError
from autospec.latency import FaserModels, LinearCoeffs, LinearLatencyModel, PiecewiseLatency
from autospec.serving.frontier import frontier_chunk
from autospec.serving.loop import serve
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.step import StepSettings
from autospec.strategy import ExecutionSpec, build_strategy, spec_from_dict

from stage_helpers import K_MAX, synthetic_acceptance

DRAFT = (2e-7, 3e-5, 1.5e-3)  # (alpha, gamma, delta) of a draft pass
TARGET = (1.1e-6, 2.4e-4, 9e-3)
PROMPTS = (50, 20)  # two requests; their context after the prefill token is prompt + 1


def sim(match: int | None = None, temperature: float = 0.0, seed: int = 0) -> SimEngine:
    """A simulator on the synthetic traces with a plain linear clock (λ = 0); `match` overrides every
    position's match length (K_MAX: every draft accepted)."""
    frame = synthetic_acceptance()
    if match is not None:
        frame = frame.assign(match_len=match)
    costs = SimCosts(LinearLatencyModel(LinearCoeffs(*DRAFT), LinearCoeffs(*TARGET)), (0.0, 0.0), (0.0, 0.0))
    return SimEngine(AcceptanceTraces(frame, K_MAX), costs, temperature=temperature, seed=seed)


def draft_pass(ctxs, j):
    a, g, d = DRAFT
    return a * sum(c + j for c in ctxs) + g * len(ctxs) + d


def verify_pass(ctxs, committed, n):
    a, g, d = TARGET
    return a * sum(c + committed for c in ctxs) + g * len(ctxs) * (n + 1) + d


@pytest.mark.parametrize("s,chunk,match", [(4, 2, K_MAX), (4, 2, 1), (3, 1, 1)])
def test_serial_frontier_time_is_the_sum_of_its_passes(s, chunk, match):
    engine = sim(match=match)
    ids = engine.add([GenRequest(range(p), 100) for p in PROMPTS]).req_ids
    ctxs = [p + 1 for p in PROMPTS]
    t0 = engine.now()
    out = engine.frontier_step({rid: s for rid in ids}, chunk)
    if (s, chunk, match) == (4, 2, K_MAX):  # chunk 1 accepted whole, chunk 2 verified on top of it: bonus
        drafts = [draft_pass(ctxs, j) for j in range(4)]
        verifies = [verify_pass(ctxs, 0, 2), verify_pass(ctxs, 2, 2)]
        counts = dict(drafted=4, verified=4, accepted=4, committed=5)
    elif (s, chunk) == (4, 2):  # rejection in chunk 1: the pre-drafted chunk 2 is thrown away
        drafts = [draft_pass(ctxs, j) for j in range(4)]
        verifies = [verify_pass(ctxs, 0, 2)]
        counts = dict(drafted=4, verified=2, accepted=1, committed=2)
    else:  # chunks of 1: the first accepted (no bonus), the second rejected, the third drafted, unverified
        drafts = [draft_pass(ctxs, j) for j in range(3)]
        verifies = [verify_pass(ctxs, 0, 1), verify_pass(ctxs, 1, 1)]
        counts = dict(drafted=3, verified=2, accepted=1, committed=2)
    assert out.draft_time_s == pytest.approx(sum(drafts), rel=1e-12)
    assert out.verify_time_s == pytest.approx(sum(verifies), rel=1e-12)
    assert engine.now() - t0 == pytest.approx(sum(drafts) + sum(verifies), rel=1e-12)
    for i in range(2):
        assert (out.drafted[i], out.verified[i], out.accepted[i], len(out.committed[i])) == tuple(counts.values())
        assert len(out.klds[i]) == len(out.target_probs[i]) == out.verified[i]


def test_one_chunk_is_a_plain_step():
    """chunk >= s: draft s, verify s in one pass — the same tokens, counts and time as draft + verify."""
    a, b = sim(), sim()
    ids_a = a.add([GenRequest(range(p), 100) for p in PROMPTS]).req_ids
    ids_b = b.add([GenRequest(range(p), 100) for p in PROMPTS]).req_ids
    for _ in range(5):
        fa = a.frontier_step({rid: 3 for rid in ids_a}, 4)
        b.draft_rounds(ids_b, [3, 3])
        fb = b.verify({rid: 3 for rid in ids_b})
        for field in ("committed", "accepted", "drafted", "verified"):
            assert getattr(fa, field) == getattr(fb, field)
        assert fa.draft_time_s == pytest.approx(fb.draft_time_s) and fa.verify_time_s == pytest.approx(fb.verify_time_s)
    assert a.now() == pytest.approx(b.now())


def test_frontier_stops_at_max_tokens_mid_chunk():
    engine = sim(match=K_MAX)
    rid = engine.add([GenRequest(range(10), 4)]).req_ids[0]  # the prefill made 1 token: 3 left
    out = engine.frontier_step({rid: 4}, 2)
    # chunk 1 (2 tokens, no bonus) then chunk 2 cut at the budget: 3 tokens, finished, no third pass
    assert out.finished == [True] and len(out.committed[0]) == 3 and out.verified == [4]
    assert engine.output(rid) == engine.output(rid)[:1] + out.committed[0]


def _models(draft_load, target_load) -> FaserModels:
    """Piecewise models with an r axis (knees): at r = 0.5 the draft runs at 0.7 and the target at 0.65
    of its load."""
    return FaserModels(PiecewiseLatency("draft", draft_load, (1.0, 0.5), (0.8, 0.2), 0.4),
                       PiecewiseLatency("target", target_load, (1.0, 0.6), (0.9, 0.5), 0.5))


HIDDEN = _models((1e-4, 1e-3, 1e-3), (1e-4, 1e-3, 1e-2))  # drafting a chunk hides behind verifying one
PAYS = _models((0.0, 4e-3, 4e-3), (1e-4, 1e-3, 2e-3))  # an expensive draft: overlapping it pays


def test_overlapped_frontier_time_follows_faser():
    """r > 0 and an r axis: T_q(s_c; b, r) + (s/s_c)·T_p(s_c; b, 1 − r) for s drafts, all accepted."""
    engine = sim(match=K_MAX)
    engine.configure_execution(ExecutionSpec(chunk_size=2, sm_split=0.5), faser=HIDDEN)
    ids = engine.add([GenRequest(range(p), 100) for p in PROMPTS]).req_ids
    t0 = engine.now()
    out = engine.frontier_step({rid: 4 for rid in ids}, 2)
    b, r = 2, 0.5
    assert HIDDEN.draft_time(b, 2, r) < HIDDEN.verify_time(b, 2, r)
    assert out.draft_time_s == pytest.approx(HIDDEN.draft_time(b, 2, r))
    assert out.draft_time_s + out.verify_time_s == pytest.approx(
        HIDDEN.draft_time(b, 2, r) + (4 / 2) * HIDDEN.verify_time(b, 2, r))
    assert engine.now() - t0 == pytest.approx(out.draft_time_s + out.verify_time_s)
    # the same models without an r axis, or no split: serial passes on the clock model
    no_r_axis = FaserModels(PiecewiseLatency("draft", HIDDEN.draft.load, (1.0, 0.0), (1.0, 0.0)),
                            PiecewiseLatency("target", HIDDEN.target.load, (1.0, 0.0), (1.0, 0.0)))
    for execution, models in ((ExecutionSpec(chunk_size=2, sm_split=0.5), no_r_axis),
                              (ExecutionSpec(chunk_size=2), HIDDEN)):
        serial = sim(match=K_MAX)
        serial.configure_execution(execution, faser=models)
        ids = serial.add([GenRequest(range(p), 100) for p in PROMPTS]).req_ids
        out = serial.frontier_step({rid: 4 for rid in ids}, 2)
        ctxs = [p + 1 for p in PROMPTS]
        assert out.verify_time_s == pytest.approx(verify_pass(ctxs, 0, 2) + verify_pass(ctxs, 2, 2))


def _requests(n: int = 12) -> list[ServeRequest]:
    # all at t = 0 in one batch: the batch's make-up does not depend on the clock, so even the T>0
    # draws are taken in the same order with and without chunks
    return [ServeRequest(i, 0.0, SyntheticPrompt(20 + 3 * i, 100, i), 9 + i % 5, ("code", "chat")[i % 2])
            for i in range(n)]


def _replay(execution: dict, temperature: float = 0.0, faser: FaserModels | None = None, spy=None):
    engine = sim(temperature=temperature, seed=5)
    if spy is not None:
        real = engine.frontier_step

        def frontier_step(lengths, chunk):
            spy.append((dict(lengths), chunk))
            return real(lengths, chunk)

        engine.frontier_step = frontier_step
    spec = spec_from_dict({"strategy": {"name": "t"}, "length": {"policy": "static", "k": 4},
                           "execution": execution})
    rec = serve(engine, build_strategy(spec), _requests(), max_batch=16,
                settings=StepSettings(k_max=K_MAX, temperature=temperature, faser=faser), keep_outputs=True)
    return [r.output for r in sorted(rec.requests, key=lambda r: r.req_id)], rec.steps_frame(), engine


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("chunk", [1, 2, 3])
def test_frontier_replay_is_token_identical_to_plain_steps(chunk, temperature):
    ref, ref_steps, _ = _replay({}, temperature)
    out, steps, _ = _replay({"chunk_size": chunk}, temperature)
    assert out == ref
    # same commits per step; a chunked step drafts at least what it verifies and verifies at most K
    assert [sum(c) for c in steps["c"]] == [sum(c) for c in ref_steps["c"]]
    for k, lengths in zip(steps["k"], steps["l"]):
        assert all(li <= ki <= K_MAX for ki, li in zip(k, lengths))


def test_auto_picks_fasers_chunk_each_step():
    calls: list = []
    ref, _, _ = _replay({})
    out, steps, _ = _replay({"chunk_size": "auto", "sm_split": 0.5}, faser=PAYS, spy=calls)
    assert out == ref
    assert calls, "auto with an SM split and paying models never chunked a step"
    for lengths, chunk in calls:
        assert chunk == frontier_chunk(PAYS, max(lengths.values()), len(lengths), 0.5)
    # hand-worked in the test's models: T̂(4) = 27.6 ms; s_c = 3 gives 22.7 ms; with HIDDEN's fixed
    # target cost no chunk beats sequential
    assert frontier_chunk(PAYS, 4, 2, 0.5) == 3
    assert frontier_chunk(HIDDEN, 4, 2, 0.5) is None


@pytest.mark.parametrize("execution,models", [
    ({"chunk_size": "auto"}, PAYS),  # no SM split: nothing to overlap in
    ({"chunk_size": "auto", "sm_split": 0.5}, HIDDEN),  # overlap cannot pay
])
def test_auto_runs_plain_steps_when_overlap_cannot_help(execution, models):
    calls: list = []
    ref, ref_steps, _ = _replay({})
    out, steps, _ = _replay(execution, faser=models, spy=calls)
    assert out == ref and not calls
    r = execution.get("sm_split", 0.0)
    if not r:  # no split: the plain steps' passes on the simulator's clock model, as without "auto"
        assert steps["draft_s"].sum() == pytest.approx(ref_steps["draft_s"].sum())
    else:  # under a split the plain passes run on r of the SMs: FASER's draft model at r, per pass
        expected = [sum(models.draft_time(sum(1 for ki in k if ki > j), 1, r) for j in range(max(k)))
                    for k in steps["k"]]
        assert steps["draft_s"].tolist() == pytest.approx(expected, rel=1e-12)
        assert steps["draft_s"].sum() != pytest.approx(ref_steps["draft_s"].sum())


def test_auto_without_fitted_models_is_one_line():
    with pytest.raises(InputError) as err:
        _replay({"chunk_size": "auto"})
    assert err.value.field == "execution.chunk_size" and "\n" not in str(err.value)
    assert "fitted FASER" in str(err.value)
