"""`autospec profile --workload`: the acceptance traces are recorded on the token ids the workload's real
replay sends, named by `prompt_key`, and the simulator replays every such request on its own trace — at
T=0 it then accepts exactly what the torch engine accepts."""

from __future__ import annotations

from pathlib import Path

import pytest

from autospec.calibration import ProfileSettings
from autospec.engines.base import GenRequest
from autospec.engines.sim import AcceptanceTraces, SimCosts, SimEngine
from autospec.engines.torch_engine import TorchSDEngine
from autospec.latency import LinearCoeffs, LinearLatencyModel
from autospec.profile import record_acceptance, workload_prompts
from autospec.serving.factory import load_tokenizer, sent_prompt_ids
from autospec.serving.loop import serve
from autospec.serving.replay import prompt_key, trace_requests
from autospec.serving.step import StepSettings
from autospec.strategy import build_strategy, load_preset
from autospec.workloads.spec import load_workload

from stage_helpers import synthetic_workload


@pytest.fixture(scope="module")
def workload(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("wl") / "w.toml"
    path.write_text(synthetic_workload("sent", rate=50.0, duration_s=1.0, max_requests=8, prompt_tokens=40,
                                       output_tokens=8, bundled_prompts=True))
    return path


def test_workload_prompts_are_the_ids_the_replay_sends(workload, bundled_pair):
    tokenizer = load_tokenizer(bundled_pair[0])
    rows = list(load_workload(workload).requests())
    traced, longest = workload_prompts(workload, tokenizer, per_domain=100)
    sent = dict(zip((prompt_key(r) for r in rows), sent_prompt_ids(rows, tokenizer)))
    assert len(traced) == len(sent) and all(p.ids == sent[p.prompt_id] for p in traced)
    assert {r.domain for r in rows} == {p.domain for p in traced}
    assert longest == max(r.output_len for r in rows)
    assert len(workload_prompts(workload, tokenizer, per_domain=1)[0]) == len({r.domain for r in rows})


def test_the_simulator_accepts_what_the_torch_engine_accepts_on_the_sent_prompts(workload, bundled_pair):
    target, draft = bundled_pair
    settings = ProfileSettings(k_max=3, prompts_per_domain=100, trace_tokens=24, max_prompt_tokens=4096)
    engine = TorchSDEngine(target, draft, k_max=3)
    traced, _ = workload_prompts(workload, load_tokenizer(target), settings.prompts_per_domain)
    traces = AcceptanceTraces(record_acceptance(engine, traced, settings), 3)
    costs = SimCosts(LinearLatencyModel(LinearCoeffs(0.0, 0.0, 1e-3), LinearCoeffs(0.0, 0.0, 1e-2)),
                     (0.0, 0.0), (0.0, 0.0))
    sim = SimEngine(traces, costs, k_max=3)
    trace = load_workload(workload)
    rows = list(trace.requests())
    assert all(r.output_len < settings.trace_tokens for r in rows)  # no wrap-around: exact at T=0
    real_requests = trace_requests(trace, sent_prompt_ids(rows, load_tokenizer(target)))
    sim_requests = trace_requests(trace, vocab=100)
    assert [r.prompt_key for r in sim_requests] == [prompt_key(r) for r in rows]
    strategy = load_preset("static-k2")
    accepted = {}
    for label, eng, reqs in (("torch", engine, real_requests), ("sim", sim, sim_requests)):
        records = serve(eng, build_strategy(strategy), reqs, max_batch=4, keep_outputs=True,
                        settings=StepSettings(k_max=3, latency_model=sim.latency_model))
        frame = records.requests_frame().sort_values("req_id")
        accepted[label] = frame["rounds_accepted"].map(sum).tolist()
    assert accepted["sim"] == accepted["torch"] and sum(accepted["torch"]) > 0
    # without the key the simulator falls back to a seeded trace of the request's domain
    first = sim.add([GenRequest([1, 2, 3], 4, domain=rows[0].domain, trace_id=5)]).first_tokens
    own = sim.add([GenRequest([1, 2, 3], 4, domain=rows[0].domain, prompt_key=prompt_key(rows[0]))]).first_tokens
    assert own == [traces.target_token[traces.starts[traces.by_prompt[prompt_key(rows[0])]]]]
    assert len(first) == 1


def test_profile_pair_sizes_workload_traces_to_the_prompts_and_outputs_it_sends(workload, bundled_pair, tmp_path,
                                                                               monkeypatch):
    """Traced whole (no prompt cut to --max-prompt-tokens) and as long as the longest output, so the
    simulator neither replays another context nor wraps a request around its trace."""
    import autospec.profile as profile
    from autospec.config import PairSpec

    seen = {}

    class Stop(Exception):
        pass

    def spy(engine, prompts, settings, *args, **kwargs):
        seen.update(prompts=prompts, settings=settings)
        raise Stop

    monkeypatch.setattr(profile, "run_profile", spy)
    quick = ProfileSettings.quick(3).model_copy(update={"trace_tokens": 4, "max_prompt_tokens": 8})
    with pytest.raises(Stop):
        profile.profile_pair(tmp_path / "run", PairSpec(target=bundled_pair[0], draft=bundled_pair[1]), quick,
                             workload=workload)
    rows = list(load_workload(workload).requests())
    assert seen["settings"].trace_tokens == max(r.output_len for r in rows) > 4
    assert seen["settings"].max_prompt_tokens == max(len(p.ids) for p in seen["prompts"]) > 8
    assert {p.prompt_id for p in seen["prompts"]} == {prompt_key(r) for r in rows}


def test_the_profile_grid_reaches_the_workloads_longest_prompt_and_context(bundled_pair, tmp_path, monkeypatch):
    """A workload past the quick grid (prompts to 800 tokens; the grid stops at context 384 and prefill 512)
    is profiled out to its own shapes, so the simulator does not extrapolate its steps; the bundled
    workloads lie inside the quick grid and leave it as it is (and so the committed profiles)."""
    import autospec.profile as profile
    from autospec.config import PairSpec

    long = tmp_path / "long.toml"
    long.write_text(synthetic_workload("long", rate=50.0, duration_s=1.0, max_requests=8, prompt_tokens=400,
                                       output_tokens=8, bundled_prompts=True))
    trace = load_workload(long)
    prompt, context = int(trace.column("prompt_len").max()), int((trace.column("prompt_len")
                                                                    + trace.column("output_len")).max())
    assert prompt > 512 and context > 384
    seen = {}

    class Stop(Exception):
        pass

    def spy(engine, prompts, settings, *args, **kwargs):
        seen["settings"] = settings
        raise Stop

    monkeypatch.setattr(profile, "run_profile", spy)
    quick = ProfileSettings.quick(3)
    with pytest.raises(Stop):
        profile.profile_pair(tmp_path / "run", PairSpec(target=bundled_pair[0], draft=bundled_pair[1]), quick,
                             workload=long)
    assert seen["settings"].contexts == [32, 128, 384, context]  # 384 doubled is past it: its own
    assert seen["settings"].prefill_tokens == [32, 128, 256, 512, prompt]
    repo = Path(__file__).resolve().parents[2]
    for bundled in ("bursty", "poisson", "azure-code-cpu"):
        trace = load_workload(repo / "workloads" / f"{bundled}.toml")
        lengths = trace.column("prompt_len")
        assert quick.covering(int((lengths + trace.column("output_len")).max()), int(lengths.max()), 2048) == quick


def test_the_grid_stops_where_its_own_cells_would_pass_the_context_window():
    quick = ProfileSettings.quick(8)
    wide = quick.covering(1792, 1536, 2048)
    # a cell grows its prompts by up to 9 x (2 + 5 + 2) + 2 = 83 tokens; a ragged cell's longest prompt is
    # 1.5x its context on the torch engine, 1.75x on vLLM's profile
    assert wide.contexts == [32, 128, 384, 768, 1310] and 1.5 * 1310 + 83 <= 2048 < 1.5 * 1311 + 83 + 1
    assert wide.prefill_tokens == [32, 128, 256, 512, 1024, 1536]
    assert quick.covering(1792, 1536, 2048, spread=0.75).contexts[-1] == 1122 and 1.75 * 1122 + 83 <= 2048
    assert quick.covering(1792, 2040, 2048).prefill_tokens[-1] == 2048 - 83
    assert quick.covering(5000, 4000, None).contexts == [32, 128, 384, 768, 1536, 3072, 5000]
