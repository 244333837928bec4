"""`autospec profile` on a tiny random pair: schema of every artifact, and traces that agree with the
real engine (the match length is what the torch engine accepts at T=0)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.engines.base import GenRequest
from autospec.engines.torch_engine import TorchSDEngine
from autospec.errors import InputError
from autospec.profile import (
    ACCEPTANCE_COLUMNS,
    LATENCY_COLUMNS,
    EncodedPrompt,
    ProfileSettings,
    latency_grid,
    measure_latency,
    read_parquet,
    run_profile,
    write_profile,
)

SETTINGS = ProfileSettings(k_max=3, batches=[1, 2], contexts=[8, 24], prefill_tokens=[8, 16], repeats=2, warmup=1,
                           prompts_per_domain=2, trace_tokens=10, max_prompt_tokens=12)


@pytest.fixture(scope="module")
def profiled(tiny_pair, tmp_path_factory):
    target, draft = tiny_pair
    engine = TorchSDEngine(target, draft, k_max=SETTINGS.k_max)
    rng = np.random.default_rng(0)
    prompts = [EncodedPrompt(f"{d}#{i}", d, rng.integers(0, 5, int(rng.integers(3, 20))).tolist())
               for d in ("code", "math") for i in range(2)]
    calls = []

    def progress(name, total):
        calls.append([name, total, 0])
        return lambda n: calls[-1].__setitem__(2, calls[-1][2] + n)

    result = run_profile(engine, prompts, SETTINGS, progress)
    run = tmp_path_factory.mktemp("profile_run")
    write_profile(run, result, SETTINGS, {"device": "cpu"})
    return run, result, engine, prompts, calls


def test_profile_artifacts_have_the_schema(profiled):
    run, result, _, prompts, calls = profiled
    lat = read_parquet(run / "profile" / "latency.parquet", LATENCY_COLUMNS)
    assert list(lat.columns) == LATENCY_COLUMNS
    assert len(lat) == len(latency_grid(SETTINGS))
    target = lat[(lat.model == "target") & (lat.phase == "decode")]
    assert sorted(target.tokens.unique()) == list(range(1, SETTINGS.k_max + 2))
    # one new token per request, and the catch-up pass after a verify that accepted every draft
    assert set(lat[lat.model == "draft"].query("phase == 'decode'").tokens) == {1, 2}
    # one token per row over rows of unequal length (the mask), beyond batch 1, timed at the longest row
    ragged = lat[lat.phase == "decode_ragged"]
    assert set(ragged.tokens) == {1} and set(ragged.batch) == {b for b in SETTINGS.batches if b >= 2}
    assert set(ragged.model) == {"draft", "target"}
    for (model, batch), cell in ragged.groupby(["model", "batch"]):
        # prompts spread over context/2 .. 3·context/2: the longest row exceeds the grid context
        assert (cell.context.sort_values().to_numpy() > np.sort(SETTINGS.contexts)).all(), (model, batch)
    assert (lat.median_s > 0).all() and (lat.mad_s >= 0).all() and (lat.repeats == SETTINGS.repeats).all()
    assert lat.sm_split.isna().all()
    acc = read_parquet(run / "profile" / "acceptance.parquet", ACCEPTANCE_COLUMNS)
    assert list(acc.columns) == ACCEPTANCE_COLUMNS
    assert len(acc) == len(prompts) * SETTINGS.trace_tokens
    for col in ("chain_tokens", "confidences", "entropies", "klds", "target_probs", "accept_probs"):
        assert all(len(v) == SETTINGS.k_max for v in acc[col])
    conf = np.stack(acc.confidences.to_numpy())
    assert ((conf > 0) & (conf <= 1)).all()
    ap = np.stack(acc.accept_probs.to_numpy())
    assert ((ap >= 0) & (ap <= 1)).all()
    assert ((acc.match_len >= 0) & (acc.match_len <= SETTINGS.k_max)).all()
    tele = json.loads((run / "profile" / "telemetry.json").read_text())
    assert isinstance(tele["available"], bool) and (tele["available"] or tele["reason"])
    meta = json.loads((run / "profile" / "profile.json").read_text())
    assert meta["schema_version"] == 1 and meta["settings"]["k_max"] == SETTINGS.k_max
    assert [c[0] for c in calls] == ["latency grid", "acceptance traces"] and all(c[1] == c[2] for c in calls)


def test_match_len_is_what_the_engine_accepts(profiled, tiny_pair):
    _, result, _, prompts, _ = profiled
    target, draft = tiny_pair
    engine = TorchSDEngine(target, draft, k_max=SETTINGS.k_max)
    acc = result.acceptance
    checked = 0
    for prompt in prompts[:2]:
        rows = acc[acc.prompt_id == prompt.prompt_id].sort_values("position")
        out = rows.target_token.tolist()
        ids = prompt.ids[-SETTINGS.max_prompt_tokens:]
        for t in (1, 4, 7):
            rid = engine.add([GenRequest(ids + out[: t - 1], 20, ignore_eos=True)]).req_ids[0]
            assert engine.output(rid) == [out[t - 1]]
            for _ in range(SETTINGS.k_max):
                engine.draft([rid])
            drafts = engine.drafts_of(rid)
            row = rows.iloc[t]
            assert [d.token for d in drafts] == list(row.chain_tokens)
            assert [d.confidence for d in drafts] == pytest.approx(list(row.confidences), rel=1e-4)
            outcome = engine.verify({rid: SETTINGS.k_max})
            assert outcome.accepted[0] == row.match_len
            # KL at the first chain position uses the same target distribution as the engine's verify
            assert outcome.klds[0][0] == pytest.approx(row.klds[0], rel=1e-3, abs=1e-5)
            engine.remove([rid])
            checked += 1
    assert checked == 6


def test_profile_refuses_bad_input(tiny_pair, tmp_path):
    target, draft = tiny_pair
    engine = TorchSDEngine(target, draft)
    with pytest.raises(InputError):
        run_profile(engine, [], SETTINGS)
    runner = CliRunner()
    res = runner.invoke(app, ["profile", "--out", str(tmp_path / "run"), "--target", str(tmp_path / "nope"),
                              "--draft", str(draft)])
    assert res.exit_code == 2 and res.stderr.startswith("error:") and res.stderr.count("\n") == 1
    res = runner.invoke(app, ["profile", "--out", str(tmp_path / "run"), "--k-max", "0"])
    assert res.exit_code == 2 and "k-max" in res.stderr
    # --workload names the prompts to trace: a missing file, or together with --prompts, is one line
    res = runner.invoke(app, ["profile", "--out", str(tmp_path / "run"), "--workload", str(tmp_path / "none.toml")])
    assert res.exit_code == 2 and "no such workload file" in res.stderr and res.stderr.count("\n") == 1
    (tmp_path / "w.toml").write_text("[workload]\n")
    res = runner.invoke(app, ["profile", "--out", str(tmp_path / "run"), "--workload", str(tmp_path / "w.toml"),
                              "--prompts", str(tmp_path / "w.toml")])
    assert res.exit_code == 2 and "--workload" in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_cli_trace_size_flags_reach_the_acceptance_traces(bundled_pair, tmp_path):
    """--trace-tokens and --max-prompt-tokens override the grid's trace sizes, --repeats the timed steps
    per latency shape (all recorded in profile.json)."""
    target, draft = bundled_pair
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["profile", "--out", str(out), "--target", str(target), "--draft", str(draft),
                                   "--quick", "--k-max", "2", "--prompts-per-domain", "1",
                                   "--trace-tokens", "7", "--max-prompt-tokens", "9", "--repeats", "2"])
    assert res.exit_code == 0, res.output
    settings = json.loads((out / "profile" / "profile.json").read_text())["settings"]
    assert (settings["trace_tokens"], settings["max_prompt_tokens"], settings["repeats"]) == (7, 9, 2)
    assert (read_parquet(out / "profile" / "latency.parquet", LATENCY_COLUMNS)["repeats"] == 2).all()
    acc = read_parquet(out / "profile" / "acceptance.parquet", ACCEPTANCE_COLUMNS)
    assert set(acc.groupby("prompt_id").size()) == {7}


def test_prefill_is_timed_as_add_runs_it(tiny_pair, monkeypatch):
    """The profile's prefill rows price `add` as the replay pays it: whole `add` calls (after a decode
    step of live requests), the target's row the call less the draft's forward, so the two lines add
    up to the call; the draft's forward asks the LM head for the prompt's last position only (timing
    logits at every position priced a 256-token prefill 30-50% too dear)."""
    target, draft = tiny_pair
    engine = TorchSDEngine(target, draft, k_max=2)
    calls: dict[str, list] = {"add": [], "profile": []}
    stage = ["add"]
    for name, model in (("target", engine.target), ("draft", engine.draft_model)):
        def spy(tokens, cache, rows, lens, q_lens, logits_at=None, _forward=model.forward, _name=name, **kw):
            if int(q_lens.max()) == 8:  # the 8-token prompt / prefill shape
                calls[stage[0]].append((_name, None if logits_at is None else logits_at.tolist()))
            return _forward(tokens, cache, rows, lens, q_lens, logits_at=logits_at, **kw)

        monkeypatch.setattr(model, "forward", spy)
    engine.add([GenRequest([1, 2, 3, 4, 5, 1, 2, 3], 4, ignore_eos=True)])
    assert sorted(calls["add"]) == [("draft", [[7]]), ("target", [[7]])]
    stage[0] = "profile"
    whole: list[float] = []
    add = engine.add

    def timed_add(requests):
        res = add(requests)
        if len(requests) == 1 and len(requests[0].prompt) == 8:
            whole.append(res.time_s)
        return res

    monkeypatch.setattr(engine, "add", timed_add)
    settings = ProfileSettings(k_max=2, batches=[1], contexts=[4], prefill_tokens=[8], repeats=1, warmup=0,
                               prompts_per_domain=1, trace_tokens=4, max_prompt_tokens=8)
    rows = measure_latency(engine, settings)
    # every prefill forward of the profile asks for the last position's logits only
    assert {(m, str(at)) for m, at in calls["profile"]} == {("target", "[[7]]"), ("draft", "[[7]]")}
    prefill = rows[rows["phase"] == "prefill"].set_index("model")["median_s"]
    assert len(whole) == 1 and prefill["target"] + prefill["draft"] == pytest.approx(whole[0])
    assert list(rows[rows["phase"] == "prefill"]["tokens"]) == [8, 8]
