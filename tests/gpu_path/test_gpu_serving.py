"""The execution config through the serving loop: early exit and frontier overlap from a strategy's
[execution] section stay lossless, and steps.parquet records the early-exit fraction."""

from __future__ import annotations

import pytest

from autospec.engines.torch_engine import TorchSDEngine
from autospec.serving.loop import serve
from autospec.serving.records import ServeRequest
from autospec.serving.step import StepSettings
from autospec.strategy import build_strategy, spec_from_dict

from autospec_testing import make_tiny_model

PROMPTS = [[1, 4, 2], [3, 3, 1, 0, 2, 5, 4], [2], [5, 1, 1, 4, 2]]


@pytest.fixture(scope="module")
def deep_tiny(tmp_path_factory, tiny_pair):
    root = tmp_path_factory.mktemp("deep_tiny_serving")
    return make_tiny_model(root / "target", vocab=6, layers=4, seed=3), tiny_pair[1]


def replay(engine, execution: dict, k: int):
    spec = spec_from_dict({"strategy": {"name": "t"}, "length": {"policy": "static", "k": k} if k else
                           {"policy": "none"}, "execution": execution})
    reqs = [ServeRequest(i, 0.0, p, 20) for i, p in enumerate(PROMPTS)]
    rec = serve(engine, build_strategy(spec), reqs, max_batch=4, settings=StepSettings(k_max=8), keep_outputs=True)
    return [r.output for r in sorted(rec.requests, key=lambda r: r.req_id)], rec.steps_frame()


@pytest.mark.parametrize("execution", [
    {"early_exit": True, "ee_k_start": 1, "ee_k_end": 1},
    {"chunk_size": 2},
    {"chunk_size": 1, "early_exit": True, "ee_k_start": 1, "ee_k_end": 1},
])
def test_execution_config_is_lossless_through_the_loop(deep_tiny, execution):
    ref, _ = replay(TorchSDEngine(*deep_tiny), {}, 0)
    engine = TorchSDEngine(*deep_tiny)
    out, steps = replay(engine, execution, 4)
    assert out == ref
    assert "early_exit_fraction" in steps.columns
    frac = steps["early_exit_fraction"]
    assert ((frac >= 0) & (frac <= 1)).all()
    if execution.get("early_exit"):
        assert frac.max() > 0
    else:
        assert (frac == 0).all()
    if execution.get("chunk_size"):
        assert engine.frontier_chunk == execution["chunk_size"]


def test_a_later_strategy_without_early_exit_turns_it_off(deep_tiny):
    engine = TorchSDEngine(*deep_tiny)
    replay(engine, {"early_exit": True}, 2)
    assert engine.early_exit is not None
    _, steps = replay(engine, {}, 2)
    assert engine.early_exit is None and (steps["early_exit_fraction"] == 0).all()
