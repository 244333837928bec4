"""`autospec fit`: recovers known coefficients, calibrates confidences, refuses bad profiles cleanly."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.errors import InputError
from autospec.fit import fit_profile, load_fit, write_fit
from autospec.policies.dspark import table_sps

from stage_helpers import K_MAX, PREFILL, TRUE, synthetic_acceptance, write_synthetic_run

runner = CliRunner()


def test_fit_recovers_known_coefficients_with_zero_mape(tmp_path):
    run = write_synthetic_run(tmp_path)
    models = fit_profile(run)
    for name, (a, g, d) in TRUE.items():
        # the synthetic passes count the context once per pass (the simulator's clock form), which the
        # clock recovers exactly; AdaSpec's model sums it over the pass's positions (Eq. 3–4), the same
        # for the draft's one-position passes (its fit on Eq. 4 data: tests/policies/test_policies_latency)
        for c, err in [(getattr(models.clock, name), models.clock_mape[name])] + (
                [(getattr(models.linear, name), models.linear_mape[name])] if name == "draft" else []):
            assert c.alpha == pytest.approx(a, rel=1e-6)
            assert c.gamma == pytest.approx(g, rel=1e-6)
            assert c.delta == pytest.approx(d, rel=1e-6)
            assert err < 1e-9
        assert models.prefill[name].per_token_s == pytest.approx(PREFILL[name][0], rel=1e-6)
    # FASER's target load has no context term: on data with a context term it is an approximation
    assert 0.0 < models.piecewise_mape["target"] < 1.0
    # SPS: one value per B, positive, never increasing with B, and usable by DSpark's table_sps
    assert models.sps["tokens"] == sorted(models.sps["tokens"]) and all(v > 0 for v in models.sps["values"])
    assert all(b >= a for a, b in zip(models.sps["values"][1:], models.sps["values"]))
    table_sps(models.sps["tokens"], models.sps["values"])(3)


def test_the_clock_model_recovers_a_sublinear_batch_term_the_linear_model_cannot(tmp_path):
    lam = {"draft": 1.2e-3, "target": 2e-3}
    models = fit_profile(write_synthetic_run(tmp_path, lam=lam))
    for name, (a, g, d) in TRUE.items():
        c = getattr(models.clock, name)
        assert c.lam == pytest.approx(lam[name], rel=1e-3)
        assert (c.alpha, c.gamma, c.delta) == pytest.approx((a, g, d), rel=1e-3)
        assert models.clock_mape[name] < 1e-6
    assert models.linear_mape["draft"] > 0.05  # AdaSpec's line misses the curve (why the clock exists)
    # without the curve the clock is AdaSpec's model
    plain = fit_profile(write_synthetic_run(tmp_path / "plain"))
    assert all(getattr(plain.clock, m).lam < 1e-9 for m in TRUE)


def test_the_clock_model_prices_decode_passes_and_multi_token_passes_apart(tmp_path):
    """No-SD runs decode passes (one token per row), SD verifies several per row: the clock recovers a
    step μ at two tokens and the decode pass's own α, and leaves both out where the rows cannot tell
    them (the synthetic draft rows all feed one token)."""
    lam, multi, alpha_decode = {"target": 1e-3}, {"target": 2e-3}, {"target": 0.4 * TRUE["target"][0]}
    models = fit_profile(write_synthetic_run(tmp_path, lam=lam, multi=multi, alpha_decode=alpha_decode))
    c = models.clock.target
    assert (c.alpha, c.gamma, c.delta) == pytest.approx(TRUE["target"], rel=1e-3)
    assert (c.lam, c.multi, c.alpha_decode) == pytest.approx((1e-3, 2e-3, alpha_decode["target"]), rel=1e-3)
    assert models.clock_mape["target"] < 1e-6
    assert models.clock.draft.alpha_decode is None  # draft rows: one token per row only
    assert models.linear.target.multi == 0.0  # policies keep AdaSpec's line
    assert c.alpha_ragged is None  # no decode_ragged rows: a masked decode pass pays α
    # a plain profile (no step, one α) fits μ ≈ 0 and α_decode ≈ α
    plain = fit_profile(write_synthetic_run(tmp_path / "plain")).clock.target
    assert plain.multi < 1e-9 and plain.alpha_decode == pytest.approx(plain.alpha, rel=1e-3)


def test_the_clock_fits_masked_decode_passes_their_own_alpha(tmp_path):
    """One-token rows of unequal length (`decode_ragged`, the torch engine's masked decode pass) get
    their own α, apart from the maskless one and from the multi-token α, for the draft and the
    target alike; the paper's linear model never sees them."""
    lam, multi = {"target": 1e-3, "draft": 2e-4}, {"target": 2e-3, "draft": 3e-4}
    alpha_decode = {"target": 0.4 * TRUE["target"][0]}
    alpha_ragged = {"target": 0.7 * TRUE["target"][0], "draft": 0.5 * TRUE["draft"][0]}
    run = write_synthetic_run(tmp_path, lam=lam, multi=multi, alpha_decode=alpha_decode, alpha_ragged=alpha_ragged)
    models = fit_profile(run)
    t = models.clock.target
    assert (t.alpha, t.alpha_decode, t.alpha_ragged) == pytest.approx(
        (TRUE["target"][0], alpha_decode["target"], alpha_ragged["target"]), rel=1e-3)
    assert (t.gamma, t.delta, t.lam, t.multi) == pytest.approx((*TRUE["target"][1:], 1e-3, 2e-3), rel=1e-3)
    # the synthetic draft rows all feed one token: α is its maskless rows' (no α_decode to tell apart)
    d = models.clock.draft
    assert d.alpha_decode is None
    assert (d.alpha, d.alpha_ragged) == pytest.approx((TRUE["draft"][0], alpha_ragged["draft"]), rel=1e-3)
    assert models.clock_mape["target"] < 1e-6 and models.clock_mape["draft"] < 1e-6
    assert models.linear.target == fit_profile(write_synthetic_run(
        tmp_path / "maskless", lam=lam, multi=multi, alpha_decode=alpha_decode)).linear.target


def test_fit_is_robust_to_measurement_noise(tmp_path):
    models = fit_profile(write_synthetic_run(tmp_path, noise=0.03))
    assert models.linear_mape["target"] < 0.08 and models.linear_mape["draft"] < 0.08


def test_per_position_acceptance_and_sts(tmp_path):
    acc = synthetic_acceptance(n_prompts=30, positions=60)
    models = fit_profile(write_synthetic_run(tmp_path, acc))
    for domain, frame in list(acc.groupby("domain")) + [("all", acc)]:
        want = [float(np.mean(frame["match_len"] >= j)) for j in range(1, K_MAX + 1)]
        assert models.per_position_acceptance[domain] == pytest.approx(want)
    assert all(b <= a for a, b in zip(models.per_position_acceptance["all"], models.per_position_acceptance["all"][1:]))
    sts = models.sts
    assert len(sts["temperatures"]) == K_MAX
    # the draft is overconfident by construction: STS must cut the held-out ECE substantially
    assert sts["ece_after"] < 0.6 * sts["ece_before"]
    assert sts["temperatures"][0] > 1.0


def test_cli_fit_writes_models_json_and_load_fit_round_trips(tmp_path):
    run = write_synthetic_run(tmp_path)
    res = runner.invoke(app, ["fit", str(run)])
    assert res.exit_code == 0, res.output
    data = json.loads((run / "fit" / "models.json").read_text())
    assert data["schema_version"] == 1
    assert {"linear", "linear_mape", "piecewise", "piecewise_mape", "sps", "per_position_acceptance",
            "sts"} <= set(data)
    assert set(data["sts"]) >= {"temperatures", "ece_before", "ece_after"}
    fit = load_fit(run)
    target = data["linear"]["target"]
    assert fit.latency_model.target.alpha == pytest.approx(target["alpha"], rel=1e-12)
    # Eq. 4: 3 positions of 2 requests over 256 context tokens attend 3·256 + 2·(0 + 1 + 2)
    assert fit.latency_model.verify_time(2, 256, 3) == pytest.approx(
        target["alpha"] * (3 * 256 + 6) + target["gamma"] * 6 + target["delta"], rel=1e-9)
    tokens, values = fit.sps
    assert len(tokens) == len(values) > 1
    assert fit.sts.temperatures == data["sts"]["temperatures"]


def test_a_clock_that_misses_its_own_profile_is_named_by_fit_and_evaluate(tmp_path, monkeypatch):
    """A vLLM profile whose plain-engine rows caught a slow spell (4 of them 1.6x what the engine's line
    says) gives a plain clock missing its held-out rows by far more than CLOCK_MAPE_LIMIT: `autospec fit`
    and evaluate's summary (so its CLI line and the report) name that clock; a clean profile names none.
    Without fit/, evaluate names it too, from the one fit the simulator made in memory."""
    import shutil

    import pandas as pd

    import autospec.evaluate
    import autospec.fit
    from autospec.artifacts import write_parquet
    from autospec.evaluate import EvaluateSpec, run_evaluate
    from autospec.fit import CLOCK_MAPE_LIMIT, loose_clocks, loose_clocks_warning

    from stage_helpers import synthetic_workload

    plain = (1.0e-6, 2.2e-4, 8e-3)
    clean = write_synthetic_run(tmp_path / "clean", engine="vllm", plain=plain, draft_round=(3e-7, 4e-4, 1e-3))
    assert loose_clocks(fit_profile(clean)) == {} and loose_clocks_warning(fit_profile(clean)) is None

    slow = write_synthetic_run(tmp_path / "slow", engine="vllm", plain=plain, draft_round=(3e-7, 4e-4, 1e-3))
    path = slow / "profile" / "latency.parquet"
    latency = pd.read_parquet(path)
    rows = latency.index[latency["phase"] == "decode_plain"]
    latency.loc[rows[::3], "median_s"] *= 1.6  # every third plain row timed through the slow spell
    write_parquet(path, latency)
    res = runner.invoke(app, ["fit", str(slow)])
    assert res.exit_code == 0, res.output
    models = load_fit(slow).models
    loose = loose_clocks(models)
    assert list(loose) == ["plain-engine target clock"] and loose["plain-engine target clock"] > CLOCK_MAPE_LIMIT
    output = " ".join(res.output.split())
    assert "warning: the fit misses its own profile's held-out rows" in output and "plain-engine target clock" in output

    workload = tmp_path / "w.toml"
    workload.write_text(synthetic_workload("w", rate=4.0, duration_s=5.0, max_requests=12, prompt_tokens=40,
                                           output_tokens=16))
    for run, warned in ((slow, True), (clean, False)):
        if run is clean:
            write_fit(clean, fit_profile(clean))
        summary = run_evaluate(EvaluateSpec(workload=workload, strategies=["static-k2"], engine="sim", profile=run,
                                            k_max=K_MAX, capacity=None), tmp_path / f"eval-{run.name}").summary
        health = summary["fit_health"]
        assert health["limit"] == CLOCK_MAPE_LIMIT
        assert (health["warning"] is not None) is warned and bool(health["loose_clocks"]) is warned

    unfitted = tmp_path / "unfitted"
    shutil.copytree(slow / "profile", unfitted / "profile")
    fits = []
    counted = lambda *a, **kw: fits.append(a) or fit_profile(*a, **kw)  # noqa: E731
    for module in (autospec.fit, autospec.evaluate):  # wherever a fit could be made
        monkeypatch.setattr(module, "fit_profile", counted, raising=False)
    summary = run_evaluate(EvaluateSpec(workload=workload, strategies=["static-k2"], engine="sim", profile=unfitted,
                                        k_max=K_MAX, capacity=None), tmp_path / "eval-unfitted").summary
    assert summary["fit_health"]["loose_clocks"] == loose and len(fits) == 1


def test_a_run_profiles_again_while_its_fit_misses_its_own_profile(tmp_path):
    """pipeline.fit_measured (`[profile] loose_fit_retries`): a fit that misses the profile the run measured
    sends the run back to profile, up to the retries; a quiet re-profile goes on without a warning, one that
    stays loose is warned of; a fit that holds is never re-profiled."""
    import pandas as pd

    from autospec.artifacts import write_parquet
    from autospec.fit import loose_clocks
    from autospec.pipeline import fit_measured

    run = tmp_path / "run"

    def profile(slow: bool) -> None:
        write_synthetic_run(run, engine="vllm", plain=(1.0e-6, 2.2e-4, 8e-3), draft_round=(3e-7, 4e-4, 1e-3))
        if slow:  # every third plain row timed through a slow spell (as in the test above)
            path = run / "profile" / "latency.parquet"
            latency = pd.read_parquet(path)
            latency.loc[latency.index[latency["phase"] == "decode_plain"][::3], "median_s"] *= 1.6
            write_parquet(path, latency)

    for spells, retries, profiles, warned in (([True, False], 1, 2, False), ([True, True], 1, 2, True),
                                              ([True, True, False], 2, 3, False), ([True], 0, 1, True),
                                              ([False], 1, 1, False)):
        queue, said = list(spells), []
        profile(queue.pop(0))
        models, given_up = fit_measured(lambda: fit_profile(run), lambda q=queue: profile(q.pop(0)), retries,
                                        said.append)
        assert not queue and len(given_up) == profiles - 1, (spells, retries)
        assert all(list(loose) == ["plain-engine target clock"] for loose in given_up)
        assert [m.startswith("[profile]") and f"profiling again ({i + 1} of {retries})" in m
                for i, m in enumerate(said[:profiles - 1])] == [True] * (profiles - 1)
        assert bool(loose_clocks(models)) is warned
        assert len(said) == profiles - 1 + warned  # then one warning line, naming the clock, when still loose
        assert not warned or (said[-1].startswith("[fit] warning: the fit misses") and "plain-engine" in said[-1])


def _one_line_error(res) -> str:
    assert res.exit_code == 2, res.output
    text = res.stderr.strip()
    assert text.startswith("error:") and "\n" not in text and "Traceback" not in res.output
    return text


def test_fit_bad_inputs_fail_with_one_line(tmp_path):
    assert "profile" in _one_line_error(runner.invoke(app, ["fit", str(tmp_path / "missing")]))
    run = write_synthetic_run(tmp_path / "corrupt")
    (run / "profile" / "latency.parquet").write_bytes(b"not parquet at all")
    assert "parquet" in _one_line_error(runner.invoke(app, ["fit", str(run)]))
    assert not (run / "fit").exists(), "no half-written artifacts"
    run = write_synthetic_run(tmp_path / "version")
    meta = json.loads((run / "profile" / "profile.json").read_text())
    (run / "profile" / "profile.json").write_text(json.dumps({**meta, "schema_version": 99}))
    assert "schema_version" in _one_line_error(runner.invoke(app, ["fit", str(run)]))
    assert not (run / "fit").exists()


def test_parquet_schema_version_and_columns_are_checked(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from autospec.profile import read_parquet

    run = write_synthetic_run(tmp_path)
    path = run / "profile" / "latency.parquet"
    table = pq.read_table(path)
    pq.write_table(table.replace_schema_metadata({b"autospec_schema_version": b"99"}), path)
    with pytest.raises(InputError, match="schema_version"):
        fit_profile(run)
    pq.write_table(pa.table({"model": ["draft"]}).replace_schema_metadata({b"autospec_schema_version": b"1"}), path)
    with pytest.raises(InputError, match="missing columns"):
        read_parquet(path, ["model", "batch"])


def test_load_fit_refuses_bad_models_json(tmp_path):
    run = write_synthetic_run(tmp_path)
    write_fit(run, fit_profile(run))
    path = run / "fit" / "models.json"
    data = json.loads(path.read_text())
    del data["linear"]
    path.write_text(json.dumps(data))
    with pytest.raises(InputError, match="linear"):
        load_fit(run)


PREFILL_SQUARE = {"target": 2e-8, "draft": 3e-9}  # seconds per prompt token², per prompt


def test_prefill_gets_a_square_term_only_when_a_line_misses_the_profiled_prompts(tmp_path):
    """Attention over a prompt grows with its length squared: when the prefill rows bend (here out to
    1024 tokens) the fit adds a per-prompt term in L² and prices every row; on rows a line prices it
    stays a line (no third coefficient chasing noise)."""
    curved = fit_profile(write_synthetic_run(tmp_path / "curved", prefill_square=PREFILL_SQUARE))
    for name, square in PREFILL_SQUARE.items():
        line = curved.prefill[name]
        per, fixed = PREFILL[name]
        assert line.per_square_token_s == pytest.approx(square, rel=1e-3)
        assert line.per_token_s == pytest.approx(per, rel=1e-3) and line.fixed_s == pytest.approx(fixed, rel=1e-3)
        assert curved.prefill_mape[name] < 1e-6
        # a batch of 3 prompts of 600: 3·600 tokens, each prompt's attention 600²
        assert line.time(1800, 3 * 600 ** 2) == pytest.approx(1800 * per + 3 * 600 ** 2 * square + fixed)
    straight = fit_profile(write_synthetic_run(tmp_path / "straight"))
    assert all(straight.prefill[name].per_square_token_s == 0.0 for name in PREFILL)
    # `autospec fit` says which fit each model's prefill took
    for name, with_term in (("curved", True), ("straight", False)):
        res = runner.invoke(app, ["fit", str(tmp_path / name)], env={"COLUMNS": "200", "NO_COLOR": "1"})
        assert res.exit_code == 0, res.output
        assert "prefill MAPE (in-sample)" in res.output
        assert ("(with L² term)" in res.output) is with_term
