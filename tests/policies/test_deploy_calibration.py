"""deploy/ carries what a DSpark strategy was evaluated with (issue 15): `write_deploy` bakes the run's
fitted calibrator and SPS(B) table into autospec_strategy.toml, so the deployed file, loaded with no fit
anywhere, computes the same survivals and verifies the same drafts as the evaluated policy; a deploy
without a fit says the policy is uncalibrated, as evaluate does."""

from __future__ import annotations

import logging
import shutil

import numpy as np
import pytest

from autospec.config import PairSpec
from autospec.deploy import STRATEGY_FILE, write_deploy
from autospec.fit import fit_profile, load_fit, write_fit
from autospec.policies.dspark import survivals
from autospec.strategy import build_strategy, calibration_flags, load_preset, uncalibrated_warnings

from policy_helpers import make_ctx, make_drafts
from stage_helpers import K_MAX, write_synthetic_run


def random_chains(seed: int = 0, n: int = 40) -> list[list[float]]:
    """Draft chains of 1..K_MAX confidences, spread over (0, 1)."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(0.02, 0.999, int(rng.integers(1, K_MAX + 1))).tolist() for _ in range(n)]


@pytest.mark.parametrize("preset", ["dspark", "dspark-async"])
def test_a_deployed_dspark_carries_the_fits_calibrator_and_sps_table(tmp_path, preset):
    run = write_synthetic_run(tmp_path / "run")
    write_fit(run, fit_profile(run))
    fit = load_fit(run)
    assert fit.calibrator.kind != "identity"  # the synthetic draft is overconfident: the fit calibrates it
    info = write_deploy(run / "deploy", load_preset(preset), PairSpec(), 8, validate=False)
    assert info["calibration"] == {"calibrated": True, "kind": fit.calibrator.kind, "source": "preset"}
    assert not any("uncalibrated" in n for n in info["notes"])

    # the deployed file alone: no run directory, no fit anywhere
    shutil.copytree(run / "deploy", tmp_path / "deployed")
    shutil.rmtree(run)
    spec = load_preset(tmp_path / "deployed" / STRATEGY_FILE)
    deployed = build_strategy(spec).verify
    assert deployed.params.calibration == fit.calibrator
    assert deployed.params.sps_tokens == fit.sps[0] and deployed.params.sps_values == fit.sps[1]

    # its calibrated confidences are the fit's calibrator's, on chains of every length
    chains = random_chains()
    padded = np.full((len(chains), K_MAX), np.nan)
    for i, c in enumerate(chains):
        padded[i, : len(c)] = c
    np.testing.assert_array_equal(deployed.params.calibrator.survival(padded), fit.calibrator.survival(padded))
    drafts = make_drafts(chains)
    assert survivals(drafts, deployed.params.calibrator) == survivals(drafts, fit.calibrator)

    # and, step after step, it verifies what the evaluated policy (the preset built with the run's fit)
    # verified, where the raw confidences would verify something else
    def decisions(strategy_spec, fit_inputs=None) -> list[list[int]]:
        verifier = build_strategy(strategy_spec, fit_inputs).verify  # fresh state (dspark-async's history)
        return [verifier.select(make_ctx(2, k_max=K_MAX), make_drafts(chains[b: b + 2]))  # batches of two:
                for b in range(0, len(chains), 2)]                                  # in the SPS table's range

    evaluated = decisions(load_preset(preset), fit.policy_inputs)
    assert decisions(spec) == evaluated
    raw = {k: v for k, v in fit.policy_inputs.items() if k != "calibration"}
    assert decisions(load_preset(preset), raw) != evaluated

    # it runs calibrated without a fit: no warning; the preset's (baked) calibrator wins over a later fit's
    assert uncalibrated_warnings([spec], None) == []
    assert calibration_flags([spec], None)[preset] == {"calibrated": True, "kind": fit.calibrator.kind,
                                                       "source": "preset"}


def test_a_deploy_without_a_fit_says_dspark_is_uncalibrated(tmp_path, caplog):
    info = write_deploy(tmp_path / "alone" / "deploy", load_preset("dspark"), PairSpec(), 8, validate=False)
    assert info["calibration"] == {"calibrated": False, "kind": "identity", "source": None}
    note = [n for n in info["notes"] if "uncalibrated" in n]
    assert len(note) == 1 and "no fit/models.json beside deploy/" in note[0]
    assert note[0] in (tmp_path / "alone" / "deploy" / "README.md").read_text()
    spec = load_preset(tmp_path / "alone" / "deploy" / STRATEGY_FILE)
    assert spec == load_preset("dspark")  # nothing to bake: the preset as it is
    with caplog.at_level(logging.WARNING, logger="autospec.strategy"):
        lines = uncalibrated_warnings([spec], None)
    assert len(lines) == 1 and "dspark runs uncalibrated" in lines[0]
    assert calibration_flags([spec], None)["dspark"]["calibrated"] is False
    # a strategy with no calibrated policy has no flag and no note
    info = write_deploy(tmp_path / "k2" / "deploy", load_preset("static-k2"), PairSpec(), 8, validate=False)
    assert info["calibration"] is None and not any("uncalibrated" in n for n in info["notes"])
