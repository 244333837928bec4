"""Serving metrics from the loop's records (or the parquet files they are written to), and bootstrap CIs.

Definitions (times in seconds, per request unless pooled):

Latencies count from the request's send time `sent_s` (`records.RequestRecord`): its trace arrival in
an open-loop replay, later under a concurrency limit, where a request waits for a free slot before it
is sent (as `vllm bench serve --max-concurrency` measures from when it issues the request). Records
written before `sent_s` existed have only `arrival_s`, which was then the send time (`sent_times`).

* TTFT  = first_token_s − sent_s (queueing + prefill).
* TPOT  = (finish_s − first_token_s) / (output_len − 1); requests with one output token have none.
* ITL   = gap between successive token *emissions* of a request, pooled over requests. An SD step that
          commits several tokens emits them at once (as a streaming server would send them), so the
          gap is measured between steps that committed something, not per token (that would be 0).
* E2E   = finish_s − sent_s.
* Each of these is summarised as mean, p50, p90, p99 (numpy's linear-interpolation percentiles).
* throughput_tok_s = output tokens / makespan, makespan = last finish − first send.
* A request meets the SLO when TTFT ≤ slo.ttft_s and TPOT ≤ slo.tpot_s (a one-token request has no
  TPOT and only needs the TTFT; `meets_slo`, also the check `autospec tune`'s pruning applies to each
  finished request); slo_attainment is the fraction that do, goodput the number that do per second of
  makespan (DistServe's definition). The SLO model and its default are `autospec.config.SloSpec`.
* accepted_per_step = mean accepted draft tokens per request per SD step; committed_per_step adds the
  bonus/correction token (the "τ" of the SD papers).
* acceptance_rate = Σ accepted / Σ verified; None when nothing was verified (no-SD).
* per-position acceptance α_j = P(draft j accepted | draft j verified and drafts 1..j−1 accepted):
  the chance a verified draft at position j survives once verification reaches it.
* Relative to no-SD (`autospec.evaluate.RELATIVE`, same repeat index; above 1 is better than no-SD):
  tpot_speedup_vs_no_sd = no-SD's mean TPOT / the strategy's (per-user decode speed 1/TPOT; also at
  p50 and p99), e2e_speedup_vs_no_sd likewise for mean E2E, capacity_vs_no_sd = capacity at the SLO
  over no-SD's (`autospec.serving.capacity`, simulator only), and throughput_vs_no_sd = throughput_tok_s
  over no-SD's — an open-loop replay's throughput is set by the arrival rate, so this one stays near 1
  whenever the engine keeps up with the load, whatever SD does; in a closed-loop replay (every request
  ready at 0, N in flight: `autospec evaluate --closed-loop`) it is what SD buys at that concurrency.

Across repeats every metric is a list of per-repeat values; `bootstrap_ci` gives their mean and a 95%
percentile-bootstrap CI of that mean (scipy.stats.bootstrap). With one repeat the CI is the value
itself: there is no spread to resample.

* A step's seconds (`step_seconds`) are its period, to the start of the next step when that one
  continues the batch: on vLLM a recorded step misses the engine core's work between steps, which the
  profile (and so the simulator) counts.
* step_speed = Σ measured / Σ predicted seconds over a replay's plain steps (no request admitted or
  preempted in them), the prediction the simulator's step clock (`engines.base.StepClock`, what the
  simulator charges that step: `Replay.step_clock`) for the step's requests at their contexts
  (`step_contexts`) drafting what they drafted. It is the host's speed *inside* the run on the run's own
  steps, where the host-speed probe (`autospec.profile.HostSpeedCheck`) sees only before and after.
  Against the clock it mixes the simulator's error with the host's: on the simulator's own replay it is
  1 to rounding on a vLLM profile (up to 4% over on a torch profile: the padded engine's first draft pass
  re-feeds a lag the clock of hypothetical requests does not know), and on a real engine a strategy
  whose steps the simulator under-prices reads above the others. Between identical replays (same
  window, strategy and load) the clock's share is the same, so repeats whose step_speed differ by more
  than a tolerance ran on a host whose speed changed (`uneven_repeats`). A sum, not a median: a slow
  spell over a third of the run moves the run's TPOT, and must move this. (Until issue 16 it priced
  with the policies' linear model, `latency.sd_step_time`, which has no draft-round term and no plain
  engine's clock: SD steps read 1.1-1.2x that model where no-SD read ~1, on a quiet host.)
* step_account = where a replay's per-token time goes, by kind of step, so a simulator-vs-engine TPOT gap
  can be traced to its cause: plain steps' mean seconds and mean batch, the tokens a request commits in
  one (acceptance: 1 for no-SD), and the share of steps that admit (prefill) with their mean seconds;
  `s_per_token_plain` / `s_per_token_admission` = Σ (step seconds × batch) / Σ tokens committed, over
  that kind of step — the batch-weighted seconds each committed token waited for, which add up to about
  the replay's mean TPOT. A gap in plain-step seconds is the latency model's or the host's, in tokens
  per step the acceptance model's, in the admission part the prefill model's or the scheduler's.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pandas as pd

from autospec.config import SloSpec
from autospec.contract import StepClockFn
from autospec.serving.records import flatten_steps

__all__ = ["LATENCIES", "PERCENTILES", "Slo", "bootstrap_ci", "compute_metrics", "continues_batch",
           "inter_token_latencies", "latencies", "meets_slo", "per_position_acceptance", "per_request_latencies",
           "sent_times", "step_account", "step_contexts", "step_seconds", "step_speed", "summarize_repeats",
           "uneven_repeats"]

PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "tpot", "itl", "e2e")


# One model and one default for the SLO (config.SloSpec); `Slo` is the name the replay code uses.
Slo = SloSpec


def _summary(name: str, values: np.ndarray) -> dict[str, float | None]:
    if values.size == 0:
        return {f"{name}_mean": None, **{f"{name}_p{p}": None for p in PERCENTILES}}
    out: dict[str, float | None] = {f"{name}_mean": float(values.mean())}
    for p, v in zip(PERCENTILES, np.percentile(values, PERCENTILES)):
        out[f"{name}_p{p}"] = float(v)
    return out


def latencies(sent_s, first_token_s, finish_s, output_len) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """TTFT, TPOT (NaN for one-token outputs) and E2E of requests given as arrays (or scalars); TTFT and
    E2E count from the send time (module docstring)."""
    n = np.asarray(output_len)
    first = np.asarray(first_token_s, dtype=float)
    finish = np.asarray(finish_s, dtype=float)
    sent = np.asarray(sent_s, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(n > 1, (finish - first) / np.maximum(n - 1, 1), np.nan)
    return first - sent, tpot, finish - sent


def sent_times(requests: pd.DataFrame) -> pd.Series:
    """When each request was sent: `sent_s`, or `arrival_s` in records written before that column
    existed (every replay was then open loop: sent at its arrival)."""
    return requests["sent_s"] if "sent_s" in requests.columns else requests["arrival_s"]


def meets_slo(ttft_s, tpot_s, slo: Slo):
    """Whether each request meets the SLO (module docstring): a NaN TPOT (one-token output) only
    needs the TTFT. Arrays in, a boolean array out; scalars in, a numpy bool."""
    tpot = np.asarray(tpot_s, dtype=float)
    return (np.asarray(ttft_s, dtype=float) <= slo.ttft_s) & (np.isnan(tpot) | (tpot <= slo.tpot_s))


def per_request_latencies(requests: pd.DataFrame) -> pd.DataFrame:
    """TTFT, TPOT and E2E per request (NaN TPOT for one-token outputs)."""
    ttft, tpot, e2e = latencies(sent_times(requests), requests["first_token_s"], requests["finish_s"],
                                requests["output_len"])
    return pd.DataFrame({"ttft_s": ttft, "tpot_s": tpot, "e2e_s": e2e}, index=requests.index)


def inter_token_latencies(token_times: Iterable[Sequence[float]]) -> np.ndarray:
    """Gaps between successive emissions of each request, pooled (see the module docstring)."""
    times = [np.asarray(t, dtype=float) for t in token_times]
    if not times:
        return np.empty(0)
    flat = np.concatenate(times)
    owner = np.repeat(np.arange(len(times)), [len(t) for t in times])
    gaps = np.diff(flat)
    same = owner[1:] == owner[:-1]
    return gaps[same & (gaps > 0)]


def per_position_acceptance(steps: pd.DataFrame, k_max: int | None = None) -> list[float | None]:
    """α_j for j = 1..max verified (see the module docstring); None where no draft reached j."""
    if len(steps) == 0:
        return []
    ver = flatten_steps(steps["l"])
    acc = flatten_steps(steps["accepted"])
    top = int(ver.max(initial=0)) if k_max is None else k_max
    out: list[float | None] = []
    for j in range(1, top + 1):
        reached = np.count_nonzero((ver >= j) & (acc >= j - 1))
        out.append(float(np.count_nonzero(acc >= j) / reached) if reached else None)
    return out


def compute_metrics(requests: pd.DataFrame, steps: pd.DataFrame, slo: Slo) -> dict[str, float | None]:
    """Every scalar metric of one run (module docstring); None where a metric is undefined."""
    lat = per_request_latencies(requests)
    out: dict[str, float | None] = {}
    out.update(_summary("ttft", lat["ttft_s"].to_numpy()))
    out.update(_summary("tpot", lat["tpot_s"].dropna().to_numpy()))
    out.update(_summary("itl", inter_token_latencies(requests["token_times"])))
    out.update(_summary("e2e", lat["e2e_s"].to_numpy()))
    tokens = int(requests["output_len"].sum())
    makespan = float(requests["finish_s"].max() - sent_times(requests).min()) if len(requests) else 0.0
    ok = meets_slo(lat["ttft_s"].to_numpy(), lat["tpot_s"].to_numpy(), slo)
    out["requests"] = float(len(requests))
    out["output_tokens"] = float(tokens)
    out["makespan_s"] = makespan
    out["throughput_tok_s"] = tokens / makespan if makespan > 0 else None
    out["request_throughput"] = len(requests) / makespan if makespan > 0 else None
    out["goodput"] = float(ok.sum()) / makespan if makespan > 0 else None
    out["slo_attainment"] = float(ok.mean()) if len(requests) else None
    ver = flatten_steps(steps["l"]) if len(steps) else np.empty(0, np.int64)
    acc = flatten_steps(steps["accepted"]) if len(steps) else np.empty(0, np.int64)
    request_steps = ver.size
    out["steps"] = float(len(steps))
    out["mean_batch"] = float(steps["batch"].mean()) if len(steps) else None
    out["accepted_per_step"] = float(acc.sum() / request_steps) if request_steps else None
    out["committed_per_step"] = float(steps["committed"].sum() / request_steps) if request_steps else None
    out["acceptance_rate"] = float(acc.sum() / ver.sum()) if ver.sum() > 0 else None
    out["preemptions"] = float(requests["preemptions"].sum())
    return out


def bootstrap_ci(values: Sequence[float | None], *, confidence: float = 0.95, n_resamples: int = 2000,
                 seed: int = 0) -> dict[str, float | None]:
    """Mean of the per-repeat values and a percentile-bootstrap CI of the mean.

    None values (a metric undefined in that repeat) are left out; all None gives None everywhere.
    """
    data = np.asarray([v for v in values if v is not None and not math.isnan(v)], dtype=float)
    if data.size == 0:
        return {"mean": None, "ci_low": None, "ci_high": None}
    mean = float(data.mean())
    if data.size == 1 or np.all(data == data[0]):
        return {"mean": mean, "ci_low": mean, "ci_high": mean}
    from scipy.stats import bootstrap  # lazily: +0.8-1.3 s; evaluate's and tune's input errors come first

    res = bootstrap((data,), np.mean, confidence_level=confidence, n_resamples=n_resamples, method="percentile",
                    random_state=np.random.default_rng(seed))
    return {"mean": mean, "ci_low": float(res.confidence_interval.low), "ci_high": float(res.confidence_interval.high)}


def summarize_repeats(per_repeat: Sequence[Mapping[str, float | None]], **kwargs: Any) -> dict[str, dict]:
    """{metric: {mean, ci_low, ci_high}} over the repeats' metric dicts."""
    names = list(dict.fromkeys(k for m in per_repeat for k in m))
    return {name: bootstrap_ci([m.get(name) for m in per_repeat], **kwargs) for name in names}


def continues_batch(step_ids: Iterable[Any], next_ids: Iterable[Any]) -> bool:
    """Whether the next step carries on one of this step's requests — the engine went straight on to it,
    with no idle wait between, so this step's period runs to the next one's start. The one rule for
    `step_seconds` and vLLM's step log (`vllm.step_log.read_step_log`'s next_t0)."""
    return not set(step_ids).isdisjoint(next_ids)


def step_seconds(steps: pd.DataFrame) -> pd.Series:
    """Each step's seconds as the profile and the simulator count them: its period — to the next step's
    start — when that step continues the batch (shares a request with it), else to its own end. On vLLM
    a recorded step (t0..t1) misses the engine core's work between steps, which the profile times
    (`vllm.step_log.step_period`); the serving loop's steps (torch, simulator) follow each other, so
    there the period is the step."""
    start, end = steps["start_s"].to_numpy(float), steps["end_s"].to_numpy(float)
    ids = [np.atleast_1d(row).tolist() for row in steps["req_ids"]]
    continues = np.array([continues_batch(a, b) for a, b in zip(ids, ids[1:])] + [False], dtype=bool)
    following = np.append(start[1:], np.nan)
    return pd.Series(np.where(continues, following - start, end - start), index=steps.index)


def step_contexts(steps: pd.DataFrame, prompt_len: Mapping[Any, int]) -> list[np.ndarray]:
    """Per step, each of its requests' KV tokens before it (in `req_ids` order): the prompt, the token
    its prefill produced, and what it committed (`c`) in the steps before. A step's sum is its
    `kv_tokens` less what it committed."""
    done: dict[Any, int] = {}
    out = []
    for ids, committed in zip(steps["req_ids"], steps["c"]):
        ids, committed = np.atleast_1d(ids).tolist(), np.atleast_1d(committed).tolist()
        out.append(np.array([prompt_len[i] + 1 + done.get(i, 0) for i in ids], dtype=np.int64))
        for i, c in zip(ids, committed):
            done[i] = done.get(i, 0) + int(c)
    return out


def step_speed(steps: pd.DataFrame, requests: pd.DataFrame, clock: StepClockFn) -> float | None:
    """Measured (`step_seconds`) over the step clock's seconds of a replay's plain steps (module
    docstring); None without one. `requests`: the replay's requests frame (their prompt lengths)."""
    seconds = step_seconds(steps)
    plain = (steps["admitted"].fillna(0) == 0) & (steps["preempted"].fillna(0) == 0) & (steps["batch"] > 0)
    if not plain.any():
        return None
    contexts = step_contexts(steps, dict(zip(requests["req_id"], requests["prompt_len"])))
    rows = np.flatnonzero(plain.to_numpy())
    measured = float(seconds.iloc[rows].sum())
    predicted = 0.0
    for i in rows:
        predicted += clock(contexts[i].tolist(), np.atleast_1d(steps["k"].iloc[i]).astype(int).tolist())
    return measured / predicted if predicted > 0 else None


def step_account(steps: pd.DataFrame) -> dict[str, float | int | None]:
    """The step_account of one replay's steps (module docstring; seconds are `step_seconds`); None where a
    kind of step is absent."""
    seconds = step_seconds(steps)
    steps = steps[steps["batch"] > 0]
    admits = steps["admitted"].fillna(0) > 0
    plain = steps[~admits & (steps["preempted"].fillna(0) == 0)]
    tokens = float(steps["committed"].sum())

    def per_token(rows: pd.DataFrame) -> float | None:
        return None if tokens <= 0 else float((seconds[rows.index] * rows["batch"]).sum()) / tokens

    def mean(rows: pd.DataFrame) -> float | None:
        return None if rows.empty else float(seconds[rows.index].mean())

    return {"steps": int(len(steps)), "plain_step_s": mean(plain),
            "plain_batch": None if plain.empty else float(plain["batch"].mean()),
            "plain_tokens_per_request": (float(plain["committed"].sum() / plain["batch"].sum())
                                         if not plain.empty else None),
            "admission_share": float(admits.mean()) if len(steps) else None,
            "admission_step_s": mean(steps[admits]),
            "s_per_token_plain": per_token(plain), "s_per_token_admission": per_token(steps[admits])}


def uneven_repeats(speeds: Sequence[float | None], tolerance: float) -> list[int]:
    """Indices of the repeats whose `step_speed` lies outside 1 ± tolerance of the repeats' median:
    identical replays whose host ran at another speed than its siblings'. None (no plain step) is
    never uneven; fewer than two speeds cannot disagree."""
    known = [s for s in speeds if s is not None]
    if len(known) < 2:
        return []
    middle = float(np.median(known))
    return [i for i, s in enumerate(speeds) if s is not None and abs(s / middle - 1.0) > tolerance]
