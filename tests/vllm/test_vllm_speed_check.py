"""The host-speed check of a vLLM replay (issue 17, "Measurement health"; serving/vllm/speed_check.py):
the probe's full-batch decode steps, outside the draft, over the vLLM profile's target row at that
shape; and, on vLLM itself, a ratio before and after every run without the probe's requests leaking
into the run's records."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pandas as pd
import pytest

from autospec.errors import InputError
from autospec.profile import HOST_SPEED_SHAPE
from autospec.serving.vllm.speed_check import WARMUP_STEPS, VllmSpeedReference

from autospec_testing import needs_vllm
from stage_helpers import synthetic_workload, write_synthetic_run

PLAIN = (2e-6, 1e-4, 3e-3)  # the synthetic profile's decode_plain α, γ, δ


@pytest.fixture
def reference(tmp_path) -> VllmSpeedReference:
    run = write_synthetic_run(tmp_path / "vllm", engine="vllm", plain=PLAIN)
    found = VllmSpeedReference.from_profile(run, 4, HOST_SPEED_SHAPE)
    assert found is not None
    return found


def step(batch: int, k: int, seconds: float, draft_s: float | None, first: bool = False,
         straight_on: bool = True) -> dict:
    """A logged step whose period (to the next step's start) is `seconds`; its t0..t1 is 10% shorter (the
    engine core's work between steps), so a check that read t0..t1 would be off by 10%."""
    return {"t0": 10.0, "t1": 10.0 + 0.9 * seconds, "next_t0": 10.0 + seconds if straight_on else None,
            "ids": [str(i) for i in range(batch)], "k": [k] * batch, "first": [first] * batch, "d": draft_s}


def row(reference: VllmSpeedReference, phase: str, tokens: int) -> float:
    """The profile's median at the probe's shape: its batch, `tokens`, the context nearest mid-probe."""
    rows = reference.rows[(reference.rows["phase"] == phase) & (reference.rows["tokens"] == tokens)]
    nearest = (rows["context"] - reference.context).abs().idxmin()
    return float(rows.loc[nearest, "median_s"])


def test_the_shape_is_the_profiled_one_nearest_the_torch_checks_within_max_batch(tmp_path, reference):
    assert reference.batch == 4 and reference.context == 128  # batch 8 does not fit max_batch 4
    assert set(reference.rows["batch"]) == {4}
    torch_run = write_synthetic_run(tmp_path / "torch")
    assert VllmSpeedReference.from_profile(torch_run, 8, HOST_SPEED_SHAPE) is None  # not vLLM's steps
    assert VllmSpeedReference.from_profile(tmp_path / "nothing", 8, HOST_SPEED_SHAPE) is None


def test_a_drafting_probe_is_compared_with_the_target_row_at_k_plus_one(reference):
    expected = row(reference, "decode", 3)
    warm = [step(4, 2, 9.0, 0.5)] * WARMUP_STEPS  # not timed, however slow
    timed = [step(4, 2, 1.5 * expected + 0.004, 0.004)] * 5  # outside the draft: 1.5x the profile's
    # partial batch, a prefill step, the probe's last step (no next step: no period)
    noise = [step(2, 2, 50.0, 0.1), step(4, 2, 50.0, 0.1, first=True), step(4, 2, 50.0, 0.1, straight_on=False)]
    assert reference.ratio(warm + noise + timed) == pytest.approx(1.5)


def test_a_drafting_probe_is_compared_with_the_drafting_engines_rows_where_the_profile_has_them(reference):
    """A profile with decode_drafting rows (the draft_model engine's target side, at K + 1 for a few K):
    a drafting probe reads against them, interpolated over tokens at the nearest profiled context, not
    against the fixed-K engine's decode rows; a plain probe still reads against decode_plain."""
    base = reference.rows.iloc[0].to_dict()
    drafting = pd.DataFrame([{**base, "phase": "decode_drafting", "tokens": tokens, "context": context,
                              "median_s": median_s}
                             for context, scale in ((120, 1.0), (500, 3.0))  # 120 is the nearest to 128
                             for tokens, median_s in ((2, 0.010 * scale), (3, 0.012 * scale), (5, 0.020 * scale))])
    with_rows = VllmSpeedReference(pd.concat([reference.rows, drafting], ignore_index=True), reference.batch,
                                   reference.context)
    assert with_rows.reference_s(True, 3) == pytest.approx(0.012)
    assert with_rows.reference_s(True, 4) == pytest.approx(0.016)  # K = 3: between the K = 2 and K = 4 rows
    assert with_rows.reference_s(False, 1) == pytest.approx(row(reference, "decode_plain", 1))
    timed = [step(4, 3, 1.25 * 0.016 + 0.004, 0.004)] * (WARMUP_STEPS + 4)
    assert with_rows.ratio(timed) == pytest.approx(1.25)
    # the same probe against a profile without them: the fixed-K engine's row at K + 1
    assert reference.ratio(timed) == pytest.approx(1.25 * 0.016 / row(reference, "decode", 4))


def test_every_probe_round_has_its_own_untimed_warm_up(reference):
    """PROBE_ROUNDS rounds, one after the other: each starts with its prefill step, and each round's first
    WARMUP_STEPS full steps are untimed (a second round's warm-up once counted as timed)."""
    expected = row(reference, "decode_plain", 1)
    one_round = ([step(4, 0, 9.0, None, first=True)] + [step(4, 0, 9.0, None)] * WARMUP_STEPS
                 + [step(4, 0, 1.2 * expected, None)] * 3 + [step(4, 0, 9.0, None, straight_on=False)])
    assert reference.ratio(one_round * 3) == pytest.approx(1.2)


def test_a_plain_engine_is_compared_with_decode_plain(reference):
    expected = row(reference, "decode_plain", 1)
    steps = [step(4, 0, expected, None)] * (WARMUP_STEPS + 3)
    assert reference.ratio(steps) == pytest.approx(1.0)
    assert reference.ratio(steps[:WARMUP_STEPS]) is None  # nothing timed


def test_the_prefill_probe_is_compared_with_the_longest_target_prefill_row(tmp_path, reference):
    """One-request steps that produced a first token, outside the draft, over the profile's target prefill
    row at its longest prompt; the decode probe's batch prefill and decode steps do not count."""
    rows = pd.read_parquet(tmp_path / "vllm" / "profile" / "latency.parquet")  # the fixture's run
    prefill = rows[(rows["model"] == "target") & (rows["phase"] == "prefill")]
    longest = prefill.loc[prefill["tokens"].idxmax()]
    assert reference.prefill_tokens == int(longest["tokens"])
    expected = float(longest["median_s"])
    # a prefill step ends its one-token request: no next step, so its t0..t1 is its time (split_step)
    probe = [step(1, 2, 0.0, 0.003, first=True, straight_on=False) for _ in range(3)]
    for s, factor in zip(probe, (0.8, 0.9, 2.0)):
        s["t1"] = s["t0"] + factor * expected + 0.003  # outside the draft: 0.8x, 0.9x, 2x
    noise = [step(4, 2, 50.0, 0.1, first=True), step(1, 2, 50.0, 0.1)]
    assert reference.prefill_ratio(noise + probe) == pytest.approx(0.9)  # the median
    assert reference.prefill_ratio(noise) is None
    assert VllmSpeedReference(reference.rows, reference.batch, reference.context).prefill_ratio(probe) is None


def test_a_profiles_decode_batches_are_ragged_around_the_rows_context():
    """latency_profile.decode_prompt_lengths: prompts spread evenly over context · (1 ± RAGGED_SPREAD), their
    mean exactly the row's context (the clock's summed context), one length at batch 1 or in uniform form."""
    from autospec.serving.vllm.latency_profile import RAGGED_SPREAD, decode_prompt_lengths

    for batch in (2, 3, 4, 8):
        for context in (32, 128, 133, 384):
            lengths = decode_prompt_lengths(batch, context)
            assert len(lengths) == batch and sum(lengths) == batch * context
            assert min(lengths) == pytest.approx(context * (1 - RAGGED_SPREAD), abs=1)
            assert max(lengths) == pytest.approx(context * (1 + RAGGED_SPREAD), abs=batch)
            assert lengths == sorted(lengths) and len(set(lengths)) == batch
            assert decode_prompt_lengths(batch, context, "uniform") == [context] * batch
    assert decode_prompt_lengths(8, 128) == [32, 59, 87, 114, 142, 169, 197, 224]
    assert decode_prompt_lengths(1, 128) == [128]


def test_the_probe_is_served_in_its_profiles_decode_prompt_form(tmp_path):
    """A profile whose decode rows were timed on ragged batches (profile.json decode_prompts) is probed with
    the same ragged prompts; one written before (no field) with uniform ones, as its rows were timed."""
    from autospec.serving.vllm.latency_profile import decode_prompt_lengths

    run = write_synthetic_run(tmp_path / "vllm", engine="vllm", plain=PLAIN)
    old = VllmSpeedReference.from_profile(run, 8, HOST_SPEED_SHAPE)
    assert old is not None and old.decode_prompts == "uniform"
    assert old.prompt_lengths() == [old.context] * old.batch
    meta_path = run / "profile" / "profile.json"
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps({**meta, "decode_prompts": "ragged"}))
    new = VllmSpeedReference.from_profile(run, 8, HOST_SPEED_SHAPE)
    assert new is not None and new.prompt_lengths() == decode_prompt_lengths(new.batch, new.context)
    assert len(set(new.prompt_lengths())) == new.batch == 8
    meta_path.write_text(json.dumps({**meta, "decode_prompts": "jagged"}))
    with pytest.raises(InputError, match="decode_prompts"):
        VllmSpeedReference.from_profile(run, 8, HOST_SPEED_SHAPE)


@pytest.mark.slow
@needs_vllm
def test_every_vllm_run_is_bracketed_by_the_probe(tmp_path):
    run = write_synthetic_run(tmp_path / "vllm", engine="vllm", plain=PLAIN)
    workload = tmp_path / "w.toml"
    workload.write_text(synthetic_workload("vllm-speed", rate=20, duration_s=1, max_requests=5, prompt_tokens=32,
                                           output_tokens=8, bundled_prompts=True))
    out = tmp_path / "out"
    started = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "autospec", "evaluate", "--workload", str(workload), "--strategies",
                          "static-k2", "--engine", "vllm", "--profile", str(run), "--out", str(out), "--max-batch",
                          "4", "--k-max", "4", "--repeats", "2", "--json"], capture_output=True, text=True,
                         timeout=900, env={**os.environ, "COLUMNS": "200"})
    elapsed = time.perf_counter() - started
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((out / "eval" / "summary.json").read_text())
    ratios = summary["host_speed"]["ratios"]
    assert set(ratios) == {"no-sd", "static-k2"}
    assert all(len(r) == 4 and all(math.isfinite(x) and x > 0 for x in r) for r in ratios.values())  # 2 runs x 2
    prefill = summary["host_speed"]["prefill"]["ratios"]  # the prefill probe beside it, each time
    assert set(prefill) == {"no-sd", "static-k2"}
    assert all(len(r) == 4 and all(math.isfinite(x) and x > 0 for x in r) for r in prefill.values())
    # host_load covers the vLLM runs (replayed before evaluate reads them; it once measured 12 ms of reading),
    # each while its engine is alive, and not the engines' start-ups and shut-downs (whose orphaned worker
    # processes once read as another process's CPU)
    load = summary["host_load"]
    assert load["available"] and load["own_cpu_share"] > 0, load
    assert 0 < load["wall_s"] < elapsed, (load, elapsed)
    requests = pd.read_parquet(out / "eval" / "requests.parquet")  # the probe's requests are not the run's
    assert len(requests) == 2 * 2 * 5
    steps = pd.read_parquet(out / "eval" / "steps.parquet")
    assert {int(i) for ids in steps["req_ids"] for i in ids} <= set(requests["req_id"])
