"""Metrics on hand-made records equal hand-computed numbers; bootstrap CIs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from autospec.serving.metrics import (
    Slo,
    bootstrap_ci,
    compute_metrics,
    inter_token_latencies,
    per_position_acceptance,
    summarize_repeats,
)


@pytest.fixture
def records() -> tuple[pd.DataFrame, pd.DataFrame]:
    requests = pd.DataFrame({
        "req_id": [0, 1, 2],
        "arrival_s": [0.0, 1.0, 2.0],
        "first_token_s": [1.0, 1.5, 4.0],
        "finish_s": [3.0, 2.5, 4.0],
        "output_len": [5, 3, 1],
        "token_times": [[1.0, 1.5, 2.0, 2.5, 3.0], [1.5, 2.5, 2.5], [4.0]],
        "preemptions": [0, 1, 0],
    })
    steps = pd.DataFrame({"batch": [2, 1], "l": [[3, 2], [4]], "accepted": [[3, 0], [1]], "committed": [5, 2]})
    return requests, steps


def test_latency_metrics_by_hand(records):
    m = compute_metrics(*records, Slo(ttft_s=1.0, tpot_s=0.5))
    # TTFT = [1, 0.5, 2]; sorted [0.5, 1, 2]: p90 = 1 + 0.8·1, p99 = 1 + 0.98·1 (linear interpolation)
    assert m["ttft_mean"] == pytest.approx(3.5 / 3)
    assert m["ttft_p50"] == pytest.approx(1.0)
    assert m["ttft_p90"] == pytest.approx(1.8)
    assert m["ttft_p99"] == pytest.approx(1.98)
    # TPOT = (3-1)/4 = 0.5 and (2.5-1.5)/2 = 0.5; the one-token request has none
    assert m["tpot_mean"] == pytest.approx(0.5)
    assert m["tpot_p99"] == pytest.approx(0.5)
    # ITL: emissions of request 0 are 0.5 apart (4 gaps), request 1 has one gap of 1.0 (its last two
    # tokens came in one step)
    assert m["itl_mean"] == pytest.approx(0.6)
    assert m["itl_p50"] == pytest.approx(0.5)
    assert m["e2e_mean"] == pytest.approx((3.0 + 1.5 + 2.0) / 3)


def test_throughput_goodput_and_slo_by_hand(records):
    m = compute_metrics(*records, Slo(ttft_s=1.0, tpot_s=0.5))
    assert m["makespan_s"] == pytest.approx(4.0)
    assert m["throughput_tok_s"] == pytest.approx(9 / 4)
    # requests 0 and 1 meet TTFT ≤ 1 and TPOT ≤ 0.5; request 2's TTFT of 2 s misses
    assert m["slo_attainment"] == pytest.approx(2 / 3)
    assert m["goodput"] == pytest.approx(2 / 4)
    tight = compute_metrics(*records, Slo(ttft_s=1.0, tpot_s=0.4))
    assert tight["slo_attainment"] == 0.0 and tight["goodput"] == 0.0
    assert m["preemptions"] == 1


def test_acceptance_metrics_by_hand(records):
    _, steps = records
    m = compute_metrics(*records, Slo(ttft_s=1.0, tpot_s=0.5))
    assert m["accepted_per_step"] == pytest.approx(4 / 3)
    assert m["committed_per_step"] == pytest.approx(7 / 3)
    assert m["acceptance_rate"] == pytest.approx(4 / 9)
    # (ℓ, a) = (3, 3), (2, 0), (4, 1): α1 = 2/3, α2 = 1/2 (reached by (3,3) and (4,1)), α3 = 1/1,
    # α4: (4, 1) never reached position 4
    assert per_position_acceptance(steps) == [pytest.approx(2 / 3), pytest.approx(0.5), 1.0, None]


def test_metrics_of_a_filtered_frame_whose_index_does_not_start_at_zero(records):
    """One repeat's rows of a multi-repeat frame (their index starts past 0), step values as arrays (how
    parquet and the batch path give them): the same metrics as the frame read alone (a KeyError once)."""
    requests, steps = records
    arrays = steps.assign(l=[np.array(v) for v in steps["l"]], accepted=[np.array(v) for v in steps["accepted"]])
    for frame in (steps, arrays):
        both = pd.concat([frame, frame], ignore_index=True).assign(repeat=[0, 0, 1, 1])
        one = both[both["repeat"] == 1]
        assert one.index[0] == 2
        slo = Slo(ttft_s=1.0, tpot_s=0.5)
        assert compute_metrics(requests, one, slo)["acceptance_rate"] == compute_metrics(requests, frame, slo)[
            "acceptance_rate"]


def test_no_drafts_means_no_acceptance_rate(records):
    requests, _ = records
    steps = pd.DataFrame({"batch": [2], "l": [[0, 0]], "accepted": [[0, 0]], "committed": [2]})
    m = compute_metrics(requests, steps, Slo(ttft_s=1.0, tpot_s=0.5))
    assert m["acceptance_rate"] is None and m["accepted_per_step"] == 0.0


def test_inter_token_latencies_ignore_gaps_across_requests():
    assert inter_token_latencies([[0.0, 1.0], [0.5, 0.5, 2.0]]).tolist() == [1.0, 1.5]


def test_bootstrap_ci_brackets_the_mean():
    values = [1.0, 2.0, 3.0, 4.0, 5.0, 3.5, 2.5]
    ci = bootstrap_ci(values, seed=1)
    assert ci["mean"] == pytest.approx(np.mean(values))
    assert min(values) <= ci["ci_low"] < ci["mean"] < ci["ci_high"] <= max(values)
    wider = bootstrap_ci(values, confidence=0.99, seed=1)
    assert wider["ci_low"] <= ci["ci_low"] and wider["ci_high"] >= ci["ci_high"]


def test_bootstrap_degenerate_cases():
    assert bootstrap_ci([2.0]) == {"mean": 2.0, "ci_low": 2.0, "ci_high": 2.0}
    assert bootstrap_ci([None, None]) == {"mean": None, "ci_low": None, "ci_high": None}
    assert bootstrap_ci([1.0, None, 3.0])["mean"] == 2.0
    summary = summarize_repeats([{"a": 1.0, "b": None}, {"a": 3.0, "b": None}])
    assert summary["a"]["mean"] == 2.0 and summary["b"]["mean"] is None
