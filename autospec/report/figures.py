"""The report's plotly figures: one function per figure.

Each function takes already-loaded data (frames, dicts, a FitResult) and returns a `go.Figure`, or None
when the data it needs is absent, so the report shows what a run directory holds and skips the rest.

Plotly renders a subset of HTML in titles, legend entries and hover text, so every user-supplied
string (strategy names, domains, directory names) goes through `esc` before it reaches a figure.
Only SVG traces (go.Scatter, go.Bar): WebGL traces fail in browsers without a GPU.
"""

from __future__ import annotations

import html
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from autospec.latency import linear_features  # the features the fit used (Eq. 3–4)
from autospec.serving.metrics import sent_times

CDF_POINTS = 400  # a CDF is drawn through this many quantiles, whatever the request count
TIMELINE_POINTS = 1500  # steps per strategy on the over-time plots before they are averaged into bins
PALETTE = qualitative.Plotly + qualitative.D3


def esc(text: Any) -> str:
    """Plotly-safe text for a user-supplied string (plotly would render its tags)."""
    return html.escape(str(text), quote=True)


def colors(names: Sequence[str]) -> dict[str, str]:
    """One colour per strategy, stable across the figures of a report."""
    return {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0.01}, height=height, template="plotly_white",
                      margin={"l": 60, "r": 20, "t": 60, "b": 50}, legend={"orientation": "v"})
    return fig


def _cell(metrics: Mapping[str, Any], key: str) -> dict | None:
    v = metrics.get(key)
    return v if isinstance(v, dict) and v.get("mean") is not None else None


# --- evaluation ----------------------------------------------------------------------------------


def speedup_bars(summary: Mapping[str, Any], label: str) -> go.Figure | None:
    """Per strategy relative to the baseline with its confidence interval: per-user decode speed
    (1/mean TPOT) and, on the simulator, capacity at the SLO."""
    strategies = summary.get("strategies") or {}
    base = esc(summary.get("baseline", "no-sd"))
    fig = go.Figure()
    # one colour per measure (the strategies are the x axis)
    for (key, name), color in zip((("tpot_speedup_vs_no_sd", "decode speed (1/TPOT)"),
                                   ("capacity_vs_no_sd", "capacity at SLO")), PALETTE):
        rows = [(n, c) for n, m in strategies.items() if (c := _cell(m, key))]
        if not rows:
            continue
        names = [n for n, _ in rows]
        mean = np.array([c["mean"] for _, c in rows], float)
        low = np.array([c["ci_low"] if c.get("ci_low") is not None else c["mean"] for _, c in rows], float)
        high = np.array([c["ci_high"] if c.get("ci_high") is not None else c["mean"] for _, c in rows], float)
        fig.add_trace(go.Bar(x=[esc(n) for n in names], y=mean, name=name, marker_color=color,
                             error_y={"type": "data", "array": high - mean, "arrayminus": mean - low},
                             text=[f"{m:.2f}×" for m in mean], textposition="outside",
                             hovertemplate=f"%{{x}}: %{{y:.3f}}× ({name})<extra></extra>"))
    if not fig.data:
        return None
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_layout(barmode="group")
    fig.update_yaxes(title=f"× {base}")
    return _layout(fig, f"Decode speed and capacity over {base} (95% CI) — {esc(label)}", 380)


def attainment_vs_load(summary: Mapping[str, Any], label: str) -> go.Figure | None:
    """SLO attainment against the arrival rate per strategy: the capacity search's probes (first repeat)."""
    capacity = summary.get("capacity") or {}
    per_strategy = capacity.get("strategies") or {}
    rate = ((summary.get("workload") or {}).get("mean_rate_per_s")) or None
    if not per_strategy:
        return None
    cmap = colors(list(summary.get("strategies") or per_strategy))
    fig = go.Figure()
    for name, runs in per_strategy.items():
        if not runs:
            continue
        probes = sorted(runs[0]["probes"])
        x = [p[0] * rate if rate else p[0] for p in probes]
        fig.add_trace(go.Scatter(x=x, y=[p[1] for p in probes], mode="lines+markers", name=esc(name),
                                 line={"color": cmap.get(name)},
                                 hovertemplate=f"{esc(name)}: %{{y:.1%}} at %{{x:.3g}}<extra></extra>"))
    target = (capacity.get("spec") or {}).get("target")
    if target is not None:
        fig.add_hline(y=target, line_dash="dot", line_color="grey",
                      annotation_text=f"target {target:.0%}", annotation_position="bottom right")
    fig.update_xaxes(title="arrival rate (req/s)" if rate else "scale of the workload's arrival rate", type="log")
    fig.update_yaxes(title="SLO attainment", tickformat=".0%", range=[0, 1.05])
    return _layout(fig, f"SLO attainment vs load (capacity search, simulator) — {esc(label)}", 420)


def _cdf(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(values[np.isfinite(values)])
    if len(v) > CDF_POINTS:
        q = np.linspace(0, 1, CDF_POINTS)
        return np.quantile(v, q), q
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)


def latency_cdfs(requests: pd.DataFrame | None, label: str) -> go.Figure | None:
    """TTFT and TPOT CDFs per strategy (TPOT = (finish − first token) / (output tokens − 1))."""
    if requests is None or requests.empty:
        return None
    n = requests["output_len"].to_numpy(float)
    first = requests["first_token_s"].to_numpy(float)
    ttft = first - sent_times(requests).to_numpy(float)  # from the send time, as the metrics count it
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(n > 1, (requests["finish_s"].to_numpy(float) - first) / np.maximum(n - 1, 1), np.nan)
    frame = pd.DataFrame({"strategy": requests["strategy"].astype(str).to_numpy(), "ttft": ttft, "tpot": tpot})
    names = list(dict.fromkeys(frame["strategy"]))
    cmap = colors(names)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("TTFT", "TPOT"), horizontal_spacing=0.08)
    for name in names:
        part = frame[frame["strategy"] == name]
        for col, metric in enumerate(("ttft", "tpot"), start=1):
            x, y = _cdf(part[metric].to_numpy(float))
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=esc(name), legendgroup=esc(name),
                                     showlegend=col == 1, line={"color": cmap[name], "shape": "hv"},
                                     hovertemplate=f"{esc(name)}: %{{x:.4g}} s, P=%{{y:.2f}}<extra></extra>"),
                          row=1, col=col)
    fig.update_xaxes(title="seconds")
    fig.update_yaxes(title="fraction of requests", range=[0, 1.02], col=1)
    return _layout(fig, f"Latency CDFs — {esc(label)}")


def pareto(summary: Mapping[str, Any], label: str) -> go.Figure | None:
    """Throughput vs per-user tokens/s (1 / mean TPOT) per strategy, with the Pareto front."""
    pts = []
    for name, m in (summary.get("strategies") or {}).items():
        thr, tpot = _cell(m, "throughput_tok_s"), _cell(m, "tpot_mean")
        if thr and tpot and tpot["mean"] > 0:
            pts.append((name, 1.0 / tpot["mean"], thr["mean"]))
    if not pts:
        return None
    cmap = colors(list(summary["strategies"]))
    fig = go.Figure()
    for name, user, thr in pts:
        fig.add_trace(go.Scatter(x=[user], y=[thr], mode="markers+text", name=esc(name), text=[esc(name)],
                                 textposition="top center", marker={"size": 12, "color": cmap[name]},
                                 hovertemplate=f"{esc(name)}<br>per-user %{{x:.3g}} tok/s<br>"
                                               "throughput %{y:.4g} tok/s<extra></extra>"))
    front, best = [], -np.inf  # maximise both: walk per-user speed downwards, keep rising throughput
    for _, user, thr in sorted(pts, key=lambda p: (-p[1], -p[2])):
        if thr > best:
            front.append((user, thr))
            best = thr
    if len(front) > 1:
        fx, fy = zip(*sorted(front))
        fig.add_trace(go.Scatter(x=fx, y=fy, mode="lines", name="Pareto front", hoverinfo="skip",
                                 line={"color": "grey", "dash": "dash"}))
    fig.update_xaxes(title="per-user tokens/s (1 / mean TPOT)")
    fig.update_yaxes(title="throughput (tokens/s)")
    return _layout(fig, f"Throughput vs per-user speed — {esc(label)}")


def _binned(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    if len(x) <= TIMELINE_POINTS:
        return x, y
    edges = np.linspace(x.min(), x.max(), TIMELINE_POINTS + 1)
    idx = np.clip(np.searchsorted(edges, x, side="right") - 1, 0, TIMELINE_POINTS - 1)
    count = np.bincount(idx, minlength=TIMELINE_POINTS)
    keep = count > 0
    sums = np.bincount(idx, weights=y, minlength=TIMELINE_POINTS)
    return ((edges[:-1] + edges[1:]) / 2)[keep], sums[keep] / count[keep]


def timeline(steps: pd.DataFrame | None, label: str) -> go.Figure | None:
    """Mean speculative length and batch size per step over time (first repeat of each strategy)."""
    if steps is None or steps.empty:
        return None
    names = list(dict.fromkeys(steps["strategy"].astype(str)))
    cmap = colors(names)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("mean speculative length k per step", "batch size"))
    for name in names:
        part = steps[steps["strategy"].astype(str) == name]
        part = part[part["repeat"] == part["repeat"].min()].sort_values("start_s")
        x = part["start_s"].to_numpy(float)
        k = np.array([float(np.mean(v)) if len(v) else 0.0 for v in part["k"]])
        for row, y in ((1, k), (2, part["batch"].to_numpy(float))):
            bx, by = _binned(x, y)
            fig.add_trace(go.Scatter(x=bx, y=by, mode="lines", name=esc(name), legendgroup=esc(name),
                                     showlegend=row == 1, line={"color": cmap[name], "shape": "hv", "width": 1.2},
                                     hovertemplate=f"{esc(name)}: t=%{{x:.3f}} s, %{{y:.2f}}<extra></extra>"),
                          row=row, col=1)
    fig.update_xaxes(title="time (s)", row=2, col=1)
    fig.update_yaxes(title="k", row=1, col=1)
    fig.update_yaxes(title="requests", row=2, col=1)
    return _layout(fig, f"Speculative length and batch size over time — {esc(label)}", 520)


def eval_acceptance(summary: Mapping[str, Any], label: str) -> go.Figure | None:
    """Measured acceptance rate at each draft position per strategy (from the evaluation)."""
    per = {n: v for n, v in (summary.get("per_position_acceptance") or {}).items()
           if v and any(x is not None for x in v)}
    if not per:
        return None
    cmap = colors(list(summary.get("strategies") or per))
    fig = go.Figure()
    for name, values in per.items():
        y = [np.nan if v is None else v for v in values]
        fig.add_trace(go.Scatter(x=list(range(1, len(y) + 1)), y=y, mode="lines+markers", name=esc(name),
                                 line={"color": cmap.get(name)},
                                 hovertemplate=f"{esc(name)}: position %{{x}}, %{{y:.3f}}<extra></extra>"))
    fig.update_xaxes(title="draft position", dtick=1)
    fig.update_yaxes(title="acceptance rate", range=[0, 1.05])
    return _layout(fig, f"Per-position acceptance — {esc(label)}", 380)


def sim_vs_real(pairs: Sequence[tuple[Mapping, Mapping, str]]) -> go.Figure | None:
    """Simulated vs measured mean TPOT, throughput and p99 TPOT per strategy, relative error on the bars.

    `pairs`: (simulated summary, real summary, label) for evaluations of the same workload."""
    metrics = (("tpot_mean", "mean TPOT (s)"), ("throughput_tok_s", "throughput (tok/s)"),
               ("tpot_p99", "p99 TPOT (s)"))
    rows = comparison_rows(pairs)
    if not rows:
        return None
    fig = make_subplots(rows=1, cols=3, subplot_titles=[t for _, t in metrics], horizontal_spacing=0.07)
    for col, (key, _) in enumerate(metrics, start=1):
        sub = [r for r in rows if r["metric"] == key]
        x = [esc(f"{r['strategy']}" + (f" · {r['label']}" if len(pairs) > 1 else "")) for r in sub]
        fig.add_trace(go.Bar(x=x, y=[r["real"] for r in sub], name="real engine", marker_color="#1f77b4",
                             legendgroup="real", showlegend=col == 1), row=1, col=col)
        fig.add_trace(go.Bar(x=x, y=[r["sim"] for r in sub], name="simulator", marker_color="#ff7f0e",
                             legendgroup="sim", showlegend=col == 1,
                             text=[f"{r['rel_err']:+.0%}" for r in sub], textposition="outside"), row=1, col=col)
    fig.update_layout(barmode="group")
    return _layout(fig, "Simulator vs real engine (bar labels: simulator relative error)", 420)


def comparison_rows(pairs: Sequence[tuple[Mapping, Mapping, str]]) -> list[dict]:
    """One row per (pair, strategy, metric): simulated, real and relative error."""
    rows = []
    for sim, real, label in pairs:
        for name, rm in (real.get("strategies") or {}).items():
            sm = (sim.get("strategies") or {}).get(name)
            if sm is None:
                continue
            for key in ("tpot_mean", "throughput_tok_s", "tpot_p99"):
                r, s = _cell(rm, key), _cell(sm, key)
                if r and s and r["mean"]:
                    rows.append({"label": label, "strategy": name, "metric": key, "real": r["mean"],
                                 "sim": s["mean"], "rel_err": (s["mean"] - r["mean"]) / r["mean"]})
    return rows


# --- fit -----------------------------------------------------------------------------------------


def latency_fit(latency: pd.DataFrame | None, fit) -> go.Figure | None:
    """Predicted (AdaSpec linear model; prefill line) vs measured step time for every profiled shape."""
    if latency is None or fit is None or latency.empty:
        return None
    model = fit.latency_model
    phase = latency["phase"] if "phase" in latency else pd.Series("decode", index=latency.index)
    fig = go.Figure()
    lo, hi = np.inf, 0.0
    for name, coeffs, color in (("draft", model.draft, "#ff7f0e"), ("target", model.target, "#1f77b4")):
        dec = latency[(latency["model"] == name) & (phase == "decode")]
        if not dec.empty:
            b, s, c = (dec[k].to_numpy(float) for k in ("batch", "tokens", "context"))
            pred = np.array([coeffs.forward(nc, nb) for nc, nb in zip(*linear_features(b, s, c))])
            meas = dec["median_s"].to_numpy(float)
            held = fit.models.linear_mape.get(name)
            fig.add_trace(go.Scatter(
                x=meas, y=pred, mode="markers", marker={"color": color, "size": 7, "opacity": 0.75},
                name=f"{name} decode (held-out MAPE {held:.1%})" if held is not None else f"{name} decode",
                customdata=np.column_stack([b, s, c]),
                hovertemplate="batch %{customdata[0]}, tokens %{customdata[1]}, context %{customdata[2]}"
                              "<br>measured %{x:.4g} s<br>predicted %{y:.4g} s<extra></extra>"))
            lo, hi = min(lo, meas.min(), pred.min()), max(hi, meas.max(), pred.max())
        pre = latency[(latency["model"] == name) & (phase == "prefill")]
        line = fit.prefill.get(name)
        if not pre.empty and line is not None:
            n_tok = (pre["batch"] * pre["tokens"]).to_numpy(float)
            pred = np.array([line.time(n) for n in n_tok])
            meas = pre["median_s"].to_numpy(float)
            pm = fit.models.prefill_mape.get(name)
            fig.add_trace(go.Scatter(
                x=meas, y=pred, mode="markers", marker={"color": color, "size": 9, "symbol": "diamond-open"},
                name=f"{name} prefill (MAPE {pm:.1%})" if pm is not None else f"{name} prefill",
                hovertemplate="measured %{x:.4g} s<br>predicted %{y:.4g} s<extra></extra>"))
            lo, hi = min(lo, meas.min(), pred.min()), max(hi, meas.max(), pred.max())
    if not fig.data:
        return None
    lo = max(lo, 1e-6)
    fig.add_trace(go.Scatter(x=[lo, hi], y=[lo, hi], mode="lines", name="predicted = measured",
                             line={"color": "grey", "dash": "dot"}, hoverinfo="skip"))
    fig.update_xaxes(title="measured median (s)", type="log")
    fig.update_yaxes(title="predicted (s)", type="log")
    return _layout(fig, "Latency model: predicted vs measured", 460)


def profile_acceptance(fit) -> go.Figure | None:
    """P(match length ≥ j) per domain from the profile's acceptance traces (what the simulator replays)."""
    if fit is None or not fit.per_position_acceptance:
        return None
    fig = go.Figure()
    for domain, probs in fit.per_position_acceptance.items():
        fig.add_trace(go.Scatter(x=list(range(1, len(probs) + 1)), y=probs, mode="lines+markers",
                                 name=esc(domain), line={"dash": "dash" if domain == "all" else "solid"}))
    fig.update_xaxes(title="draft position j", dtick=1)
    fig.update_yaxes(title="P(match length ≥ j)", range=[0, 1.05])
    return _layout(fig, "Profiled acceptance by position and domain", 380)


def calibration(acceptance: pd.DataFrame | None, fit) -> go.Figure | None:
    """Acceptance calibration: the held-out reliability diagram of the raw confidences and of the
    calibrator DSpark applies, and held-out ECE per position (raw, STS, chosen) — all from fit/models.json
    (`calibration`). A fit written before calibrators were chosen: STS's in-sample reliability from the
    traces."""
    if fit is None:
        return None
    if getattr(fit.models, "calibration", None) is not None:
        return _held_out_calibration(fit.models.calibration)
    # lazily: it loads every policy (~0.1 s), which a report of a run without fit/ never needs
    from autospec.policies.sts import survival

    sts = fit.models.sts
    before, after = sts.get("ece_before_by_position") or [], sts.get("ece_after_by_position") or []
    have_traces = acceptance is not None and not acceptance.empty and "confidences" in acceptance
    if not before and not have_traces:
        return None
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("reliability: P(first j drafts accepted)", "ECE per position"))
    if have_traces:
        conf = np.stack([np.asarray(v, float) for v in acceptance["confidences"]])
        match = acceptance["match_len"].to_numpy(float)
        labels = (match[:, None] >= np.arange(1, conf.shape[1] + 1)[None, :]).ravel()
        for name, temps, color in (("raw draft confidence", [], "#d62728"),
                                   ("after STS", sts.get("temperatures") or [], "#2ca02c")):
            p = survival(conf, temps).ravel()
            ok = np.isfinite(p)
            idx = np.minimum((p[ok] * 10).astype(int), 9)
            cnt = np.bincount(idx, minlength=10)
            keep = cnt > 0
            mp = (np.bincount(idx, weights=p[ok], minlength=10)[keep] / cnt[keep])
            emp = (np.bincount(idx, weights=labels[ok], minlength=10)[keep] / cnt[keep])
            fig.add_trace(go.Scatter(x=mp, y=emp, mode="lines+markers", name=name, line={"color": color},
                                     customdata=cnt[keep], legendgroup=name,
                                     hovertemplate="predicted %{x:.2f}<br>observed %{y:.2f}<br>"
                                                   "n=%{customdata}<extra></extra>"), row=1, col=1)
        fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line={"color": "grey", "dash": "dot"},
                                 name="perfect calibration", hoverinfo="skip"), row=1, col=1)
    if before:
        pos = list(range(1, len(before) + 1))
        fig.add_trace(go.Bar(x=pos, y=before, name=f"ECE before ({sts['ece_before']:.3f})", marker_color="#d62728",
                             legendgroup="raw draft confidence"), row=1, col=2)
        fig.add_trace(go.Bar(x=pos, y=after, name=f"ECE after ({sts['ece_after']:.3f})", marker_color="#2ca02c",
                             legendgroup="after STS"), row=1, col=2)
    fig.update_xaxes(title="predicted", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title="observed", range=[0, 1.02], row=1, col=1)
    fig.update_xaxes(title="draft position", dtick=1, row=1, col=2)
    fig.update_layout(barmode="group")
    return _layout(fig, "Acceptance calibration (STS, held-out ECE)", 420)


def _held_out_calibration(cal) -> go.Figure:
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.1,
                        subplot_titles=("held-out reliability: P(first j drafts accepted)",
                                        "held-out ECE per position"))
    colors = {"identity": "#d62728", "sts": "#9467bd", cal.chosen: "#2ca02c"}
    label = {"identity": "raw draft confidence", "sts": "STS", cal.chosen: f"{cal.chosen} (chosen)"}
    for name in ("identity", cal.chosen):
        pts = cal.held_out[name].reliability
        fig.add_trace(go.Scatter(x=[q["predicted"] for q in pts], y=[q["observed"] for q in pts],
                                 mode="lines+markers", name=f"{label[name]} (ECE {cal.held_out[name].ece:.3f})",
                                 line={"color": colors[name]}, legendgroup=name,
                                 customdata=[q["count"] for q in pts],
                                 hovertemplate="predicted %{x:.2f}<br>observed %{y:.2f}<br>"
                                               "n=%{customdata}<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line={"color": "grey", "dash": "dot"},
                             name="perfect calibration", hoverinfo="skip"), row=1, col=1)
    for name in dict.fromkeys(("identity", "sts", cal.chosen)):
        per = cal.held_out[name].ece_by_position
        fig.add_trace(go.Bar(x=list(range(1, len(per) + 1)), y=per, name=f"ECE {label[name]}",
                             marker_color=colors[name], legendgroup=name, showlegend=name == "sts"),
                      row=1, col=2)
    fig.update_xaxes(title="predicted", range=[0, 1], row=1, col=1)
    fig.update_yaxes(title="observed", range=[0, 1.02], row=1, col=1)
    fig.update_xaxes(title="draft position", dtick=1, row=1, col=2)
    fig.update_layout(barmode="group")
    return _layout(fig, f"Acceptance calibration (held out by prompt; DSpark applies {cal.chosen})", 420)


# --- tuning --------------------------------------------------------------------------------------


def _complete(trials: pd.DataFrame) -> pd.DataFrame:
    if "state" in trials:
        trials = trials[trials["state"].astype(str).str.upper().str.endswith("COMPLETE")]
    return trials.sort_values("number") if "number" in trials else trials


def objective_columns(trials: pd.DataFrame) -> list[str]:
    if "value" in trials:
        return ["value"]
    return sorted((c for c in trials.columns if c.startswith("values_")), key=lambda c: int(c.split("_")[1]))


def optuna_history(trials: pd.DataFrame | None, summary: Mapping[str, Any] | None) -> go.Figure | None:
    """Objective value per trial with the running best (one panel per objective)."""
    if trials is None or trials.empty:
        return None
    trials = _complete(trials)
    cols = objective_columns(trials)
    if trials.empty or not cols:
        return None
    summary = summary or {}
    names = summary.get("objectives") or ([summary.get("objective") or "objective"] if cols == ["value"] else cols)
    directions = summary.get("directions") or [summary.get("direction", "maximize")] * len(cols)
    fig = make_subplots(rows=len(cols), cols=1, shared_xaxes=True, vertical_spacing=0.1,
                        subplot_titles=[esc(n) for n in names[: len(cols)]])
    x = trials["number"].to_numpy() if "number" in trials else np.arange(len(trials))
    label = trials["params_strategy"].astype(str).map(esc).to_numpy() if "params_strategy" in trials else None
    for row, (col, direction) in enumerate(zip(cols, directions), start=1):
        y = trials[col].to_numpy(float)
        best = (np.fmin.accumulate if str(direction).startswith("min") else np.fmax.accumulate)(y)
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name="trial", marker={"color": "#1f77b4", "size": 6},
                                 showlegend=row == 1, legendgroup="trial", text=label,
                                 hovertemplate="trial %{x}: %{y:.4g}<br>%{text}<extra></extra>"
                                 if label is not None else "trial %{x}: %{y:.4g}<extra></extra>"),
                      row=row, col=1)
        fig.add_trace(go.Scatter(x=x, y=best, mode="lines", name="best so far", line={"color": "#d62728",
                                 "shape": "hv"}, showlegend=row == 1, legendgroup="best"), row=row, col=1)
    fig.update_xaxes(title="trial", row=len(cols), col=1)
    return _layout(fig, "Optuna optimisation history", 320 + 160 * (len(cols) - 1))


def param_importances(summary: Mapping[str, Any] | None) -> go.Figure | None:
    """Optuna's parameter importances (fANOVA by default) as a horizontal bar chart."""
    imp = (summary or {}).get("param_importances") or {}
    if isinstance(imp, Mapping) and imp and all(isinstance(v, Mapping) for v in imp.values()):
        imp = next(iter(imp.values()))  # per-objective importances: show the first objective's
    items = sorted(((str(k), float(v)) for k, v in imp.items() if v is not None), key=lambda kv: kv[1])
    if not items:
        return None
    fig = go.Figure(go.Bar(x=[v for _, v in items], y=[esc(k) for k, _ in items], orientation="h",
                           marker_color="#2ca02c", hovertemplate="%{y}: %{x:.3f}<extra></extra>"))
    fig.update_xaxes(title="importance")
    return _layout(fig, "Parameter importances", max(260, 60 + 32 * len(items)))


def tune_pareto(trials: pd.DataFrame | None, front: pd.DataFrame | None) -> go.Figure | None:
    """Multi-objective tuning: every trial and the Pareto front (throughput vs p99 TPOT)."""
    if front is None or front.empty or not {"throughput_tok_s", "tpot_p99"} <= set(front.columns):
        return None
    fig = go.Figure()
    if trials is not None and not trials.empty:
        t = _complete(trials)
        cols = objective_columns(t)
        if len(cols) >= 2:
            fig.add_trace(go.Scatter(x=t[cols[1]], y=t[cols[0]], mode="markers", name="trials",
                                     marker={"color": "lightgrey", "size": 6}))
    f = front.sort_values("tpot_p99")
    text = f["strategy"].astype(str).map(esc) if "strategy" in f else None
    fig.add_trace(go.Scatter(x=f["tpot_p99"], y=f["throughput_tok_s"], mode="lines+markers", name="Pareto front",
                             text=text, marker={"color": "#d62728", "size": 9}, line={"shape": "hv"},
                             hovertemplate="p99 TPOT %{x:.4g} s<br>throughput %{y:.4g} tok/s<br>%{text}"
                                           "<extra></extra>"))
    fig.update_xaxes(title="p99 TPOT (s)")
    fig.update_yaxes(title="throughput (tokens/s)")
    return _layout(fig, "Tuning Pareto front", 420)
