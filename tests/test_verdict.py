"""benchmarks/verdict.py: the tie rule and Kendall's τ-b it ranks with, and a `--quick` run on the committed
CI profile writing the documented figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autospec.evaluate import open_sim_replay
from autospec.strategy import load_preset, preset_path
from autospec.workloads.spec import load_workload

from benchmarks import verdict
from stage_helpers import SlowedOnce

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "reports" / "ci-profile"


def _ci(mean: float, half_width: float) -> dict:
    return {"mean": mean, "ci_low": mean - half_width, "ci_high": mean + half_width}


def test_overlapping_cis_share_a_rank_and_separated_ones_do_not():
    cis = [_ci(3.0, 0.1), _ci(1.0, 0.1), _ci(1.15, 0.1), _ci(2.0, 0.1)]
    assert verdict.tied_ranks(cis) == [2, 0, 0, 1]
    # a chain of overlaps ties only what reaches the group's best: 1.0 and 1.15 tie, 1.3 does not reach 1.0's CI
    assert verdict.tied_ranks([_ci(1.0, 0.1), _ci(1.15, 0.1), _ci(1.3, 0.1)]) == [0, 0, 1]
    assert verdict.tied_ranks([_ci(1.0, 0.0), _ci(1.0, 0.0)]) == [0, 0]
    # a strategy every run of which was disturbed (no mean) ranks last, tied with any other such
    none = {"mean": None, "ci_low": None, "ci_high": None}
    assert verdict.tied_ranks([none, _ci(2.0, 0.1), _ci(1.0, 0.1), none]) == [2, 1, 0, 2]


def test_a_cell_left_with_one_measured_run_borrows_the_widest_repeat_spread_before_ranking():
    # repeats spread ±2% and ±5%; the third cell kept one run of three (two disturbed): its zero-wide CI
    # would separate it from the ±5% cell 8% below it, the borrowed ±5% ties them
    cells = [_ci(1.00, 0.02), _ci(1.20, 0.06), {"mean": 1.30, "ci_low": 1.30, "ci_high": 1.30}]
    runs = [[0.99, 1.0, 1.01], [1.15, 1.2, 1.25], [None, 1.30, None]]
    widened = verdict.rank_intervals(cells, runs)
    assert widened[:2] == cells[:2]
    assert (widened[2]["ci_low"], widened[2]["ci_high"]) == (pytest.approx(1.30 * 0.95), pytest.approx(1.30 * 1.05))
    assert verdict.tied_ranks(cells) == [0, 1, 2]
    assert verdict.tied_ranks(widened) == [0, 1, 1]
    # an unmeasured cell stays unmeasured, and without a repeated cell nothing is borrowed
    none = {"mean": None, "ci_low": None, "ci_high": None}
    assert verdict.rank_intervals([none, cells[2]], [[None] * 3, runs[2]]) == [none, cells[2]]


def test_kendall_tau_b_counts_ties_and_is_undefined_when_one_side_ties_everything():
    assert verdict.kendall_tau_b([0, 1, 2, 3], [0, 1, 2, 3]) == pytest.approx(1.0)
    assert verdict.kendall_tau_b([0, 1, 2, 3], [3, 2, 1, 0]) == pytest.approx(-1.0)
    partial = verdict.kendall_tau_b([0, 1, 2, 3], [0, 0, 1, 2])
    assert 0.8 < partial < 1.0  # a tie on one side lowers τ-b below 1
    assert verdict.kendall_tau_b([0, 1, 2], [0, 0, 0]) is None


def test_goals_are_judged_against_the_declared_thresholds():
    figures = {"capacity_vs_best_static": 1.2, "sim_real_tpot_err_max": 0.12, "rank_agreement": None}
    assert verdict.goals_of(figures) == {"capacity_vs_best_static": True, "sim_real_tpot_err_max": False,
                                         "rank_agreement": None}



def test_a_repeat_slowed_inside_its_run_is_rerun_and_never_judges(monkeypatch):
    """tpot_runs' in-run rule: of three identical replays, the one whose steps ran slow (its probes, if any,
    would not have seen it) is re-run, and the TPOTs returned are the undisturbed ones."""
    monkeypatch.setattr(verdict, "QUIET_WAIT_S", 0.0)
    monkeypatch.setattr(verdict, "REPEAT_LOG", [])
    sim = open_sim_replay(PROFILE, load_workload(REPO / "workloads" / "bursty.toml").cap(30), k_max=8, max_batch=8)
    spec = load_preset("static-k2")
    clean = verdict.tpot_runs(sim, spec, 1.0, 3, seed=0)
    slowed = SlowedOnce(sim, seed=1)
    assert verdict.tpot_runs(slowed, spec, 1.0, 3, seed=0, clock=sim.step_clock(spec)) == clean
    assert slowed.calls == [0, 1, 2, 1]
    (cell,) = verdict.REPEAT_LOG
    assert cell["rerun"] == [[1]] and cell["kept_uneven"] == []
    # with no retries left the slowed repeat counts as unmeasured, not as a slow host
    monkeypatch.setitem(verdict.QUIET, "retries", 0)
    assert verdict.tpot_runs(SlowedOnce(sim, seed=2), spec, 1.0, 3, seed=0, clock=sim.step_clock(spec)) == [
        clean[0], clean[1], None]

def test_kept_cells_resume_with_their_host_log_and_a_cell_measured_on_a_slow_host_is_measured_again(
        tmp_path, monkeypatch):
    """Cells: a finished cell is kept as it finishes; a second verdict on the same file resumes it (its
    measure never runs) with the host log it added, except a cell one of whose runs stayed off the profiled
    speed through every retry, which is measured again; a file of other settings is refused."""
    from autospec.errors import InputError

    monkeypatch.setattr(verdict, "HOST_LOG", [])
    monkeypatch.setattr(verdict, "REPEAT_LOG", [])
    path, settings = tmp_path / "cells.json", {"run_dir": "r", "quiet": {"retries": 1, "drop": True}}
    calls = []

    def measure(name: str, last_try_disturbed: bool):
        def run():
            calls.append(name)
            verdict.HOST_LOG.append({"strategy": name, "attempt": 1, "ratios": [1.2 if last_try_disturbed else 1.0],
                                     "disturbed": last_try_disturbed})
            return {"rps": np.float64(2.5), "probes": [(1.0, 0.95)]}
        return run

    first = verdict.Cells(path, settings)
    quiet = first.get("cap a", "real_cap a", measure("a", False))
    first.get("cap b", "real_cap b", measure("b", True))
    assert quiet == {"rps": 2.5, "probes": [[1.0, 0.95]]}  # as JSON gives it back, fresh or resumed
    assert calls == ["a", "b"] and len(verdict.HOST_LOG) == 2

    monkeypatch.setattr(verdict, "HOST_LOG", [])
    again = verdict.Cells(path, settings)
    assert again.get("cap a", "real_cap a", measure("a", False)) == quiet
    again.get("cap b", "real_cap b", measure("b", False))
    assert calls == ["a", "b", "b"]  # a resumed, b measured again
    assert [run["strategy"] for run in verdict.HOST_LOG] == ["a", "b"]
    record = again.record()
    assert record["resumed"] == ["real_cap a"] and record["remeasured"] == ["real_cap b"]
    assert set(record["measured"]) == {"real_cap a", "real_cap b"}
    # each cell says what the probe read around its own runs: b's re-measurement read 1.0, a's kept 1.0
    assert record["measured"]["real_cap b"]["probe"] == {"tries": 1, "tries_off": 0, "median": 1.0,
                                                        "range": [1.0, 1.0]}
    assert verdict.probe_summary([{"attempt": 0, "ratios": [0.9, 1.3], "disturbed": True},
                                  {"attempt": 1, "ratios": [1.0], "disturbed": False}]) == {
        "tries": 2, "tries_off": 1, "median": 1.0, "range": [0.9, 1.3]}
    assert verdict.probe_summary([]) is None
    # b's new measurement replaced the slow one: a third sitting resumes both
    third = verdict.Cells(path, settings)
    third.get("cap b", "real_cap b", measure("b", True))
    assert calls == ["a", "b", "b"] and third.resumed == ["real_cap b"]
    # without the drop rule (--quick) a disturbed run is kept anyway, and so is its cell
    assert not verdict.Cells(None, {**settings, "quiet": {"retries": 1, "drop": False}}).off_host(
        {"host_log": [{"attempt": 1, "disturbed": True}]})
    with pytest.raises(InputError, match="kept cells of another verdict"):
        verdict.Cells(path, {**settings, "run_dir": "other"})


class ProbedAt:
    """The simulator replay of a window whose runs come back with host-speed probe readings, as a real
    engine's do (ServeRecords.host_speed): `readings[i]` for the i-th run."""

    def __init__(self, sim, readings: list[list[float]]):
        self.sim, self.readings, self.runs = sim, readings, 0

    def run(self, spec, seed, *, requests=None):
        records = self.sim.run(spec, seed, requests=requests)
        records.host_speed = self.readings[self.runs]
        self.runs += 1
        return records


def test_a_resume_on_a_host_at_another_machines_speed_is_refused_after_its_first_run(tmp_path, monkeypatch):
    """Cells + quiet_run: the first real run after a resume reads the host against the profile the kept
    cells were judged by. Every try beyond HOST_SPEED_DISTURBED (a VM 3x as fast): one line naming the
    kept file, and nothing added to it. A slow spell the retries outlast, or a far reading that a retry
    contradicts, resumes; a fresh verdict, and the runs after the first, are never refused."""
    from autospec.errors import InputError

    monkeypatch.setattr(verdict, "QUIET_WAIT_S", 0.0)
    monkeypatch.setattr(verdict, "HOST_LOG", [])
    monkeypatch.setattr(verdict, "REPEAT_LOG", [])
    sim = open_sim_replay(PROFILE, load_workload(REPO / "workloads" / "bursty.toml").cap(6), k_max=8, max_batch=8)
    spec = load_preset("no-sd")
    monkeypatch.setattr(verdict, "QUIET", {"retries": 2, "drop": True})  # as main sets it; Cells keeps a copy
    path, settings = tmp_path / "cells.json", {"run_dir": "r", "quiet": dict(verdict.QUIET)}

    def measure(replay):
        return lambda: {"served": len(verdict.quiet_run(replay, spec, 0, sim.requests).requests)}

    fresh = verdict.Cells(path, settings)
    fresh.get("a", "cell a", measure(ProbedAt(sim, [[0.3, 0.3]] * 3)))  # a fresh verdict is never refused
    kept = path.read_text()

    faster = ProbedAt(sim, [[0.33, 0.34], [0.32, 0.35], [0.34, 0.33]])
    with pytest.raises(InputError, match=r"cells.json: the kept cells cannot be resumed on this host: every probe "
                                         r"of the first run read its steps at 0.32-0.35x .* \(6 readings"):
        verdict.Cells(path, settings).get("b", "cell b", measure(faster))
    assert faster.runs == 3 and path.read_text() == kept and not verdict.RESUME_CHECK

    for readings in ([[1.3, 1.3], [1.02, 1.0]],  # a slow spell, then the profile's speed
                     [[0.3, 0.3], [0.3, 1.45], [0.31, 0.3]]):  # one reading within reach of the profile
        resumed = verdict.Cells(path, settings)
        resumed.get("b", "cell b", measure(ProbedAt(sim, readings)))
        assert not resumed.host_unchecked and not verdict.RESUME_CHECK
        resumed.get("c", "cell c", measure(ProbedAt(sim, [[0.3, 0.3]] * 3)))  # checked once, not again
        path.write_text(kept)
    # a resume whose first cell runs nothing real (the simulator's) checks at the next that does
    sim_only = verdict.Cells(path, settings)
    sim_only.get("s", "cell s", lambda: {"rps": 1.0})
    assert sim_only.host_unchecked and not verdict.RESUME_CHECK
    with pytest.raises(InputError, match="cannot be resumed"):
        sim_only.get("b", "cell b", measure(ProbedAt(sim, [[2.0, 2.1]] * 3)))


def test_the_step_gap_carries_the_real_runs_prefill_probe():
    """sim / real − 1 per step_account figure, and beside them the real runs' prefill probe (vLLM's;
    None where the real engine has none), which says whether the host prefilled at its profiled speed."""
    sim = {key: 2.0 for key in verdict.STEP_GAP_KEYS}
    real = {**{key: 2.5 for key in verdict.STEP_GAP_KEYS}, "probe_prefill_speed": 0.8}
    gap = verdict.step_gap(sim, real)
    assert all(gap[key] == pytest.approx(-0.2) for key in verdict.STEP_GAP_KEYS)
    assert gap["probe_prefill_speed"] == 0.8
    assert verdict.step_gap(sim, {key: 2.5 for key in verdict.STEP_GAP_KEYS})["probe_prefill_speed"] is None
    assert verdict.step_gap(None, real) is None


def _quick_verdict(out: Path, keep: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / "verdict.py"), "--quick", "--no-heldout",
                           "--window", "6", "--repeats", "1", "--out", str(out), "--keep", str(keep), *extra],
                          cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_quick_run_writes_the_verdict_figures_and_a_kept_run_resumes_its_real_cells(tmp_path):
    out, keep = tmp_path / "verdict.json", tmp_path / "keep"
    res = _quick_verdict(out, keep)
    assert res.returncode == 0, res.stderr[-3000:]
    data = json.loads(out.read_text())
    default = data["default"]
    assert set(data["capacity_rps"]) == {"no-sd", "best_static", "tuned"}
    for row in data["capacity_rps"].values():
        assert row["sim"] > 0 and row["real"] > 0 and row["real_probes"]
    assert default["best_static"] in verdict.STATIC
    assert default["tuned"]["name"].startswith("tuned-")  # tune/best.toml, the study's best
    # the best static K is the one with the highest torch capacity
    statics = default["capacity_rps_static"]
    assert statics[default["best_static"]]["real"] == max(s["real"] for s in statics.values())
    assert default["rank_set"] == [*verdict.RANK_SET, "tuned"]
    ranks = default["ranks"]["capacity_point"]
    assert len(ranks["sim"]) == len(ranks["real"]) == len(default["rank_set"])
    assert data["rank_agreement"] == verdict.kendall_tau_b(ranks["sim"], ranks["real"])
    assert set(default["sim_real_tpot_err"]) == {f"{n}@{load}" for n in ("no-sd", default["best_static"], "tuned")
                                                 for load in ("capacity_point", "half")}
    assert data["sim_real_tpot_err_max"] == max(default["sim_real_tpot_err"].values())
    # each cell's step accounts on both engines, and the confirmed cells' gaps between them
    assert set(default["sim_real_step_gap"]) == set(default["sim_real_tpot_err"])
    cell = default["tpot_mean_s"]["no-sd"]["capacity_point"]
    for side in ("sim_steps", "real_steps"):
        assert cell[side]["plain_tokens_per_request"] == 1.0 and cell[side]["steps"] > 0
    gap = default["sim_real_step_gap"]["no-sd@capacity_point"]
    assert gap["plain_tokens_per_request"] == 0.0
    sim_s, real_s = cell["sim_steps"]["plain_step_s"], cell["real_steps"]["plain_step_s"]
    if real_s:
        assert gap["plain_step_s"] == pytest.approx(sim_s / real_s - 1)
    point = default["tpot_mean_s"]["no-sd"]["capacity_point"]["real"]["mean"]
    assert data["tpot_speedup"]["best_static"] == pytest.approx(
        point / default["tpot_mean_s"][default["best_static"]]["capacity_point"]["real"]["mean"])
    assert data["goals_met"] == verdict.goals_of(default)
    assert data["benchmark"] == "verdict" and data["rows"] == verdict.gate_rows(default, "default", "torch")
    headroom = default["schedule_headroom"]
    assert headroom["max_gain"] >= 1.0 and set(headroom["per_batch"]) <= {"1", "2", "4", "8"}
    assert data["heldout"] is None and "skipped" in data["heldout_status"]
    # every torch run was bracketed by the host-speed check; --quick retries none
    host = data["host_speed"]
    assert host["runs"] > 0 and host["retries"] == 0 and host["range"][0] > 0
    # each real TPOT cell's repeats had their step speeds compared (tpot_runs); with no retries none re-run
    assert host["repeat_cells"] > 0 and host["repeats_rerun"] == 0 and len(host["repeat_log"]) == host["repeat_cells"]
    assert host["prefill_range"] is None and gap["probe_prefill_speed"] is None  # torch has no prefill probe
    # every real cell was kept as it finished: 6 capacity searches (no-SD, static K 1-4, tuned) + 7 strategies x
    # 2 loads, less tuned's where it is one of the presets (the same replays); none resumed in a fresh folder
    cells = default["real_cells"]
    assert cells["resumed"] == [] and cells["kept_in"] == str(keep / "default-cells.json")
    same = default["tuned"]["same_as"]
    searched_twice = any(name in ("no-sd", *verdict.STATIC) for name in same)
    assert len(cells["measured"]) == 6 - searched_twice + 2 * (7 - bool(same))

    # the same command on the same --keep reuses the finished run and every kept cell: no real replay runs
    # again, and the figures and the host log are those of the first run
    again = _quick_verdict(tmp_path / "again.json", keep)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "reusing the finished run" in again.stdout
    second = json.loads((tmp_path / "again.json").read_text())
    assert sorted(second["default"]["real_cells"]["resumed"]) == sorted(cells["measured"])
    for key in ("capacity_rps", "sim_real_tpot_err_max", "rank_agreement", "tpot_speedup"):
        assert second[key] == data[key]
    assert second["default"]["tpot_mean_s"] == default["tpot_mean_s"]
    assert second["host_speed"] == host
    # other settings on the same --keep are refused, not mixed with its cells
    other = _quick_verdict(tmp_path / "other.json", keep, "--seed", "1")
    assert other.returncode == 2 and "kept cells of another verdict" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1 and not (tmp_path / "other.json").exists()


def test_a_run_dir_without_a_tune_summary_is_one_line_and_exit_2(tmp_path):
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "verdict.py"), "--run-dir", str(tmp_path),
                          "--out", str(tmp_path / "v.json")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and "tune/summary.json" in res.stderr
    assert not (tmp_path / "v.json").exists()


def _finished_run(path: Path) -> Path:
    """The two files verdict.py checks before judging a run directory (a torch run with every default)."""
    (path / "tune").mkdir(parents=True)
    (path / "tune" / "summary.json").write_text("{}")
    (path / "config.toml").write_text("")
    return path


@pytest.mark.parametrize("args, says", [
    (["--engine", "vllm"], "a run on the torch engine, not --engine vllm"),
    (["--engine", "tpu"], "unknown engine 'tpu'"),
    (["--default-from", "missing.json"], "cannot read an earlier verdict"),
    (["--default-from", "list.json"], "not a verdict (the JSON is not an object)"),
])
def test_a_run_dir_of_another_engine_or_a_bad_earlier_verdict_is_one_line_and_exit_2(tmp_path, args, says):
    run = _finished_run(tmp_path / "run")
    (tmp_path / "list.json").write_text("[1, 2]")
    res = subprocess.run([sys.executable, str(REPO / "benchmarks" / "verdict.py"), "--run-dir", str(run),
                          "--out", str(tmp_path / "v.json"), *args], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2, res.stderr[-2000:]
    assert len(res.stderr.strip().splitlines()) == 1 and says in res.stderr
    assert not (tmp_path / "v.json").exists()


def test_the_heldout_run_reuses_the_default_profile_only_when_the_default_is_judged_in_the_same_sitting(tmp_path):
    base = {"stages": ["profile", "fit", "tune"], "engine": {"kind": "vllm"}}
    workload = tmp_path / "heldout.toml"
    same_sitting = verdict.heldout_config(base, workload, tmp_path / "default")
    assert same_sitting == {**base, "workload": str(workload), "profile": {"reuse": str(tmp_path / "default")}}
    later = verdict.heldout_config(base, workload, None)  # --default-from: profiled in this sitting
    assert later == {**base, "workload": str(workload)} and "profile" not in base
    quick = {**base, "profile": {"reuse": "ci-profile"}}
    assert verdict.heldout_config(quick, workload, None)["profile"] == {"reuse": "ci-profile"}


def test_an_earlier_verdict_of_other_settings_or_another_run_is_refused(tmp_path):
    from autospec.errors import InputError

    run = _finished_run(tmp_path / "run")
    (run / "tune" / "best.toml").write_text(preset_path("static-k2").read_text())
    tuned = verdict.load_preset(run / "tune" / "best.toml").model_dump(mode="json")
    earlier = {"quick": False, "settings": {"window_requests": 60, "repeats": 3, "seed": 0, "target": 0.9},
               "default": {"tuned": {"spec": tuned}, "capacity_rps": {}}, "host_speed": {"runs": 1},
               "wall_s": {"default_verdict": 10.0, "total": 10.0}}
    path = tmp_path / "earlier.json"
    path.write_text(json.dumps(earlier))
    default, wall = verdict.earlier_default(path, run, 60, 3, 0, False)
    assert default["host_speed"] == {"runs": 1} and wall == {"default_verdict": 10.0}
    with pytest.raises(InputError, match="repeats"):
        verdict.earlier_default(path, run, 60, 2, 0, False)
    earlier["default"]["tuned"]["spec"] = {**tuned, "length": {"policy": "static", "k": 3}}
    path.write_text(json.dumps(earlier))
    with pytest.raises(InputError, match="judged on another run"):
        verdict.earlier_default(path, run, 60, 3, 0, False)


@pytest.mark.parametrize("name, engine", [("verdict.json", "torch"), ("verdict_vllm.json", "vllm")])
def test_autospec_gate_compares_two_verdicts_by_trace_and_role(tmp_path, name, engine):
    """The committed verdict is a benchmark result the gate reads: against itself it passes; a candidate
    whose tuned configuration lost a fifth of its real capacity, or whose simulator drifted to twice the
    TPOT error, fails, naming the row; the rows are what `gate_rows` makes of the judged figures."""
    committed = REPO / "benchmarks" / "results" / name
    data = json.loads(committed.read_text())
    expected = verdict.gate_rows(data["default"], "default", engine)
    if data["heldout"]:
        expected += verdict.gate_rows(data["heldout"], "heldout", engine)
    assert data["benchmark"] == "verdict" and data["rows"] == expected

    def gate(candidate: dict) -> subprocess.CompletedProcess:
        path = tmp_path / "candidate.json"
        path.write_text(json.dumps(candidate))
        return subprocess.run([sys.executable, "-m", "autospec", "gate", "--baseline", str(committed),
                               "--candidate", str(path)], capture_output=True, text=True, timeout=120)

    same = gate(data)
    assert same.returncode == 0, same.stdout + same.stderr
    for role, key, factor in (("tuned", f"{engine}_capacity_rps", 0.8),
                              ("agreement", "err_sim_real_tpot_max", 2.0)):
        worse = json.loads(json.dumps(data))
        row = next(r for r in worse["rows"] if r["trace"] == "default" and r["role"] == role)
        row[key] *= factor
        res = gate(worse)
        assert res.returncode == 1, res.stdout + res.stderr
        assert f"trace=default role={role}" in res.stdout and key in res.stdout
