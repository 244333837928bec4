"""A tiny discrete-event serving simulator for schedule-policy tests.

Every job has a known output length and either a fixed number of accepted drafts per round (its
per-round acceptance is stable from the start) or a per-draft acceptance probability: each round
accepts the leading drafts of a chain of independent draws, so the per-round rate jumps between
0, 1/n, …, 1 while the running total settles on the job's rate. One SD round costs
draft_len·t_draft + t_verify regardless of batch; preempting a job charges a KV switch cost
proportional to its context. `perceptible` (when the policy has `is_perceptible`) records the jobs a
LAPS-SD policy called perceptible before they finished.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from autospec.contract import RequestView, StepOutcome
from autospec.policies.base import SchedulePolicy


@dataclass
class Job:
    req_id: int
    arrival_s: float
    output_len: int
    accepted_per_round: int
    prompt_len: int = 64
    accept_prob: float | None = None  # per-draft acceptance; None = accepted_per_round every round
    seed: int = 0
    generated: int = 0
    attained_s: float = 0.0
    finished_s: float | None = None

    def view(self) -> RequestView:
        return RequestView(req_id=self.req_id, prompt_len=self.prompt_len, generated_len=self.generated,
                           max_tokens=self.output_len, arrival_s=self.arrival_s,
                           attained_service_s=self.attained_s)


def mixed_jobs(n: int, seed: int, *, long_frac: float = 0.2, short_len: int = 24, long_len: int = 400,
               rate: float = 0.5) -> list[Job]:
    """Poisson arrivals of short and long jobs with 1–3 accepted drafts (of 4) per round."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    return [Job(i, float(arrivals[i]), long_len if rng.random() < long_frac else short_len,
                int(rng.integers(1, 4))) for i in range(n)]


def varying_jobs(n: int, seed: int, *, lengths: tuple[int, ...] = (16, 48, 160, 400),
                 accept: tuple[float, float] = (0.2, 0.95), rate: float = 0.4) -> list[Job]:
    """Poisson arrivals; each job a length from `lengths` and its own per-draft acceptance probability,
    uniform in `accept`: requests of different acceptance whose per-round acceptance varies."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, n))
    return [Job(i, float(arrivals[i]), int(rng.choice(lengths)), 0, accept_prob=float(rng.uniform(*accept)),
                seed=seed * 100_003 + i) for i in range(n)]


def simulate(policy: SchedulePolicy, jobs: list[Job], *, slots: int = 1, draft_len: int = 4,
             t_draft: float = 0.004, t_verify: float = 0.03, kv_switch_s_per_token: float = 2e-5) -> dict:
    """Run every job to completion; returns per-job latency and the number of preemptions."""
    pending = sorted(jobs, key=lambda j: j.arrival_s)
    waiting: list[Job] = []
    running: list[Job] = []
    now, preemptions = 0.0, 0
    by_id = {j.req_id: j for j in jobs}
    draws = {j.req_id: np.random.default_rng(j.seed) for j in jobs}  # per job: same draws under any policy
    perceptible: set[int] = set()
    check_pc = getattr(policy, "is_perceptible", None)
    while pending or waiting or running:
        while pending and pending[0].arrival_s <= now:
            waiting.append(pending.pop(0))
        if not waiting and not running:
            now = pending[0].arrival_s
            continue
        pick = policy.pick(now, [j.view() for j in waiting], [j.view() for j in running], slots)
        assert len(pick.run) <= slots and set(pick.preempt) <= {j.req_id for j in running}
        switch = sum((by_id[r].prompt_len + by_id[r].generated) * kv_switch_s_per_token for r in pick.preempt)
        preemptions += len(pick.preempt)
        batch = [by_id[r] for r in pick.run]
        waiting = [j for j in [*waiting, *running] if j.req_id not in pick.run]
        round_s = draft_len * t_draft + t_verify
        now += switch + round_s
        accepted, finished = [], []
        for job in batch:
            if job.accept_prob is None:
                m = job.accepted_per_round
            else:  # leading successes of a chain of draft_len independent draws
                m = int(np.cumprod(draws[job.req_id].random(draft_len) < job.accept_prob).sum())
            job.generated = min(job.output_len, job.generated + m + 1)
            job.attained_s += round_s
            accepted.append(m)
            done = job.generated >= job.output_len
            finished.append(done)
            if done:
                job.finished_s = now
        policy.observe(StepOutcome(
            req_ids=[j.req_id for j in batch], drafted=[draft_len] * len(batch),
            verified=[draft_len] * len(batch), accepted=accepted,
            committed=[[0] * (m + 1) for m in accepted], finished=finished,
            target_probs=[[] for _ in batch], klds=[[] for _ in batch],
            draft_time_s=draft_len * t_draft, verify_time_s=t_verify))
        running = [j for j, done in zip(batch, finished) if not done]
        if check_pc is not None:
            perceptible.update(j.req_id for j in batch if check_pc(j.req_id))
    latencies = {j.req_id: j.finished_s - j.arrival_s for j in jobs}
    return {"latency": latencies, "mean_latency": float(np.mean(list(latencies.values()))),
            "preemptions": preemptions, "perceptible": perceptible}
