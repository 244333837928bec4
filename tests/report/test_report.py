"""`autospec report` on a real run directory (synthetic profile → fit → sim evaluation → Optuna study):
the two files, escaping of user strings, the bad-input contract, and the page in headless Chromium."""

from __future__ import annotations

import os
import re
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

from autospec.artifacts import read_json, write_json
from autospec.fit import fit_profile, write_fit

from stage_helpers import synthetic_workload, write_synthetic_run

AUTOSPEC = [sys.executable, "-m", "autospec.cli"]
EVIL = "<script>alert(1)</script>"
EVIL_STRATEGY = "<img src=x onerror=alert(2)>"
CHROMIUM = Path("/usr/bin/chromium")

WORKLOAD = synthetic_workload(EVIL, rate=8, duration_s=10, max_requests=30, prompt_tokens=24, output_tokens=12,
                              seed=1, bundled_prompts=True)


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*AUTOSPEC, *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})


def _write_tuning(run: Path) -> None:
    """A real (tiny) Optuna study stored the way `autospec tune` stores one."""
    import optuna

    from autospec.artifacts import write_parquet

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=0))

    def objective(trial):
        k = trial.suggest_int("k", 1, 8)
        s = trial.suggest_categorical("strategy", ["static", EVIL_STRATEGY])
        return 1.0 + 0.1 * k - 0.02 * k * k + (0.05 if s == "static" else 0.0)

    study.optimize(objective, n_trials=12)
    write_parquet(run / "tune" / "trials.parquet", study.trials_dataframe())
    write_json(run / "tune" / "summary.json", {
        "objective": "goodput", "direction": "maximize",
        "best": {"strategy": study.best_params["strategy"], "params": study.best_params, "value": study.best_value},
        "deployed": {"name": "adaspec"},  # deploy/'s pick, one of the evaluated strategies
        "deploy": {"strategy": "adaspec", "vllm_supported": False},
        "param_importances": optuna.importance.get_param_importances(study)})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report")
    run = write_synthetic_run(root / "run")
    write_fit(run, fit_profile(run))
    workload = root / "evil.toml"
    workload.write_text(WORKLOAD)
    preset = root / "evil-strategy.toml"
    preset.write_text((Path(__file__).resolve().parents[2] / "policies" / "static-k2.toml").read_text()
                      .replace('name = "static-k2"', f'name = "{EVIL_STRATEGY}"'))
    res = run_cli("evaluate", "--engine", "sim", "--profile", str(run), "--workload", str(workload),
                  "--strategies", f"static-k2,adaspec,{preset}", "--out", str(run), "--k-max", "4",
                  "--max-batch", "4")
    assert res.returncode == 0, res.stderr
    # A second evaluation of the same workload in a sub-run whose folder name is hostile. It is the
    # same data relabelled as a real-engine run: enough to exercise the simulator-vs-real section.
    other = run / EVIL.replace("/", "_") / "eval"
    shutil.copytree(run / "eval", other)
    summary = read_json(other / "summary.json")
    summary["engine"]["kind"] = "torch"
    for metrics in summary["strategies"].values():
        metrics["tpot_mean"]["mean"] *= 1.1
    write_json(other / "summary.json", summary)
    _write_tuning(run)
    res = run_cli("report", str(run))
    assert res.returncode == 0, res.stderr
    return run


def test_report_and_summary_are_written(run_dir):
    page = (run_dir / "report.html").read_text()
    summary = (run_dir / "summary.md").read_text()
    # Self-contained: plotly.js inlined exactly once, no external script or stylesheet.
    assert page.count("* plotly.js v") == 1
    assert not re.search(r"<script[^>]*\ssrc=", page) and "<link" not in page
    for section in ("Strategies", "Simulator vs real engine", "Latency model fit", "Acceptance calibration",
                    "Tuning", "Manifest"):
        assert section in page and (section in summary or section in ("Acceptance calibration", "Tuning",
                                                                      "Manifest"))
    n = int(re.search(r"(\d+) figures", page).group(1))
    assert n >= 12 and len(re.findall(r'id="figure-\d+"', page)) == n
    escaped = EVIL_STRATEGY.replace("<", "&lt;").replace(">", "&gt;")
    for name in ("no-sd", "static-k2", "adaspec", escaped):
        assert f"| {name} |" in summary
    assert "STS acceptance calibration" in summary and "Best tuned configuration" in summary
    assert re.search(r"\| static-k2 \| [0-9.e-]+", summary)
    # the recommendation (deploy/'s pick) at ±30% load and prompt-mix shifts, beside the best there
    title = "If the load or the prompt mix shifts by ±30%"
    assert f"{title} — eval (sim engine)" in page and f"### {title}" in summary
    assert "Recommendation: adaspec (deploy/&#39;s pick)" in page
    assert "Recommendation: adaspec (deploy/'s pick)" in summary
    for header in ("adaspec: SLO attainment", "regret (points)", "adaspec: capacity (req/s)", "regret (capacity lost)"):
        assert header in page and header in summary
    assert re.search(r"\| 1\.3× \| [0-9.e-]+ \| \S+ \| [0-9.e-]+ \| [0-9.]+% \|", summary)  # the prompt-mix row


def test_the_verdict_comes_first_with_deploys_pick_beside_no_sd_and_the_best_static_k(run_dir):
    page = (run_dir / "report.html").read_text()
    summary = (run_dir / "summary.md").read_text()
    title = "Verdict: what to deploy"
    assert summary.index(f"## {title}") < summary.index("## Strategies")
    assert page.index(title) < page.index("Strategies — eval")  # first in the page's index too
    said = ("Recommended: adaspec, in deploy/ — vLLM cannot express it (deploy/README.md). Not confirmed on a real "
            "engine (tune ran without --confirm-top): the simulator's pick.")
    assert said in summary and said.replace("'", "&#39;") in page
    rows = {line[2:].split(" | ")[0]: line for line in summary.splitlines() if line.startswith("| ")}
    assert "adaspec (deploy/)" in rows and "static-k2 (best static K, simulator)" in rows
    # the pick's capacity at the SLO, from the evaluation's own table
    capacity = re.search(r"\| adaspec \| ([0-9.e-]+) \|", summary).group(1)
    assert rows["adaspec (deploy/)"].startswith(f"| adaspec (deploy/) | {capacity} |")


def test_user_strings_are_escaped(run_dir):
    page = (run_dir / "report.html").read_text()
    summary = (run_dir / "summary.md").read_text()
    for raw in (EVIL, EVIL_STRATEGY, "<script>alert"):
        assert raw not in page and raw not in summary
    assert "&lt;script&gt;alert(1)" in page  # the workload name and the folder name, shown as text
    assert "&lt;img src=x onerror=alert(2)&gt;" in page and "&lt;img src=x onerror=alert(2)&gt;" in summary


def test_custom_output_file(run_dir, tmp_path):
    res = run_cli("report", str(run_dir), "-o", str(tmp_path / "out" / "r.html"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "out" / "r.html").stat().st_size > 1_000_000
    assert (tmp_path / "out" / "summary.md").is_file()


@pytest.mark.parametrize("make", ["missing", "empty", "bad_summary"])
def test_bad_run_directory_is_one_line_exit_2_and_writes_nothing(tmp_path, make):
    run = tmp_path / "run"
    if make != "missing":
        run.mkdir()
    if make == "bad_summary":
        (run / "eval").mkdir()
        (run / "eval" / "summary.json").write_text("{not json")
    res = run_cli("report", str(run))
    assert res.returncode == 2
    assert len(res.stderr.strip().splitlines()) == 1 and res.stderr.startswith("error:"), res.stderr
    assert "Traceback" not in res.stderr
    assert not (run / "report.html").exists() and not (run / "summary.md").exists()


# --- headless Chromium ---------------------------------------------------------------------------


def png_pixels(data: bytes) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB(A) PNG (what Chromium writes) without an imaging library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        chunk = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", chunk)
        elif kind == b"IDAT":
            idat += chunk
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows = np.zeros((height, stride), np.int32)
    prev = np.zeros(stride, np.int32)
    for y in range(height):
        ftype = raw[y * (stride + 1)]
        line = np.frombuffer(raw, np.uint8, stride, y * (stride + 1) + 1).astype(np.int32)
        if ftype == 0:
            cur = line
        elif ftype == 2:
            cur = (line + prev) & 255
        else:  # Sub, Average, Paeth depend on the pixel to the left: decode sequentially
            cur = np.zeros(stride, np.int32)
            for i in range(stride):
                a = cur[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                if ftype == 1:
                    pred = a
                elif ftype == 3:
                    pred = (a + b) // 2
                else:
                    p = a + b - c
                    pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                    pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                cur[i] = (line[i] + pred) & 255
        rows[y] = prev = cur
    return rows.reshape(height, width, bpp)[:, :, :3]


def chromium(page: Path, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess:
    """Chromium, headless and offline: proxy to a closed port and no DNS, so any fetch fails."""
    return subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-extensions", f"--user-data-dir={tmp_path / 'profile'}", "--proxy-server=127.0.0.1:9",
         "--host-resolver-rules=MAP * ~NOTFOUND", "--enable-logging=stderr", "--v=0",
         "--virtual-time-budget=10000", *extra, page.resolve().as_uri()],
        capture_output=True, text=True, timeout=180)


@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium not installed (.ci/run installs it)")
def test_report_renders_offline_in_headless_chromium(run_dir, tmp_path):
    page = run_dir / "report.html"
    n = int(re.search(r"(\d+) figures", page.read_text()).group(1))
    res = chromium(page, tmp_path, "--dump-dom")
    assert res.returncode == 0, res.stderr[-2000:]
    dom = res.stdout
    # Every figure div became a plotly plot holding an SVG; the page's own error box stayed hidden.
    plots = re.findall(r'<div id="(figure-\d+)" class="([^"]*)"', dom)
    assert len(plots) == n
    assert all("js-plotly-plot" in cls for _, cls in plots), plots
    for fig_id, _ in plots:
        start = dom.index(f'id="{fig_id}"')
        nxt = dom.find('<div id="figure-', start + 1)
        assert 'class="main-svg"' in dom[start: nxt if nxt > 0 else len(dom)], fig_id
    assert '<div id="render-errors" hidden=""></div>' in dom
    assert not re.search(r"<img\b|<script>alert", dom)  # hostile names stayed text, never elements
    # Chromium logs every console message of the page (any level) as CONSOLE on stderr.
    console = [line for line in res.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert not console, console

    shot = tmp_path / "shot.png"
    res = chromium(page, tmp_path, f"--screenshot={shot}", "--window-size=1280,1600", "--hide-scrollbars")
    assert res.returncode == 0 and shot.is_file(), res.stderr[-2000:]
    pixels = png_pixels(shot.read_bytes())
    assert pixels.shape[:2] == (1600, 1280)
    colors = np.unique(pixels[::4, ::4].reshape(-1, 3), axis=0)
    assert pixels.std() > 10 and len(colors) > 50, (pixels.std(), len(colors))  # text, tables and plots


def test_the_recommendation_is_deploys_pick_else_the_best_deployable_else_the_highest_capacity():
    from autospec.report.build import recommendation, shift_blocks

    strategies = {"no-sd": {"capacity_rps": {"mean": 2.0}}, "tuned-x": {"capacity_rps": {"mean": 3.0}},
                  "deployed-y": {"capacity_rps": {"mean": 2.5}}, "oracle": {"capacity_rps": {"mean": 9.0}}}
    point = {"strategies": {n: {"capacity_rps": m["capacity_rps"]["mean"], "slo_attainment": 0.9, "tpot_mean": 0.01,
                                "goodput": 1.0} for n, m in strategies.items()}}
    shift = {"factors": [1.0], "seed": 0, "target": 0.9, "oracles": ["oracle"], "load": [{"factor": 1.0, **point}],
             "mix": [{"factor": 1.0, **point}]}
    summary = {"strategies": strategies, "shift": shift}
    tune = {"deployed": {"name": "deployed-y"}, "best_deployable": {"name": "tuned-x"},
            "confirmed": {"recommended": "y"}}
    assert recommendation(summary, tune) == ("deployed-y", "deploy/'s pick, confirmed on the real engine")
    assert recommendation(summary, {**tune, "deployed": {"name": "elsewhere"}})[0] == "tuned-x"
    assert recommendation(summary, None)[0] == "tuned-x"  # the highest capacity, the oracle aside
    blocks = shift_blocks(summary, tune)
    assert blocks[2]["rows"] == [["1×", "2.5", "tuned-x", "3", "16.7%"]]
    assert shift_blocks({**summary, "shift": None}, tune) is None


def test_figures_are_none_without_data_and_handle_multi_objective_tuning():
    import optuna
    import pandas as pd

    from autospec.report import figures as F

    assert F.latency_cdfs(None, "x") is None and F.timeline(None, "x") is None
    assert F.latency_fit(None, None) is None and F.calibration(None, None) is None
    assert F.optuna_history(None, None) is None and F.param_importances({}) is None
    assert F.sim_vs_real([]) is None and F.eval_acceptance({"per_position_acceptance": {"no-sd": []}}, "x") is None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=["maximize", "minimize"], sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda t: (100 * t.suggest_float("x", 0, 1), t.suggest_float("y", 0.1, 1)), n_trials=8)
    trials = study.trials_dataframe()
    front = pd.DataFrame([{"number": t.number, "throughput_tok_s": t.values[0], "tpot_p99": t.values[1],
                           "strategy": EVIL} for t in study.best_trials])
    summary = {"objective": "multi", "directions": ["maximize", "minimize"],
               "objectives": ["throughput_tok_s", "tpot_p99"],
               "param_importances": {"throughput_tok_s": {"x": 0.9, "y": 0.1}}}
    history = F.optuna_history(trials, summary)
    assert len(history.data) == 4  # trials + best-so-far per objective
    assert list(history.data[3].y) == list(np.fmin.accumulate(trials["values_1"].to_numpy()))
    assert [b.y for b in F.param_importances(summary).data][0] == ("y", "x")
    pareto = F.tune_pareto(trials, front)
    assert EVIL not in pareto.to_json() and len(pareto.data) == 2


def test_a_closed_loop_runs_throughput_is_labelled_for_what_it_is():
    from autospec.report.build import strategy_table

    strategies = {"no-sd": {"throughput_tok_s": {"mean": 100.0}}}
    open_loop = strategy_table({"strategies": strategies})["columns"]
    closed = strategy_table({"strategies": strategies, "load": {"closed_loop": True, "max_concurrency": 4}})["columns"]
    assert "open-loop throughput (tok/s)" in open_loop
    assert "throughput at 4 in flight (tok/s)" in closed and not any("open-loop" in c for c in closed)


def test_the_best_trial_is_named_by_what_it_runs_beside_the_candidate_searched():
    """A static-k4 trial that searched K to 2 runs static K = 2: the table says tuned-static-k2 and keeps the
    Optuna candidate (static-k4) whose param sets K, not 'strategy static-k4' beside 'k 2'."""
    from autospec.report.build import best_table

    best = {"number": 6, "strategy": "static-k4", "name": "tuned-static-k2", "params": {"static-k4.length.k": 2},
            "value": 2.73}
    rows = dict(best_table({"best": best, "objectives": ["capacity_rps"], "scope": "engine",
                            "best_deployable": best})["rows"])
    assert rows["strategy"] == "tuned-static-k2" and rows["searched candidate"] == "static-k4"
    assert rows["param: static-k4.length.k"] == "2"


def test_the_verdict_names_the_confirmation_and_the_static_k_with_the_highest_capacity(tmp_path):
    from autospec.report.build import Evaluation, RunData, verdict_blocks

    def metrics(capacity, decode):
        return {"capacity_rps": {"mean": capacity}, "tpot_speedup_vs_no_sd": {"mean": decode}}

    sim = {"strategies": {"no-sd": metrics(2.0, 1.0), "static-k1": metrics(2.1, 1.1), "static-k3": metrics(2.4, 1.2),
                          "static-k4": metrics(2.2, 1.3), "deployed-static-k3": metrics(2.4, 1.2)}}
    real = {"strategies": {"no-sd": {"tpot_speedup_vs_no_sd": {"mean": 1.0}},
                           "deployed-static-k3": {"tpot_speedup_vs_no_sd": {"mean": 1.15}}}}
    tune = {"deploy": {"strategy": "deployed-static-k3", "vllm_supported": True},
            "confirmed": {"engine": "vllm", "candidates": [{}], "reason": "static-k3: real SLO attainment 0.9"}}
    data = RunData(tmp_path, evals=[Evaluation("eval-sim", tmp_path, sim), Evaluation("eval-vllm", tmp_path, real)],
                   tune_summary=tune)
    text, table = verdict_blocks(data)
    assert text["text"] == ("Recommended: deployed-static-k3, in deploy/ — vLLM can run it. Confirmed on vLLM: "
                            "static-k3: real SLO attainment 0.9.")
    assert table["columns"] == ["strategy", "eval-sim: capacity at SLO (req/s)", "eval-sim: decode speed × no-SD",
                                "eval-vllm: decode speed × no-SD"]
    assert table["rows"] == [["deployed-static-k3 (deploy/)", "2.4", "1.2", "1.15"], ["no-sd", "2", "1", "1"],
                             ["static-k3 (best static K, simulator)", "2.4", "1.2", "–"]]
    assert verdict_blocks(RunData(tmp_path, evals=data.evals, tune_summary={})) is None  # no tuning, no verdict
