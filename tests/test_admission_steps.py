"""benchmarks/vllm_admission_steps.py (issue 16): on the simulator's own replay of a vLLM profile every kind
of step reads 1 against the simulator's prices (and so each side of a plain step), the draft side is read from
the records' draft time, and a directory it cannot read is one line, exit 2, nothing written. (On vLLM it
reads a fidelity run's records: `benchmarks/results/vllm_admission_steps.json`.)"""

from __future__ import annotations

import pytest

from autospec.fit import FittedSimEngine, fit_profile, write_fit
from autospec.serving.loop import serve
from autospec.serving.records import ServeRequest, SyntheticPrompt
from autospec.serving.step import StepSettings
from autospec.strategy import build_strategy, load_preset

from autospec_testing import assert_bench_refuses
from benchmarks.vllm_admission_steps import split_steps
from stage_helpers import K_MAX, write_synthetic_run

REQUESTS = [ServeRequest(i, 0.004 * i, SyntheticPrompt(30 + 11 * (i % 7), 100, i), 20 + 3 * (i % 5),
                         ("code", "chat")[i % 2]) for i in range(30)]


def _replay(run, preset: str):
    engine = FittedSimEngine.from_dirs(run, seed=3)
    records = serve(engine, build_strategy(load_preset(preset)), REQUESTS, max_batch=6,
                    settings=StepSettings(k_max=K_MAX, latency_model=engine.latency_model))
    return engine, records.steps_frame(), records.requests_frame()


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    run = write_synthetic_run(tmp_path_factory.mktemp("vllm"), engine="vllm", draft_round=(3e-7, 4e-4, 1e-3),
                              step_passes={1: 1.3, 2: 2.0, 4: 3.4})
    write_fit(run, fit_profile(run))
    return run


@pytest.mark.parametrize("preset", ["static-k2", "no-sd"])
def test_the_simulators_own_steps_read_one_against_its_prices(vllm_run, preset):
    engine, steps, requests = _replay(vllm_run, preset)
    engine.set_speculative(preset != "no-sd")
    split = split_steps(engine, steps, requests)
    assert split["admission"]["steps"] > 0 and split["plain"]["steps"] > 0
    assert split["admission"]["unmatched"] == split["plain"]["unmatched"] == 0
    for kind in ("plain", "admission"):
        assert split[kind]["total"] == pytest.approx(1.0, rel=1e-9)
    assert split["plain"]["target"] == pytest.approx(1.0, rel=1e-9)
    if preset == "no-sd":  # nothing drafts: no draft side
        assert split["plain"]["draft"] is None and split["admission"]["draft"] is None
    else:
        assert split["plain"]["draft"] == pytest.approx(1.0, rel=1e-9)
        # the simulator's records leave the draft's prefill to prefill_s, vLLM's draft time holds it
        assert split["admission"]["draft"] < 1.0 < split["admission"]["target"]

    steps = steps.copy()  # the same periods, half again as much of them drafting: only the split moves
    plain = (steps["admitted"].fillna(0) == 0).to_numpy() & (steps["batch"] > 0).to_numpy()
    steps.loc[plain, "draft_s"] = steps.loc[plain, "draft_s"].fillna(0.0) + 0.5 * steps.loc[plain, "verify_s"]
    moved = split_steps(engine, steps, requests)["plain"]
    assert moved["total"] == pytest.approx(1.0, rel=1e-9)
    if preset != "no-sd":
        assert moved["draft"] > 1.2 and moved["target"] < 0.8


def test_a_run_it_cannot_read_is_one_line_and_writes_nothing(tmp_path):
    torch_run = write_synthetic_run(tmp_path / "torch")  # replay records, but of a torch profile
    _, steps, requests = _replay(torch_run, "static-k2")
    (torch_run / "vllm" / "eval").mkdir(parents=True)
    steps.assign(strategy="static-k2", repeat=0).to_parquet(torch_run / "vllm" / "eval" / "steps.parquet")
    requests.assign(strategy="static-k2", repeat=0).to_parquet(torch_run / "vllm" / "eval" / "requests.parquet")
    empty = tmp_path / "empty"
    cases = {empty: f"{empty}: no replay records in {empty / 'vllm' / 'eval'} (steps.parquet, requests.parquet)",
             torch_run: f"{torch_run / 'profile'}: its profile is not a vLLM profile: this prices steps as vLLM lays "
                        "them out"}
    empty.mkdir()
    for run_dir, message in cases.items():
        assert_bench_refuses("vllm_admission_steps.py", ["--run-dir", str(run_dir)], message, tmp_path / "out.json",
                             usage=False)
