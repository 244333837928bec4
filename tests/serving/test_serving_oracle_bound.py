"""The oracle length policy is an upper bound: on the simulator (T=0) no preset beats it.

The oracle drafts exactly the true match length m at every step, so it wastes no draft and misses no
accepted token (docs/architecture.md, "sim"). What it bounds is the *length* policy: a preset that also changes
the schedule (LP-SJF, LAS, LAPS-SD) can raise goodput by reordering requests, which no length policy
can. So every preset is compared with the oracle run under that preset's own schedule and execution
config; for the FCFS presets that is exactly the `oracle` preset. A preset above its oracle is a bug
in the loop or the simulator (a draft charged wrongly, an acceptance not replayed exactly), not noise:
the simulator is deterministic.
"""

from __future__ import annotations

import pytest

from autospec.fit import FittedSimEngine as SimEngine
from autospec.fit import fit_profile, load_fit, write_fit
from autospec.serving.loop import serve
from autospec.serving.metrics import Slo, compute_metrics
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.step import StepSettings
from autospec.strategy import StrategySpec, build_strategy, list_presets, load_preset, spec_from_dict
from autospec.workloads.synthetic import synthesize

from stage_helpers import K_MAX, write_synthetic_run

# Loaded enough that batches fill (mean batch ~7 of 8) and tight enough that SLO attainment is well
# inside (0, 1) for every preset, so goodput separates strategies instead of saturating.
SLO = Slo(ttft_s=0.5, tpot_s=0.03)
MAX_BATCH = 8


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    run = write_synthetic_run(tmp_path_factory.mktemp("oracle_bound"))
    write_fit(run, fit_profile(run))
    trace = synthesize("poisson", rate=20.0, duration_s=10.0, seed=1, mean_prompt_tokens=64,
                       mean_output_tokens=48).cap(100).clip_lengths(200, 160)
    requests = [ServeRequest(r.req_id, r.arrival_s, SyntheticPrompt(r.prompt_len, 100, r.req_id), r.output_len,
                             r.domain) for r in trace.requests()]
    settings = StepSettings(k_max=K_MAX, temperature=0.0, latency_model=load_fit(run).latency_model,
                            slo_tpot_s=SLO.tpot_s)
    return run, requests, settings


def _metrics(setup, spec: StrategySpec) -> dict:
    run, requests, settings = setup
    engine = SimEngine.from_dirs(run, k_max=K_MAX, temperature=0.0, seed=0)
    records = serve(engine, build_strategy(spec), requests, max_batch=MAX_BATCH, settings=settings)
    return compute_metrics(records.requests_frame(), records.steps_frame(), SLO)


def _oracle_with_schedule_of(spec: StrategySpec) -> StrategySpec:
    data = spec.model_dump()
    data.update(strategy={"name": f"oracle ({spec.schedule.policy} schedule)"}, length={"policy": "oracle"},
                verify={"policy": "all"}, search={})
    return spec_from_dict(data)


def test_oracle_bounds_every_preset_at_t0(setup):
    oracle_spec = load_preset("oracle")
    oracle_runs: dict[tuple[str, str], dict] = {}
    checked = 0
    no_sd = None
    for name in list_presets():
        if name == "oracle":
            continue
        spec = load_preset(name)
        key = (spec.schedule.model_dump_json(), spec.execution.model_dump_json())
        if key not in oracle_runs:
            bound_spec = _oracle_with_schedule_of(spec)
            if spec.schedule == oracle_spec.schedule and spec.execution == oracle_spec.execution:
                bound_spec = oracle_spec  # the FCFS presets are held to the `oracle` preset itself
            oracle_runs[key] = _metrics(setup, bound_spec)
        bound = oracle_runs[key]
        got = _metrics(setup, spec)
        for metric in ("throughput_tok_s", "goodput"):
            assert got[metric] <= bound[metric] * (1 + 1e-9), (
                f"{name} {metric} {got[metric]:.4f} beats the oracle's {bound[metric]:.4f} under the same "
                f"schedule: the oracle is an upper bound, so the loop or the simulator is wrong")
        # Every oracle draft is accepted; a preset that drafts can only match that, not exceed it.
        assert bound["acceptance_rate"] == pytest.approx(1.0)
        if name == "no-sd":
            no_sd = got
        checked += 1
    assert checked == len(list_presets()) - 1 >= 20
    fcfs_oracle = oracle_runs[(oracle_spec.schedule.model_dump_json(), oracle_spec.execution.model_dump_json())]
    # The bound is not vacuous: the oracle is clearly faster than not speculating at all.
    assert no_sd is not None and fcfs_oracle["throughput_tok_s"] > 1.1 * no_sd["throughput_tok_s"]
    assert 0.0 < fcfs_oracle["slo_attainment"] < 1.0
