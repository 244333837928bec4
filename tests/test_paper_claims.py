"""benchmarks/paper_claims.py: a `--quick` run of two papers on the simulator and the torch engine writes
claim records of the documented schema; bad flags are one line and exit 2; the verdict rules."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import paper_claims

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "paper_claims.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True,
                          timeout=900)


@pytest.mark.slow
def test_quick_run_writes_claims_for_the_chosen_papers(tmp_path):
    out, keep = tmp_path / "claims.json", tmp_path / "keep"
    res = _run("--quick", "--only", "laps-sd", "--only", "DSDE", "--out", str(out), "--keep", str(keep))
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    result = paper_claims.PaperClaims.model_validate(data)  # the claim records' pydantic schema
    assert result.quick and result.settings["papers"] == ["dsde", "laps-sd"]
    assert [c.paper for c in result.claims] == ["DSDE", "LAPS-SD"]
    for claim in data["claims"]:
        assert set(claim) >= {"paper", "claim", "metric", "sim", "real", "verdict", "reason"}
        assert claim["verdict"] in ("holds", "partly", "does not hold")
        for engine in ("sim", "real"):
            assert isinstance(claim[engine], float) and math.isfinite(claim[engine])
            assert claim[engine] == claim["details"][engine]["value"]
        outcomes = (claim["details"]["sim"]["outcome"], claim["details"]["real"]["outcome"])
        assert claim["verdict"] == paper_claims.verdict_of(*outcomes)
        assert "simulator" in claim["reason"] and "torch engine" in claim["reason"]
    laps = next(c for c in result.claims if c.paper == "LAPS-SD")
    # the real engine replayed the workload: wall-clock latencies, one per baseline
    real_points = laps.details["real"].points
    assert [p["baseline"] for p in real_points] == ["las", "lp-sjf"]
    assert all(p["laps_sd_e2e_mean_s"] > 0 and p["baseline_e2e_mean_s"] > 0 for p in real_points)
    assert laps.real == pytest.approx(real_points[0]["laps_sd_e2e_mean_s"]
                                      / min(p["baseline_e2e_mean_s"] for p in real_points))
    dsde = next(c for c in result.claims if c.paper == "DSDE")
    assert [p["rate"] for p in dsde.details["sim"].points] == paper_claims.QUICK.rates
    assert result.wall_s["real"] > 0 and result.load_average_at_start
    assert (keep / "real" / "bursty-8" / "eval" / "steps.parquet").is_file()

    # --resume reuses every finished evaluation under --keep and judges them the same way
    again = tmp_path / "again.json"
    res = _run("--quick", "--only", "dsde,laps-sd", "--out", str(again), "--keep", str(keep), "--resume")
    assert res.returncode == 0, res.stderr[-3000:]
    resumed = json.loads(again.read_text())
    assert resumed["claims"] == data["claims"]
    assert sorted(resumed["settings"]["reused_evaluations"]) == sorted(
        f"{label}/{stem}" for label in ("sim", "sim_real_size", "real")
        for stem in ((f"poisson-12-{40 if label == 'sim' else 8}"), f"bursty-{40 if label == 'sim' else 8}"))


def test_bad_flags_are_one_line_exit_2_and_write_nothing(tmp_path):
    out = tmp_path / "claims.json"
    for args, word in ((["--only", "adaspec,medusa"], "medusa"), (["--resume"], "--keep"),
                       (["--profile", str(tmp_path)], "fit/models.json")):
        res = _run(*args, "--out", str(out))
        assert res.returncode == 2, args
        assert res.stderr.strip().count("\n") == 0 and word in res.stderr and "Traceback" not in res.stderr
        assert not out.exists()


def test_verdict_rules():
    assert paper_claims.verdict_of("holds", "holds") == "holds"
    assert paper_claims.verdict_of("fails", "fails") == "does not hold"
    for pair in (("holds", "fails"), ("fails", "holds"), ("partly", "partly"), ("holds", "partly")):
        assert paper_claims.verdict_of(*pair) == "partly"
    assert paper_claims.outcome_of([True, True]) == "holds"
    assert paper_claims.outcome_of([True, False]) == "partly"
    assert paper_claims.outcome_of([False, False]) == "fails"
    assert paper_claims.ratio(0.0, 0.0) == 1.0  # nobody met the SLO: a tie
    assert paper_claims.parse_only(["FASER, adaspec"]) == ["adaspec", "faser"]  # in the papers' order
