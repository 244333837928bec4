"""`autospec report`: one self-contained HTML file and a `summary.md` from whatever a run directory holds.

`load_run` collects the artifacts that exist (profile, fit, evaluations — `eval/`, `eval*/` and
`*/eval/` one level down —, tuning, manifests); `write_report` turns them into sections of tables and
figures (report/figures.py), renders template.html.j2 with plotly.js inlined once (the file opens
offline), and writes both files atomically. A present artifact that cannot be read is an InputError,
like in every other stage; an absent one just leaves its section out.
"""

from __future__ import annotations

import html
import json
import math
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Mapping

import jinja2
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from markupsafe import Markup
from plotly.offline import get_plotlyjs

from autospec import __version__
from autospec.artifacts import PARQUET_SCHEMA_KEY, read_json, read_parquet, write_text
from autospec.calibration import read_acceptance_table, read_latency_table
from autospec.errors import InputError
from autospec.report import figures as F
from autospec.serving.shift import regret
from autospec.summaries import read_eval_summary, read_tune_summary

# Columns of the strategy table: summary.json metric key, header.
TABLE_METRICS = (("capacity_rps", "capacity at SLO (req/s)"), ("capacity_vs_no_sd", "capacity × no-SD"),
                 ("tpot_speedup_vs_no_sd", "decode speed (1/TPOT) × no-SD"),
                 ("tpot_p99_speedup_vs_no_sd", "p99 decode speed × no-SD"), ("e2e_speedup_vs_no_sd", "E2E × no-SD"),
                 ("slo_attainment", "SLO attainment"), ("goodput", "goodput (req/s)"),
                 ("tpot_mean", "TPOT mean (s)"), ("tpot_p99", "TPOT p99 (s)"), ("ttft_p50", "TTFT p50 (s)"),
                 ("ttft_p99", "TTFT p99 (s)"), ("acceptance_rate", "acceptance rate"),
                 ("throughput_tok_s", "open-loop throughput (tok/s)"),
                 ("throughput_vs_no_sd", "open-loop throughput × no-SD (set by the arrival rate)"))
CAPACITY_TEXT = ("Capacity at the SLO: the highest arrival rate — the workload's own arrival process sped up "
                 "or slowed down — at which SLO attainment stays at or above the target, found by bisection on "
                 "the simulator (the bracket and every probe are in eval/summary.json). Decode speed is 1/TPOT "
                 "per request, relative to no-SD at the same load. Open-loop throughput is set by the arrival "
                 "rate: it stays near no-SD's whenever the engine keeps up, whatever SD does.")
SIM_METRICS = {"tpot_mean": "mean TPOT (s)", "throughput_tok_s": "throughput (tok/s)", "tpot_p99": "p99 TPOT (s)"}


@dataclass
class Evaluation:
    """One `autospec evaluate` output folder."""

    label: str  # the folder that names it in the run directory: "eval", "eval-sim", "torch", ...
    path: Path
    summary: dict
    requests: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None

    @property
    def engine(self) -> str:
        return str((self.summary.get("engine") or {}).get("kind", "?"))

    @property
    def title(self) -> str:
        return f"{self.label} ({self.engine} engine)"

    @property
    def workload_key(self) -> str:
        w = self.summary.get("workload") or {}
        return str(w.get("path") or w.get("name") or "")


@dataclass
class RunData:
    run_dir: Path
    manifests: list[tuple[str, dict]] = field(default_factory=list)
    latency: pd.DataFrame | None = None
    acceptance: pd.DataFrame | None = None
    fit: Any = None  # autospec.fit.FitResult
    evals: list[Evaluation] = field(default_factory=list)
    tune_summary: dict | None = None
    tune_trials: pd.DataFrame | None = None
    tune_pareto: pd.DataFrame | None = None

    @property
    def empty(self) -> bool:
        return (self.latency is None and self.acceptance is None and self.fit is None and not self.evals
                and self.tune_summary is None and self.tune_trials is None)


# --- loading -------------------------------------------------------------------------------------


# the columns the report's figures read from an evaluation's records (serving/records.py writes more)
REQUEST_COLUMNS = ("strategy", "output_len", "first_token_s", "finish_s")
STEP_COLUMNS = ("strategy", "repeat", "start_s", "k", "batch")


def _parquet(path: Path, required: tuple[str, ...] = ()) -> pd.DataFrame | None:
    """A parquet artifact or None when absent. autospec's own carry a schema_version (checked, with the
    `required` columns); a frame written by another tool (Optuna's trials_dataframe via pandas) has none
    and is read as is."""
    if not path.is_file():
        return None
    try:
        meta = pq.read_schema(path).metadata or {}
    except (pa.ArrowException, OSError):
        meta = {}
    if PARQUET_SCHEMA_KEY in meta or not meta:
        return read_parquet(path, required)  # validates (and names the file on a bad one)
    return pd.read_parquet(path)


def _json(path: Path) -> dict | None:
    return read_json(path) if path.is_file() else None


def find_evaluations(run_dir: Path) -> list[Path]:
    """eval/ and eval*/ folders of the run directory, then */eval/ one level down."""
    found = [p.parent for p in sorted(run_dir.glob("eval*/summary.json"))]
    found += [p.parent for p in sorted(run_dir.glob("*/eval/summary.json")) if p.parent not in found]
    return found


def load_run(run_dir: str | Path) -> RunData:
    # lazily: the fit stage (the simulator, every policy) costs `autospec report` ~0.1-0.2 s, paid only
    # for a run directory with a fit/ (docs/architecture.md, "Imports")
    from autospec.fit import load_fit

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise InputError("not a run directory (no such directory)", path=run_dir)
    data = RunData(run_dir)
    for path in [run_dir / "manifest.json", *sorted(run_dir.glob("*/manifest.json"))]:
        if path.is_file():
            data.manifests.append((str(path.relative_to(run_dir)), _json(path)))
    prof = run_dir / "profile"
    if (prof / "latency.parquet").is_file():
        data.latency = read_latency_table(run_dir)
    if (prof / "acceptance.parquet").is_file():
        data.acceptance = read_acceptance_table(run_dir)
    if (run_dir / "fit" / "models.json").is_file():
        data.fit = load_fit(run_dir)
    for folder in find_evaluations(run_dir):
        rel = folder.relative_to(run_dir)
        label = str(rel) if rel.name.startswith("eval") and len(rel.parts) == 1 else str(rel.parent)
        data.evals.append(Evaluation(label, folder, read_eval_summary(folder / "summary.json"),
                                     _parquet(folder / "requests.parquet", REQUEST_COLUMNS),
                                     _parquet(folder / "steps.parquet", STEP_COLUMNS)))
    tune = run_dir / "tune"
    data.tune_summary = read_tune_summary(tune / "summary.json") if (tune / "summary.json").exists() else None
    data.tune_trials = _parquet(tune / "trials.parquet")
    data.tune_pareto = _parquet(tune / "pareto.parquet")
    return data


def sim_real_pairs(evals: list[Evaluation]) -> list[tuple[dict, dict, str]]:
    """(simulated summary, real summary, label) for every sim/real pair that replayed the same workload."""
    pairs = []
    for sim in (e for e in evals if e.engine == "sim"):
        for real in (e for e in evals if e.engine != "sim"):
            if sim.workload_key and sim.workload_key == real.workload_key:
                pairs.append((sim.summary, real.summary, f"{sim.label} vs {real.label}"))
    return pairs


# --- tables --------------------------------------------------------------------------------------


def _num(v: Any) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:.4g}" if isinstance(v, (int, float)) else str(v)


def _ci(cell: Any) -> str:
    if not isinstance(cell, Mapping) or cell.get("mean") is None:
        return "–"
    lo, hi = cell.get("ci_low"), cell.get("ci_high")
    if lo is None or hi is None or lo == hi:
        return _num(cell["mean"])
    return f"{_num(cell['mean'])} [{_num(lo)}, {_num(hi)}]"


CLOSED_LOOP_HEADERS = {"throughput_tok_s": "throughput at {n} in flight (tok/s)",
                       "throughput_vs_no_sd": "throughput × no-SD (closed loop, {n} in flight)"}


def _warnings(summary: Mapping) -> list[str]:
    """evaluate's warning lines: simulated shapes the profile never measured (serving.coverage), a fit that
    misses its own profile (fit.loose_clocks), a real engine's host running off its profiled speed
    (autospec.profile.HostSpeedCheck) or busy with other processes (autospec.telemetry.HostLoadMeter)."""
    lines = [(summary.get("outside_profile") or {}).get("warning"), (summary.get("fit_health") or {}).get("warning"),
             (summary.get("host_speed") or {}).get("note"), (summary.get("host_load") or {}).get("note")]
    return [line for line in lines if line]


def disturbed_note(pairs: list[tuple[dict, dict, str]]) -> str | None:
    """A line for the simulator-vs-real table when a real side ran on a disturbed host: its error then
    measures the host, not the simulator."""
    off = [label for _sim, real, label in pairs
           if real.get("disturbed") or any((real.get("host_speed") or {}).get(k) for k in ("disturbed", "off_profile"))]
    if not off:
        return None
    return ("Not a judgement of the simulator: the real engine's host ran off its profiled speed during "
            f"{', '.join(off)} (see that evaluation's warning); re-run the real replay on a quiet host.")


def strategy_table(summary: Mapping) -> dict:
    rows = [[name, *(_ci(m.get(k)) for k, _ in TABLE_METRICS)] for name, m in (summary.get("strategies") or {}).items()]
    load = summary.get("load") or {}
    # a closed loop's throughput is what the engine sustains at N in flight, not the arrival rate's echo
    headers = [CLOSED_LOOP_HEADERS[k].format(n=load.get("max_concurrency")) if load.get("closed_loop")
               and k in CLOSED_LOOP_HEADERS else h for k, h in TABLE_METRICS]
    return {"columns": ["strategy", *headers], "rows": rows}


def fit_table(fit) -> dict:
    m = fit.models
    rows = []
    for name in ("draft", "target"):
        c = getattr(m.linear, name)
        rows.append([name, _pct(m.linear_mape.get(name)), _pct(m.piecewise_mape.get(name)),
                     _pct(m.prefill_mape.get(name)),
                     " / ".join(_num(v) for v in (c.alpha, c.gamma, c.delta)), _num(m.points.get(name))])
    return {"columns": ["model", "linear MAPE (held out)", "piecewise MAPE (held out)", "prefill MAPE",
                        "α / γ / δ (s)", "profiled shapes"], "rows": rows}


def calibration_text(fit) -> str:
    """One paragraph: the calibrator DSpark applies, held-out ECE before → after with its CI, Brier skill."""
    sts = fit.models.sts
    cal = fit.models.calibration
    head = f"STS calibration of draft confidences, held-out ECE {sts['ece_before']:.3f} → {sts['ece_after']:.3f}."
    if cal is None:
        return head + " (This fit predates the calibrator choice: DSpark applies the STS temperatures.)"
    b, a = cal.before, cal.after
    return (f"Calibrator DSpark applies: {cal.chosen} — the lowest held-out ECE of {', '.join(cal.candidates)}. "
            f"Held out by prompt ({cal.folds}-fold cross-validation over {cal.prompts} prompts, {cal.chains} "
            f"chains, {cal.samples} draft positions; no prompt on both sides): ECE {b.ece:.3f} on raw confidences "
            f"→ {a.ece:.3f} [95% CI {a.ece_ci[0]:.3f}, {a.ece_ci[1]:.3f}, prompts resampled]; Brier skill score "
            f"against the per-position base rate {a.brier_skill:.3f} [{a.brier_skill_ci[0]:.3f}, "
            f"{a.brier_skill_ci[1]:.3f}] (0 = no better than the base rate). {head}")


def calibration_table(fit) -> dict | None:
    """Held-out scores of every predictor the fit compared (None for a fit without them)."""
    cal = fit.models.calibration
    if cal is None:
        return None
    names = {"identity": "raw confidences (before)", "base_rate": "per-position base rate (reference)"}
    rows = []
    for name, s in cal.held_out.items():
        label = names.get(name, name) + (" — chosen" if name == cal.chosen else "")
        rows.append([label, f"{s.ece:.3f} [{s.ece_ci[0]:.3f}, {s.ece_ci[1]:.3f}]", f"{s.brier:.4f}",
                     f"{s.brier_skill:.3f} [{s.brier_skill_ci[0]:.3f}, {s.brier_skill_ci[1]:.3f}]"])
    return {"columns": ["predictor of P(first j drafts accepted)", "held-out ECE [95% CI]", "Brier",
                        "Brier skill vs base rate [95% CI]"], "rows": rows}


def _pct(v: Any) -> str:
    return "–" if v is None else f"{v:.1%}"


def comparison_table(pairs) -> dict:
    rows = [[r["label"], r["strategy"], SIM_METRICS[r["metric"]], _num(r["real"]), _num(r["sim"]),
             f"{r['rel_err']:+.1%}"] for r in F.comparison_rows(pairs)]
    return {"columns": ["evaluations", "strategy", "metric", "real", "simulated", "relative error"], "rows": rows}


def best_table(summary: Mapping) -> dict | None:
    best = summary.get("best")
    if not isinstance(best, Mapping):
        return None
    objectives = summary.get("objectives") or ["objective"]
    label = {"capacity_rps": "capacity at the SLO (req/s)", "goodput": "goodput (req/s)"}.get(objectives[0],
                                                                                            objectives[0])
    # the trial's own name (tuned-static-k2) beside the Optuna candidate searched (static-k4, its params below)
    rows = [["strategy", _num(best.get("name", best.get("strategy")))],
            ["searched candidate", _num(best.get("strategy"))],
            [label if len(objectives) == 1 else "objective values", _num(best.get("value"))]]
    rows += [[f"param: {k}", _num(v)] for k, v in (best.get("params") or {}).items()]
    deployable = summary.get("best_deployable")
    if isinstance(deployable, Mapping) and deployable.get("number") != best.get("number"):
        rows += [["best deployable on vLLM (deploy/)", _num(deployable.get("name"))],
                 ["its objective value", _num(deployable.get("value"))]]
        rows += [[f"its param: {k}", _num(v)] for k, v in (deployable.get("params") or {}).items()]
    elif summary.get("scope"):
        rows.append(["deployable on vLLM (deploy/)", "yes" if deployable else "no trial is"])
    return {"columns": ["item", "value"], "rows": rows}


def confirmation_table(summary: Mapping) -> dict | None:
    """tune's real-engine confirmation (autospec.confirm): per candidate real vs simulated attainment."""
    confirmed = summary.get("confirmed")
    if not isinstance(confirmed, Mapping) or not confirmed.get("candidates"):
        return None
    rows = [[row["strategy"] + (" (recommended)" if row["strategy"] == confirmed.get("recommended") else ""),
             row["why"], _ci(row["real_attainment"]), _num(row["sim_attainment"]),
             "yes" if row.get("tied_with_best") else ""] for row in confirmed["candidates"]]
    return {"columns": ["candidate", "why", "real SLO attainment [95% CI]", "simulator", "tied with the best"],
            "rows": rows}


def confirmation_text(summary: Mapping) -> str | None:
    confirmed = summary.get("confirmed")
    if not isinstance(confirmed, Mapping):
        return None
    if not confirmed.get("candidates"):
        return f"Real-engine confirmation: {confirmed.get('status')}."
    scales = ", ".join(f"{s:.3g}" for s in confirmed["scales"])
    engine = "vLLM" if confirmed.get("engine") == "vllm" else "the torch engine"
    return (f"Confirmed on {engine} on the workload's first {confirmed['window_requests']} requests at "
            f"{scales}× their arrival rate (around the simulator's capacity at the SLO), {confirmed['repeats']} "
            f"repeat(s) each; candidates whose CIs overlap the best's tie, and a tie goes to the simpler "
            f"configuration. Recommended (in deploy/): {confirmed['reason']}.")


SHIFT_TITLE = "If the load or the prompt mix shifts by ±30%"


def recommendation(summary: Mapping, tune: Mapping | None) -> tuple[str, str] | None:
    """(name, why) of the strategy the run recommends, among those `summary`'s shift table measured: deploy/'s
    pick (tune's `deployed`: the real engine's confirmed one, else the best deployable), else tune's best
    deployable, else the evaluation's highest capacity at the SLO (oracles aside). None when none is there."""
    shift = summary.get("shift") or {}
    measured = set((shift.get("mix") or [{}])[0].get("strategies") or {})
    tune = tune or {}
    confirmed = (tune.get("confirmed") or {}).get("recommended")
    deployed = (tune.get("deployed") or {}).get("name")
    if deployed in measured:
        return deployed, ("deploy/'s pick, confirmed on the real engine" if confirmed else "deploy/'s pick")
    deployable = (tune.get("best_deployable") or {}).get("name")
    if deployable in measured:
        return deployable, "the tuning's best deployable strategy"
    oracles = set(shift.get("oracles") or [])
    caps = {n: ((summary.get("strategies") or {}).get(n) or {}).get("capacity_rps") or {} for n in measured - oracles}
    caps = {n: c["mean"] for n, c in caps.items() if c.get("mean") is not None}
    if not caps:
        return None
    best = max(sorted(caps), key=lambda n: caps[n])
    return best, "the highest capacity at the SLO in this evaluation; no tuned recommendation was evaluated"


def shift_blocks(summary: Mapping, tune: Mapping | None) -> list[dict] | None:
    """The recommendation at each ±30% shift beside the best strategy there, and its regret (text + two
    tables); None when the evaluation has no shift table or no recommendation among its strategies."""
    shift = summary.get("shift")
    rec = recommendation(summary, tune) if shift else None
    if rec is None:
        return None
    name, why = rec
    rows = regret(shift, name)
    rate = (summary.get("workload") or {}).get("mean_rate_per_s")
    factors = "/".join(f"{f:g}" for f in shift["factors"])
    text = (f"Recommendation: {name} ({why}). Every strategy is re-measured on the simulator (engine seed "
            f"{shift['seed']}, the first repeat) with the workload's arrival rate × {factors}, and with every "
            f"prompt and output length × {factors} (arrivals unchanged; the prompt mix is the length "
            f"distribution). Regret against the best strategy at each point: attainment points lost under a "
            f"load shift, the fraction of the best capacity at the SLO (attainment ≥ {shift['target']:.0%}) "
            f"lost under a prompt-mix shift; 0 when the recommendation is as good as any."
            + (f" Oracles ({', '.join(shift['oracles'])}) are a bound, not a choice, and are never the best."
               if shift.get("oracles") else ""))
    load = [[f"{r['factor']:g}×" + (f" ({r['factor'] * rate:.3g} req/s)" if rate else ""), _pct(r["value"]),
             _num(None if r["tpot_mean"] is None else r["tpot_mean"] * 1e3), _num(r["goodput"]), _num(r["best"]),
             _pct(r["best_value"]), "–" if r["regret"] is None else f"{r['regret']:.1f}"]
            for r in rows if r["shift"] == "load"]
    mix = [[f"{r['factor']:g}×", _num(r["value"]), _num(r["best"]), _num(r["best_value"]), _pct(r["regret"])]
           for r in rows if r["shift"] == "mix"]
    return [{"kind": "text", "text": text},
            {"kind": "table", "columns": ["load (× the workload's rate)", f"{name}: SLO attainment",
                                          "its mean TPOT (ms)", "its goodput (req/s)", "best strategy there",
                                          "its SLO attainment", "regret (points)"], "rows": load},
            {"kind": "table", "columns": ["prompt and output lengths ×", f"{name}: capacity (req/s)",
                                          "best strategy there", "its capacity (req/s)", "regret (capacity lost)"],
             "rows": mix}]


VERDICT_TITLE = "Verdict: what to deploy"
VERDICT_METRICS = (("capacity_rps", "capacity at SLO (req/s)"), ("tpot_speedup_vs_no_sd", "decode speed × no-SD"),
                   ("slo_attainment", "SLO attainment at its load"))


def verdict_blocks(data: RunData) -> list[dict] | None:
    """The answer first: deploy/'s pick, whether vLLM can run it, what the real engine's confirmation found
    (its reason names SD's gain over no-SD and a disturbed host), and the pick beside no-SD and the best
    static K the simulator evaluated, in every evaluation's headline metrics. None without a tuning."""
    ts = data.tune_summary or {}
    name = (ts.get("deploy") or {}).get("strategy")
    if not name:
        return None
    runs = "vLLM can run it" if ts["deploy"].get("vllm_supported") else "vLLM cannot express it (deploy/README.md)"
    confirmed = ts.get("confirmed")
    if not isinstance(confirmed, Mapping):
        check = "Not confirmed on a real engine (tune ran without --confirm-top): the simulator's pick."
    elif confirmed.get("candidates"):
        engine = "vLLM" if confirmed.get("engine") == "vllm" else "the torch engine"
        check = f"Confirmed on {engine}: {confirmed['reason']}."
    else:
        check = f"Real-engine confirmation: {confirmed.get('status')}."
    names = [name, "no-sd"]
    for ev in data.evals:  # the best static K by capacity at the SLO, where an evaluation searched it
        static = {n: (m.get("capacity_rps") or {}).get("mean") for n, m in (ev.summary.get("strategies") or {}).items()
                  if n.startswith("static-k")}
        static = {n: c for n, c in static.items() if c is not None}
        if static:
            names.append(max(sorted(static), key=lambda n: static[n]))
            break
    columns, getters = ["strategy"], []
    for ev in data.evals:
        strategies = ev.summary.get("strategies") or {}
        for key, header in VERDICT_METRICS:
            if any((m.get(key) or {}).get("mean") is not None for m in strategies.values()):
                columns.append(f"{ev.label}: {header}")
                getters.append((strategies, key))
    roles: dict[str, list[str]] = {name: ["deploy/"]}
    if len(names) > 2:
        roles.setdefault(names[-1], []).append("best static K, simulator")
    rows = [[n + (f" ({'; '.join(roles[n])})" if n in roles else ""),
             *(_ci((strategies.get(n) or {}).get(key)) for strategies, key in getters)] for n in dict.fromkeys(names)]
    short = f" Warning — {ts['none_feasible']}." if ts.get("none_feasible") else ""
    return [{"kind": "text", "text": f"Recommended: {name}, in deploy/ — {runs}. {check}{short}"},
            *([{"kind": "table", "columns": columns, "rows": rows}] if getters else [])]


# --- assembly ------------------------------------------------------------------------------------


def _figure_html(fig, index: int) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"figure-{index}",
                       config={"displaylogo": False, "responsive": True})


def build_sections(data: RunData) -> list[dict]:
    """Sections of blocks: {"kind": "figure"|"table"|"text", ...}; figures still as go.Figure."""
    sections: list[dict] = []

    def add(title: str, blocks: list) -> None:
        blocks = [b for b in blocks if b is not None and (b["kind"] != "figure" or b["figure"] is not None)]
        if blocks:
            sections.append({"id": f"s{len(sections)}", "title": title, "blocks": blocks})

    fig = lambda f: {"kind": "figure", "figure": f}  # noqa: E731
    add(VERDICT_TITLE, verdict_blocks(data) or [])
    for ev in data.evals:
        s = ev.summary
        w, slo = s.get("workload") or {}, s.get("slo") or {}
        text = (f"Workload {w.get('name') or w.get('path') or '?'}: {_num(w.get('requests'))} requests; "
                f"{_num(s.get('repeats'))} repeat(s), mean [95% bootstrap CI]; baseline {s.get('baseline', 'no-sd')}; "
                f"SLO TTFT ≤ {_num(slo.get('ttft_s'))} s, TPOT ≤ {_num(slo.get('tpot_s'))} s.")
        found = [{"kind": "text", "text": f"Finding — {name}: {line}"}
                 for name, lines in (s.get("findings") or {}).items() for line in lines]
        add(f"Strategies — {ev.title}", [
            {"kind": "text", "text": text}, {"kind": "table", **strategy_table(s)}, *found,
            {"kind": "text", "text": CAPACITY_TEXT} if s.get("capacity") else None,
            *({"kind": "text", "text": f"Warning — {line}"} for line in _warnings(s)),
            fig(F.speedup_bars(s, ev.title)), fig(F.attainment_vs_load(s, ev.title)),
            fig(F.latency_cdfs(ev.requests, ev.title)),
            fig(F.pareto(s, ev.title)), fig(F.timeline(ev.steps, ev.title)), fig(F.eval_acceptance(s, ev.title))])
        add(f"{SHIFT_TITLE} — {ev.title}", shift_blocks(s, data.tune_summary) or [])
    pairs = sim_real_pairs(data.evals)
    if pairs:
        note = disturbed_note(pairs)
        add("Simulator vs real engine", [{"kind": "text", "text": f"Warning — {note}"} if note else None,
                                         {"kind": "table", **comparison_table(pairs)}, fig(F.sim_vs_real(pairs))])
    if data.fit is not None:
        add("Latency model fit", [{"kind": "table", **fit_table(data.fit)}, fig(F.latency_fit(data.latency, data.fit))])
        cal_table = calibration_table(data.fit)
        add("Acceptance calibration", [
            {"kind": "text", "text": calibration_text(data.fit)},
            {"kind": "table", **cal_table} if cal_table else None,
            fig(F.calibration(data.acceptance, data.fit)), fig(F.profile_acceptance(data.fit))])
    ts = data.tune_summary or {}
    best = best_table(ts)
    add("Tuning", [
        {"kind": "text", "text": f"Objective: {ts['objective']}."} if ts.get("objective") else None,
        {"kind": "table", **best} if best else None,
        {"kind": "text", "text": confirmation_text(ts)} if confirmation_text(ts) else None,
        {"kind": "table", **confirmation_table(ts)} if confirmation_table(ts) else None,
        fig(F.optuna_history(data.tune_trials, ts)), fig(F.param_importances(ts)),
        fig(F.tune_pareto(data.tune_trials, data.tune_pareto))])
    if data.manifests:
        add("Manifest", [{"kind": "pre", "label": label, "text": json.dumps(m, indent=2, default=str)}
                         for label, m in data.manifests])
    return sections


def render_html(data: RunData, sections: list[dict]) -> str:
    n = 0
    for sec in sections:
        for block in sec["blocks"]:
            if block["kind"] == "figure":
                block["html"] = Markup(_figure_html(block.pop("figure"), n))
                n += 1
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True,
                             lstrip_blocks=True)
    template = env.from_string(resources.files("autospec.report").joinpath("template.html.j2").read_text("utf-8"))
    return template.render(title=f"autospec report — {data.run_dir.resolve().name}", run_dir=str(data.run_dir),
                           version=__version__, sections=sections, n_figures=n,
                           plotly_js=Markup(get_plotlyjs().replace("</script", "<\\/script")))


def _md(text: Any) -> str:
    """A table cell for markdown: tags escaped (GitHub renders HTML), pipes escaped."""
    return html.escape(str(text), quote=False).replace("|", "\\|").replace("\n", " ")


def _md_table(table: dict) -> list[str]:
    lines = ["| " + " | ".join(_md(c) for c in table["columns"]) + " |",
             "|" + "|".join("---" for _ in table["columns"]) + "|"]
    lines += ["| " + " | ".join(_md(c) for c in row) + " |" for row in table["rows"]]
    return lines + [""]


def render_summary(data: RunData) -> str:
    lines = [f"# autospec report — {_md(data.run_dir.resolve().name)}", ""]
    for block in verdict_blocks(data) or []:
        lines += [f"## {VERDICT_TITLE}", "", _md(block["text"]), ""] if block["kind"] == "text" else _md_table(block)
    for ev in data.evals:
        s = ev.summary
        w = s.get("workload") or {}
        lines += [f"## Strategies — {_md(ev.title)}", "",
                  f"Workload {_md(w.get('name') or w.get('path') or '?')}, {_num(s.get('repeats'))} repeat(s); "
                  f"mean [95% CI]; ratios are over {_md(s.get('baseline', 'no-sd'))}.", ""]
        lines += _md_table(strategy_table(s))
        if s.get("capacity"):
            lines += [_md(CAPACITY_TEXT), ""]
        for line in _warnings(s):
            lines += [f"**Warning —** {_md(line)}", ""]
        lines += [f"**Finding — {_md(name)}:** {_md(line)}\n" for name, lines_ in (s.get("findings") or {}).items()
                  for line in lines_]
        for block in shift_blocks(s, data.tune_summary) or []:
            if block["kind"] == "text":
                lines += [f"### {_md(SHIFT_TITLE)}", "", _md(block["text"]), ""]
            else:
                lines += _md_table(block)
    pairs = sim_real_pairs(data.evals)
    if pairs:
        lines += ["## Simulator vs real engine", ""]
        if note := disturbed_note(pairs):
            lines += [f"**Warning —** {_md(note)}", ""]
        lines += _md_table(comparison_table(pairs))
    if data.fit is not None:
        sts = data.fit.models.sts
        lines += ["## Latency model fit", ""] + _md_table(fit_table(data.fit))
        lines += [f"STS acceptance calibration: held-out ECE {sts['ece_before']:.3f} → {sts['ece_after']:.3f}.", ""]
        cal_table = calibration_table(data.fit)
        if cal_table:
            lines += ["## Acceptance calibration", "", _md(calibration_text(data.fit)), ""] + _md_table(cal_table)
    best = best_table(data.tune_summary or {})
    if best:
        lines += ["## Best tuned configuration", ""]
        if (data.tune_summary or {}).get("objective"):
            lines += [f"Objective: {_md(data.tune_summary['objective'])}.", ""]
        lines += _md_table(best)
        text, table = confirmation_text(data.tune_summary or {}), confirmation_table(data.tune_summary or {})
        if text:
            lines += [_md(text), ""]
        if table:
            lines += _md_table(table)
    lines += ["The full report with figures: report.html (opens offline).", ""]
    return "\n".join(lines)


def write_report(run_dir: str | Path, out_file: str | Path | None = None) -> Path:
    """Write report.html (or `out_file`) and summary.md beside it; returns the HTML path.

    Everything is loaded and rendered before anything is written: bad input leaves no file behind."""
    data = load_run(run_dir)
    if data.empty:
        raise InputError("nothing to report: no profile/, fit/, eval/ or tune/ artifacts found", path=run_dir)
    out = Path(out_file) if out_file is not None else Path(run_dir) / "report.html"
    if out.is_dir():
        raise InputError("is a directory; pass a file name for the report", path=out)
    page = render_html(data, build_sections(data))
    summary = render_summary(data)
    write_text(out, page)
    write_text(out.parent / "summary.md", summary)
    return out
