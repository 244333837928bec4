"""The torch engine's FASER wiring from the fit: chunk_size = "auto" through the serving step, the
frontier step's time accounting on a CPU, and early exit's Eq. 10 fed by fitted T_ee / T_pr."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from autospec.engines.base import GenRequest
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError
from autospec.fit import fit_latency, load_fit
from autospec.latency import FaserModels, PiecewiseLatency
from autospec.profile import LATENCY_COLUMNS
from autospec.serving.frontier import frontier_chunk
from autospec.serving.loop import serve
from autospec.serving.records import ServeRequest
from autospec.serving.state import RequestState
from autospec.serving.step import StepSettings, sd_step
from autospec.strategy import ExecutionSpec, build_strategy, spec_from_dict

from autospec_testing import make_tiny_model
from gpu_path_helpers import run_static

PROMPTS = [[1, 4, 2], [3, 3, 1, 0, 2, 5, 4], [2], [5, 1, 1, 4, 2]]

# Models with an r axis in which overlapping an expensive draft pays at r = 0.5 (tests/stages has the
# hand-worked numbers), and one-segment models (a profile without an r axis).
PAYS = FaserModels(PiecewiseLatency("draft", (0.0, 4e-3, 4e-3), (1.0, 0.5), (0.8, 0.2), 0.4),
                   PiecewiseLatency("target", (1e-4, 1e-3, 2e-3), (1.0, 0.6), (0.9, 0.5), 0.5))
FLAT = FaserModels(PiecewiseLatency("draft", (0.0, 4e-3, 4e-3), (1.0, 0.0), (1.0, 0.0)),
                   PiecewiseLatency("target", (1e-4, 1e-3, 2e-3), (1.0, 0.0), (1.0, 0.0)))


def strategy(execution: dict, k: int = 4):
    return build_strategy(spec_from_dict({"strategy": {"name": "t"}, "length": {"policy": "static", "k": k},
                                          "execution": execution}))


def test_auto_chunk_through_the_step_is_lossless_and_follows_faser(tiny_pair):
    """sd_step on the torch engine with chunk_size = "auto" and r = 0.5 (the engine's split itself needs
    CUDA, so it is left unset: the step reads r from the strategy)."""
    ref = run_static(TorchSDEngine(*tiny_pair), PROMPTS, 0, 16)
    engine = TorchSDEngine(*tiny_pair)
    engine.frontier_chunk = "auto"
    calls = []
    real = engine.frontier_step
    engine.frontier_step = lambda lengths, chunk: calls.append((dict(lengths), chunk)) or real(lengths, chunk)
    strat = strategy({"chunk_size": "auto", "sm_split": 0.5})
    settings = StepSettings(k_max=8, faser=PAYS)
    res = engine.add([GenRequest(p, 16, ignore_eos=True) for p in PROMPTS])
    states = [RequestState(rid, len(p), 16, generated=1) for rid, p in zip(res.req_ids, PROMPTS)]
    while live := [s for s in states if not s.finished]:
        sd_step(engine, strat, live, 0.0, settings)
    assert [engine.output(rid) for rid in res.req_ids] == ref
    assert calls and all(chunk == frontier_chunk(PAYS, max(ls.values()), len(ls), 0.5) for ls, chunk in calls)
    assert {chunk for _, chunk in calls} == {3}


@pytest.mark.parametrize("models", [PAYS, FLAT])
def test_auto_without_a_split_runs_plain_steps(tiny_pair, models):
    """On a CPU there is no SM split: "auto" runs every step unchunked, whatever the models say."""
    engine = TorchSDEngine(*tiny_pair)
    calls = []
    real = engine.frontier_step
    engine.frontier_step = lambda lengths, chunk: calls.append(chunk) or real(lengths, chunk)
    reqs = [ServeRequest(i, 0.0, p, 12) for i, p in enumerate(PROMPTS)]
    rec = serve(engine, strategy({"chunk_size": "auto"}), reqs, max_batch=4,
                settings=StepSettings(k_max=8, faser=models), keep_outputs=True)
    assert engine.frontier_chunk == "auto" and not calls
    assert [r.output for r in sorted(rec.requests, key=lambda r: r.req_id)] == \
        run_static(TorchSDEngine(*tiny_pair), PROMPTS, 0, 12)


def test_auto_without_fitted_models_is_refused_before_anything_runs(tiny_pair):
    engine = TorchSDEngine(*tiny_pair)
    with pytest.raises(InputError, match="fitted FASER") as err:
        serve(engine, strategy({"chunk_size": "auto"}), [ServeRequest(0, 0.0, PROMPTS[0], 4)], max_batch=1,
              settings=StepSettings(k_max=8))
    assert "\n" not in str(err.value) and not engine.active_ids()


def test_cpu_frontier_step_times_add_up_to_the_step(tiny_pair):
    """draft_time_s + verify_time_s is the step's time: the next chunk, drafted serially on a CPU, is
    draft time and not also verify time."""
    engine = TorchSDEngine(*tiny_pair)
    ids = engine.add([GenRequest(p, 40, ignore_eos=True) for p in PROMPTS]).req_ids
    steps = 0
    while ids:
        t0 = time.perf_counter()
        out = engine.frontier_step({rid: 6 for rid in ids}, 1)
        wall = time.perf_counter() - t0
        assert 0 < out.draft_time_s and 0 < out.verify_time_s
        assert out.draft_time_s + out.verify_time_s <= wall
        ids = [rid for rid, done in zip(out.req_ids, out.finished) if not done]
        steps += 1
    assert steps > 1


# --- early exit's Eq. 10 from fitted T_ee / T_pr ---------------------------------------------------------

@pytest.fixture(scope="module")
def deep_tiny(tmp_path_factory, tiny_pair):
    root = tmp_path_factory.mktemp("deep_tiny_fitted_ee")
    return make_tiny_model(root / "target", vocab=6, layers=4, seed=3), tiny_pair[1]


def _with_ee(check_load, prune_load) -> FaserModels:
    return FaserModels(FLAT.draft, FLAT.target,
                       PiecewiseLatency("early_exit", check_load, (1.0, 0.0), (1.0, 0.0)),
                       PiecewiseLatency("prune", prune_load, (1.0, 0.0), (1.0, 0.0)))


EAGER_EXECUTION = ExecutionSpec(early_exit=True, ee_k_start=1, ee_k_end=1, ee_check_cost_ratio=0.0,
                                ee_prune_cost_ratio=0.0)


def test_fitted_early_exit_times_drive_eq10(deep_tiny):
    cheap, costly = _with_ee((0.0, 0.0), (0.0, 0.0)), _with_ee((0.0, 0.0), (0.0, 1.0))
    engine = TorchSDEngine(*deep_tiny)
    engine.configure_execution(EAGER_EXECUTION, faser=costly)
    t_t, t_ee, t_pr = engine.early_exit_times(2, 5, 1.5)
    # T_t at k̂_rej (Eq. 6–10): the target's time for the 1.5 tokens expected to be rejected, b·s = 1.5
    assert t_t == pytest.approx(float(FLAT.target(2, 0.75, 0.0))) and t_ee == 0.0 and t_pr == pytest.approx(1.0)
    run_static(engine, PROMPTS, 4, 12)
    assert engine.early_exit_stats["pruned"] == 0  # a 1 s pruning cost never pays
    engine = TorchSDEngine(*deep_tiny)
    engine.configure_execution(EAGER_EXECUTION, faser=cheap)
    out = run_static(engine, PROMPTS, 4, 12)
    assert engine.early_exit_stats["pruned"] > 0 and out == run_static(TorchSDEngine(*deep_tiny), PROMPTS, 0, 12)
    # models without T_ee / T_pr leave Eq. 10 on the params' cost ratios
    engine = TorchSDEngine(*deep_tiny)
    engine.configure_execution(EAGER_EXECUTION, faser=FLAT)
    assert engine.early_exit_times is None


def test_fit_gives_ee_and_prune_models_when_the_profile_timed_them():
    rows = []
    for b in (1, 2, 4, 8):
        for s in (1, 2, 3, 4, 5):
            for model, t in (("target", 1e-3 * b * s + 1e-3 * s + 1e-2), ("draft", 1e-4 * b + 3e-3),
                             ("early_exit", 2e-5 * b * s + 1e-4), ("prune", 1e-6 * b * s + 5e-5)):
                rows.append({"model": model, "phase": "decode", "batch": b, "tokens": s, "context": 64,
                             "sm_split": np.nan, "median_s": t, "mad_s": 0.0, "repeats": 3})
    lat = fit_latency(pd.DataFrame(rows, columns=LATENCY_COLUMNS))
    assert set(lat["piecewise"]) == {"draft", "target", "early_exit", "prune"}
    assert lat["piecewise_mape"]["early_exit"] < 1e-6 and lat["piecewise_mape"]["prune"] < 1e-6
    models = FaserModels.from_dict(lat["piecewise"])
    times = models.early_exit_times(0.0)
    # T_t and T_pr at k̂_rej = 2 (b·s = 2, s = 0.5), T_ee over the 2 fed draft positions per request
    assert times(4, 3, 2.0) == pytest.approx((1e-3 * 2 + 1e-3 * 0.5 + 1e-2, 2e-5 * 4 * 2 + 1e-4, 1e-6 * 2 + 5e-5))
    # the committed CPU profile's fit: draft and target only, no r axis, no early-exit models
    ci = load_fit(Path(__file__).resolve().parents[2] / "reports" / "ci-profile").faser
    assert ci is not None and not ci.has_r_axis and ci.early_exit is None and ci.early_exit_times(0.0) is None
