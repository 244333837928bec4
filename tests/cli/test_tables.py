"""The CLI's result tables at a plain 80-column terminal (CI logs, nohup): every strategy name stays whole
on one line, since the name is what a user copies (a wrapped "tuned-static…" hides which K was tuned)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from autospec import cli

NAMES = ["no-sd", "static-k2", "static-k4", "adaspec", "oracle", "tuned-static-k2"]


def _metrics(capacity: float | None, attainment: float | None, speedup: float) -> dict:
    return {"capacity_rps": {"mean": capacity}, "slo_attainment": {"mean": attainment},
            "tpot_speedup_vs_no_sd": {"mean": speedup}}


def _confirmation() -> dict:
    def row(name: str, why: str, mean: float) -> dict:
        return {"strategy": name, "why": why, "real_attainment": {"mean": mean, "ci_low": mean - 0.01,
                                                                    "ci_high": mean + 0.01},
                "sim_attainment": 0.9, "tied_with_best": True}
    return {"status": "confirmed", "scales": [0.431, 0.479, 0.527], "window_requests": 60, "repeats": 2,
            "recommended": "tuned-static-k2-long-user-name",
            "reason": "tuned-static-k2-long-user-name: real SLO attainment 0.714",
            "candidates": [row("tuned-static-k2-long-user-name", "tune rank 1", 0.714),
                           row("k-schedule", "tune rank 2", 0.689), row("no-sd", "no-SD reference", 0.739)]}


@pytest.fixture
def printed(monkeypatch):
    sink = io.StringIO()
    monkeypatch.setattr(cli, "out", Console(file=sink, width=80, color_system=None))
    return sink


@pytest.mark.parametrize("engine", ["torch", "vllm"])
def test_the_run_table_keeps_every_strategy_name_on_one_line(printed, tmp_path, engine):
    result = {"real_engine": engine,
              "evaluate_sim": {"strategies": {n: _metrics(2.5, None, 0.98) for n in NAMES}},
              "evaluate_real": {"strategies": {"no-sd": _metrics(None, 0.23, 1.0),
                                               "tuned-static-k2": _metrics(None, 0.25, 0.96)}},
              "tune": {"best": {"name": "tuned-static-k2", "number": 6}, "confirmed": _confirmation(),
                       "deploy": {"strategy": "tuned-static-k2", "dir": str(tmp_path), "files": ["a.toml"],
                                  "vllm_supported": True}}}
    cli._print_run(result, tmp_path)
    lines = printed.getvalue().splitlines()
    assert max(len(line) for line in lines if line[:1] in "┏┃┡│└") <= 80  # the prose lines soft-wrap
    for name in NAMES:
        assert any(line.startswith("│ " + name + " ") for line in lines), name
    assert any("│ tuned-static-k2 (tuned) " in line for line in lines)
    assert any("│ tuned-static-k2-long-user-name ✓ " in line for line in lines)  # the confirmation's table
    assert any("│ (tune rank 1) " in line for line in lines)
    assert any("2.5 " in line and "25% " in line and "0.96×" in line for line in lines)  # values stay in the row
    assert any("71.4% │ [70.4%, 72.4%] │" in line for line in lines)


def test_the_evaluate_table_keeps_every_strategy_name_and_figure_whole(printed, tmp_path):
    from types import SimpleNamespace

    odd = {"tpot_mean": 0.0123, "slo_attainment": 1.0}  # 12.3 ms, 100%; every other column 1.04
    every = {key: {"mean": odd.get(key, 1.04)} for key, _, _ in cli.EVALUATE_COLUMNS}
    names = ["no-sd", "static-k4", "adaspec", "smartspec", "tuned-static-k2", "deployed-static-k2",
             "deployed-k-schedule-ab"]  # 22 characters
    summary = {"workload": {"name": "bursty"}, "strategies": {n: every for n in names}}
    spec = SimpleNamespace(max_concurrency=None, closed_loop=False, repeats=3,
                           slo=SimpleNamespace(ttft_s=1.0, tpot_s=0.05))
    cli._print_evaluate(summary, spec, tmp_path / "w.toml", "sim", tmp_path)
    lines = printed.getvalue().splitlines()
    assert max(len(line) for line in lines if "│" in line or "━" in line) <= 80  # the prose lines soft-wrap
    rows = [line for line in lines if "│" in line and "12.3" in line]
    assert [row.split("│")[0].strip() for row in rows] == names
    assert all(row.count("1.04") == len(cli.EVALUATE_COLUMNS) - 2 and "100%" in row for row in rows)


def test_tunes_table_names_the_best_trial_by_what_it_runs(printed, tmp_path):
    from types import SimpleNamespace

    best = {"number": 6, "strategy": "static-k4", "name": "tuned-static-k2", "feasible": True,
            "params": {"static-k4.length.k": 2}, "metrics": {"capacity_rps": 2.73}, "value": 2.73}
    summary = {"study_name": "s", "objective": "capacity", "best": best, "best_deployable": best,
               "deploy": {"dir": str(tmp_path), "strategy": "deployed-static-k2", "vllm_supported": True}}
    cli._print_tune(summary, SimpleNamespace(time_budget_s=None), tmp_path)
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in printed.getvalue().splitlines()
            if line.startswith("│ ")}
    assert rows["strategy"] == "tuned-static-k2" and rows["searched candidate"] == "static-k4"
