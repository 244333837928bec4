"""Trace operations: each returns a new trace with the documented effect and leaves the old one alone."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autospec.workloads.prompts import Prompt
from autospec.workloads.trace import Trace, TraceRequest


def sample_trace() -> Trace:
    return Trace.from_arrays([4.0, 0.5, 2.0, 1.0, 3.0], [10, 20, 30, 40, 50], [1, 2, 3, 4, 5],
                             ["code", "chat", "math", "code", "chat"], name="t")


def test_rows_are_sorted_and_typed():
    frame = sample_trace().to_frame()
    assert list(frame["arrival_s"]) == [0.5, 1.0, 2.0, 3.0, 4.0]
    assert list(frame["prompt_len"]) == [20, 40, 30, 50, 10]
    assert frame["prompt_len"].dtype == np.int64 and frame["output_len"].dtype == np.int64
    assert frame["prompt"].isna().all()


def test_window_keeps_half_open_interval_and_rebases():
    window = sample_trace().window(1.0, 2.0)
    assert list(window.column("arrival_s")) == [0.0, 1.0]
    assert list(window.column("prompt_len")) == [40, 30]
    assert len(sample_trace().window(3.0)) == 2  # open-ended


def test_time_and_rate_scale_are_inverse():
    trace = sample_trace()
    assert list(trace.time_scale(2.0).column("arrival_s")) == [1.0, 2.0, 4.0, 6.0, 8.0]
    assert trace.rate_scale(2.0).column("arrival_s") == pytest.approx(trace.column("arrival_s") / 2)
    assert trace.time_scale(3.0).rate_scale(3.0).column("arrival_s") == pytest.approx(trace.column("arrival_s"))


def test_cap_and_clip():
    trace = sample_trace().cap(3).clip_lengths(max_prompt_tokens=25, max_output_tokens=2)
    assert len(trace) == 3
    assert list(trace.column("prompt_len")) == [20, 25, 25]
    assert list(trace.column("output_len")) == [2, 2, 2]


def test_operations_do_not_change_the_original():
    trace = sample_trace()
    before = trace.to_frame()
    trace.window(1, 1).time_scale(5).cap(1).clip_lengths(1, 1)
    frame = trace.to_frame()
    frame.loc[0, "prompt_len"] = 999  # the copy handed out is not the trace's own table
    pd.testing.assert_frame_equal(trace.to_frame(), before)


def test_assign_prompts_is_seeded_and_matches_domains():
    sets = {"code": [Prompt(f"c{i}", "code", f"c#{i}") for i in range(3)],
            "chat": [Prompt(f"h{i}", "chat", f"h#{i}") for i in range(2)]}
    trace = sample_trace()
    a, b = trace.assign_prompts(sets, seed=7), trace.assign_prompts(sets, seed=7)
    assert a == b and a.has_prompts and not trace.has_prompts
    frame = a.to_frame()
    for row in frame.itertuples():
        assert row.prompt[0] == {"code": "c", "chat": "h"}[row.domain]
    # "math" has no set: it draws from the pooled prompts and takes the prompt's domain
    assert set(frame["domain"]) <= {"code", "chat"}
    seeds = {tuple(trace.assign_prompts(sets, seed=s).column("prompt")) for s in range(10)}
    assert len(seeds) > 1


def test_assign_prompts_uses_every_prompt_before_repeating():
    trace = Trace.from_arrays(np.arange(10.0), [5] * 10, [1] * 10, "code")
    prompts = [Prompt(str(i), "code", str(i)) for i in range(5)]
    texts = list(trace.assign_prompts({"code": prompts}, seed=1).column("prompt"))
    assert sorted(texts[:5]) == sorted(texts[5:]) == [str(i) for i in range(5)]


def test_requests_iterates_rows():
    requests = list(sample_trace().cap(2).requests())
    assert requests == [TraceRequest(0, 0.5, 20, 2, "chat"), TraceRequest(1, 1.0, 40, 4, "code")]


def test_stats():
    stats = Trace.from_arrays([0.0, 1.0, 2.0, 3.0], [1, 1, 1, 1], [2, 2, 2, 2]).stats()
    assert stats["requests"] == 4 and stats["duration_s"] == 3.0 and stats["interarrival_cv"] == 0.0


@pytest.mark.parametrize("arrival, prompt, output, words", [
    ([-1.0], [1], [1], "arrival_s"),
    ([float("nan")], [1], [1], "arrival_s"),
    ([0.0], [-1], [1], "prompt_len"),
    ([0.0], [1], [0], "output_len"),
    ([0.0], [1.5], [1], "whole"),
])
def test_invalid_rows_are_refused(arrival, prompt, output, words):
    with pytest.raises(ValueError, match=words):
        Trace.from_arrays(arrival, prompt, output)


@settings(max_examples=30, deadline=None, database=None)
@given(times=st.lists(st.floats(0, 1e4, allow_nan=False), min_size=1, max_size=40),
       start=st.floats(0, 1e4), duration=st.floats(1e-3, 1e4), factor=st.floats(1e-2, 1e2))
def test_window_then_scale_properties(times, start, duration, factor):
    trace = Trace.from_arrays(times, [1] * len(times), [1] * len(times))
    window = trace.window(start, duration)
    expected = sorted(t - start for t in times if start <= t < start + duration)
    assert list(window.column("arrival_s")) == pytest.approx(expected)
    scaled = window.time_scale(factor)
    assert len(scaled) == len(window)
    assert scaled.column("arrival_s") == pytest.approx(np.array(expected) * factor)
