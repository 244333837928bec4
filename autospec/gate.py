"""`autospec gate`: compare a candidate run with a baseline and fail on a real regression.

Inputs (baseline and candidate must be the same kind):

* an evaluate summary — `eval/summary.json` from `autospec evaluate`, or a run directory holding one.
  Entries are its strategies; each metric is `{mean, ci_low, ci_high}` (a 95% bootstrap CI across
  repeats, `autospec.serving.metrics`). Default metric: capacity at the SLO (`capacity_rps`, what a
  simulated evaluation reports: `autospec.serving.capacity`); goodput when either file has no capacity
  (a real engine's evaluation, or one run with --no-capacity), and the verdict says so.
* a benchmark result — a JSON object with a `benchmark` name, as the scripts in `benchmarks/` write
  (`benchmarks/results/*.json`). Entries are the elements of `rows`, each named by its identity fields
  (its string/int/bool fields that are not metrics: `batch=1 k=4`, `strategy=adaspec batch=64`); a
  benchmark without `rows` is one entry named after the benchmark. Metrics are the row's numeric fields
  that `METRICS` lists (or `err_*`: lower is better; `torch_*`/`vllm_*`/`sim_*`: as the rest of the name); they
  have no CI, so only the noise floor applies. Default metrics: every listed metric both files carry.
  `schema_version` is checked when the file has one (older benchmark scripts wrote none).

Which way is better lives in one table, `METRICS`; a metric it does not list is refused (exit 2).

The noise rule. A metric regresses only when both hold:
 1. its mean is worse than the baseline's by more than `max_regression` (relative to the baseline), and
 2. the change is outside the noise: the candidate's interval lies wholly on the worse side of the
    baseline's interval (they do not overlap). Each interval is the metric's 95% CI, widened where
    needed to at least ±noise/2 of its mean — the noise floor, default 3% [chosen]. The floor is what
    applies when there is no spread to go on: one repeat, a benchmark number, or a deterministic
    simulator whose repeats agree exactly (the sim at T=0); it also absorbs last-digit differences
    between machines. Non-overlapping 95% CIs is a deliberately conservative test (stricter than a
    two-sample test at 5%): a gate that cries wolf gets switched off.
A change worse than the threshold but inside the noise is reported as `within noise` and passes.

Acceptance collapse (evaluate summaries, every SD strategy: one whose baseline accepted_per_step is
positive) is checked whatever `--metric` says, because a draft that stops being accepted can hide
behind an unchanged goodput at low load. τ = committed_per_step is the tokens a request gains per SD
step including the bonus token (`autospec.serving.metrics`); it falls toward 1 as acceptance collapses,
and accepted_per_step = τ − 1 (up to end-of-request clipping) falls toward 0. It fails when
 * τ falls to ≤ `collapse_floor` (default 1.05 tokens/step) from a baseline above it, or
 * accepted_per_step drops by more than `max_acceptance_drop` (default 25%) of the baseline's and
   outside the noise (the same interval rule as above).

Like with like (evaluate summaries): the gate refuses (exit 2, one line naming every difference) to
compare evaluations whose set-up differs — the workload (name, size, mean lengths), the engine (kind,
max batch, K_max, temperature), the SLO, the load (open or closed loop, the concurrency limit: a
summary from before `load` existed was open loop), and, where both run directories hold a manifest.json, the
models' hashes, the prompt set's digest and, for a real engine, the hardware (CPU model and count, GPU,
and the LD_PRELOAD the run started with: an OpenMP runtime preloaded into vLLM changes what SD costs)
— unless `allow_different` (`--allow-different`) is given; the differences are then listed in the
verdict's notes. A different number of repeats is only noted.

Strategies (entries) only in one file are reported and do not fail the gate. Exit codes (the CLI):
0 pass, 1 regression or collapse, 2 bad input (`InputError`).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any, Literal, Sequence

from pydantic import BaseModel, Field, ValidationError

from autospec.artifacts import read_json_object
from autospec.config import SCHEMA_VERSION
from autospec.errors import InputError
from autospec.summaries import check_eval_summary

Direction = Literal["higher", "lower"]
Status = Literal["pass", "improved", "within noise", "skipped", "missing", "regression", "collapse"]
FAILING: tuple[str, ...] = ("missing", "regression", "collapse")

# The direction table: every gateable metric and which way is better.
METRICS: dict[str, Direction] = {
    # evaluate summaries (autospec.serving.metrics)
    "goodput": "higher", "throughput_tok_s": "higher", "request_throughput": "higher",
    "slo_attainment": "higher", "throughput_vs_no_sd": "higher",
    "capacity_rps": "higher", "capacity_scale": "higher", "capacity_vs_no_sd": "higher",
    "tpot_speedup_vs_no_sd": "higher", "tpot_p50_speedup_vs_no_sd": "higher",
    "tpot_p99_speedup_vs_no_sd": "higher", "e2e_speedup_vs_no_sd": "higher",
    "accepted_per_step": "higher", "committed_per_step": "higher", "acceptance_rate": "higher",
    **{f"{lat}_{stat}": "lower" for lat in ("ttft", "tpot", "itl", "e2e") for stat in ("mean", "p50", "p90", "p99")},
    "makespan_s": "lower", "preemptions": "lower",
    # benchmark results (benchmarks/*.py)
    "tokens_per_s": "higher", "decode_tokens_per_s": "higher", "mean_accepted_per_step": "higher",
    "speedup_batch1": "higher", "decode_speedup_batch1": "higher",
    "us_per_decision": "lower", "ratio_to_verify_step": "lower",
    "wall_s": "lower", "steps_per_wall_s": "higher", "request_steps_per_wall_s": "higher",
    "capacity_vs_best_static": "higher", "rank_agreement": "higher",  # benchmarks/verdict.py
}
DEFAULT_SUMMARY_METRIC = "capacity_rps"
FALLBACK_SUMMARY_METRIC = "goodput"  # when either summary has no capacity (a real engine's evaluation)
DEFAULT_MAX_REGRESSION = 0.05
DEFAULT_NOISE = 0.03  # [chosen] see the module docstring
DEFAULT_MAX_ACCEPTANCE_DROP = 0.25  # [chosen]
DEFAULT_COLLAPSE_FLOOR = 1.05  # [chosen] tokens per SD step (τ) at which SD has stopped paying
OPEN_LOOP = {"max_concurrency": None, "closed_loop": False}  # an evaluate summary's `load` without a limit


def metric_direction(name: str) -> Direction | None:
    """Which way is better for `name`; None when the table does not know it."""
    if name in METRICS:
        return METRICS[name]
    if name.startswith("err_"):
        return "lower"
    for prefix in ("torch_", "vllm_", "sim_"):
        if name.startswith(prefix) and name[len(prefix):] in METRICS:
            return METRICS[name[len(prefix):]]
    return None


MAX_METRIC = 1e15  # [chosen] past any rate, time or token count a benchmark records


def parse_fraction(text: str | float, *, option: str, allow_one: bool = False) -> float:
    """'5%' or '0.05' → 0.05; anything else (words, negatives, ≥ 100%) is an InputError."""
    raw = str(text).strip()
    match = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*(%?)", raw)
    if match is None:
        raise InputError(f"expected a fraction like 5% or 0.05, got {raw!r}", field=option)
    value = float(match.group(1)) / (100.0 if match.group(2) else 1.0)
    if not match.group(2) and value > 1:
        raise InputError(f"{raw!r} is more than 1; write a percentage with %, e.g. {raw}%", field=option)
    if value > 1 or (value == 1 and not allow_one):
        raise InputError(f"must be below 100%, got {raw!r}", field=option)
    return value


# --- the verdict -------------------------------------------------------------------------------------


class Interval(BaseModel):
    """A metric's mean and 95% CI (a benchmark number or a single repeat: all three equal)."""

    mean: float | None
    ci_low: float | None = None
    ci_high: float | None = None

    def text(self) -> str:
        if self.mean is None:
            return "–"
        if self.ci_low is None or self.ci_high is None or self.ci_low == self.ci_high == self.mean:
            return f"{self.mean:.4g}"
        return f"{self.mean:.4g} [{self.ci_low:.4g}, {self.ci_high:.4g}]"


class GateSettings(BaseModel):
    metrics: list[str]
    max_regression: float = Field(DEFAULT_MAX_REGRESSION, ge=0)
    noise: float = Field(DEFAULT_NOISE, ge=0)
    max_acceptance_drop: float = Field(DEFAULT_MAX_ACCEPTANCE_DROP, ge=0, le=1)
    collapse_floor: float = Field(DEFAULT_COLLAPSE_FLOOR, ge=1, allow_inf_nan=False)
    strategies: list[str] | None = None


class Check(BaseModel):
    """One (entry, metric) comparison."""

    strategy: str
    metric: str
    kind: Literal["metric", "collapse"] = "metric"
    direction: Direction
    baseline: Interval
    candidate: Interval
    change: float | None  # relative change of the mean, candidate / baseline − 1
    status: Status
    reason: str

    @property
    def failed(self) -> bool:
        return self.status in FAILING


def md_escape(text: str) -> str:
    """User-supplied text (strategy names, paths, reasons) as literal markdown: every character GitHub's
    renderer would read as table, emphasis, link, code or HTML syntax is backslash-escaped, `<`/`>`/`&`
    become entities and line breaks spaces — a strategy named `a|b` or `<img src=x>` cannot break the
    table or inject markup into $GITHUB_STEP_SUMMARY."""
    text = " ".join(str(text).split())
    text = text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    # an underscore inside a word (tpot_mean) is not emphasis in GitHub's markdown: left as it is
    return re.sub(r"[\\`*{}\[\]|~$]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])", lambda m: "\\" + m.group(0), text)


class GateVerdict(BaseModel):
    passed: bool
    kind: Literal["summary", "benchmark"]
    baseline: str
    candidate: str
    settings: GateSettings
    checks: list[Check]
    only_in_baseline: list[str] = []
    only_in_candidate: list[str] = []
    notes: list[str] = []

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    def markdown(self) -> str:
        s = self.settings
        failed = [c for c in self.checks if c.failed]
        head = "PASS" if self.passed else f"FAIL ({len(failed)} of {len(self.checks)} checks)"
        lines = [f"## autospec gate: {head}", "",
                 f"baseline {md_escape(self.baseline)} · candidate {md_escape(self.candidate)} · max regression "
                 f"{s.max_regression:.1%} · noise floor {s.noise:.1%}"
                 + (f" · acceptance collapse: drop > {s.max_acceptance_drop:.0%} or τ ≤ {s.collapse_floor:g}"
                    if self.kind == "summary" else ""), "",
                 "| strategy | metric | baseline [95% CI] | candidate [95% CI] | change | verdict |",
                 "|---|---|---|---|---:|---|"]
        for c in self.checks:
            arrow = "↑" if c.direction == "higher" else "↓"
            metric = f"{c.metric} {arrow}" + (" (collapse check)" if c.kind == "collapse" else "")
            change = "–" if c.change is None else f"{c.change:+.1%}"
            reason = md_escape(c.reason)
            verdict = f"**{c.status.upper()}**: {reason}" if c.failed else f"{c.status}: {reason}"
            lines.append(f"| {md_escape(c.strategy)} | {md_escape(metric)} | {c.baseline.text()} | "
                         f"{c.candidate.text()} | {change} | {verdict} |")
        extra = []
        if self.only_in_baseline:
            extra.append(f"only in the baseline (not gated): {', '.join(map(md_escape, self.only_in_baseline))}")
        if self.only_in_candidate:
            extra.append(f"only in the candidate (not gated): {', '.join(map(md_escape, self.only_in_candidate))}")
        extra.extend(map(md_escape, self.notes))
        if extra:
            lines.append("")
            lines.extend(f"- {e}" for e in extra)
        return "\n".join(lines) + "\n"


# --- inputs ------------------------------------------------------------------------------------------


class GateInput(BaseModel):
    """A baseline or candidate reduced to entries → metric → interval."""

    path: str
    kind: Literal["summary", "benchmark"]
    name: str  # the benchmark's name; "evaluate" for summaries
    entries: dict[str, dict[str, Interval]]
    meta: dict[str, Any] = {}
    # the run directory's manifest.json beside eval/ (models, prompt set, hardware), when there is one
    manifest: dict[str, Any] | None = None


def load_gate_input(path: str | Path) -> GateInput:
    """Read an evaluate summary (file or run directory) or a benchmark result; InputError on anything else."""
    path = Path(path)
    if path.is_dir():
        inner = path / "eval" / "summary.json"
        if not inner.is_file():
            raise InputError("directory holds no eval/summary.json (run `autospec evaluate --out` there)", path=path)
        path = inner
    data = read_json_object(path)  # benchmark results may carry no schema_version: checked below
    if "strategies" in data:
        return _load_summary(path, data)
    if "benchmark" in data:
        return _load_benchmark(path, data)
    raise InputError("neither an `autospec evaluate` summary (no `strategies`) nor a benchmark result "
                     "(no `benchmark`)", path=path)


def _check_version(path: Path, data: dict, required: bool) -> None:
    if "schema_version" not in data and not required:
        return
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise InputError(f"schema_version {version!r} is not supported (this autospec reads {SCHEMA_VERSION})",
                         path=path, field="schema_version")


def _number(value: Any, path: Path, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InputError(f"expected a finite number or null, got {value!r}", path=path, field=field)
    if abs(value) > MAX_METRIC:  # the noise bands of 1e308 overflow to infinity
        raise InputError(f"{value:g} is not a plausible measurement (|value| > {MAX_METRIC:g})", path=path, field=field)
    return float(value)


def _load_summary(path: Path, data: dict) -> GateInput:
    _check_version(path, data, required=True)
    strategies = data["strategies"]
    if not isinstance(strategies, dict) or not strategies:
        raise InputError("`strategies` must be a non-empty object", path=path, field="strategies")
    entries: dict[str, dict[str, Interval]] = {}
    for name, metrics in strategies.items():
        if not isinstance(metrics, dict):
            raise InputError("expected an object of metrics", path=path, field=f"strategies.{name}")
        entries[name] = {}
        for metric, value in metrics.items():
            field = f"strategies.{name}.{metric}"
            if not isinstance(value, dict) or "mean" not in value:
                raise InputError("expected {mean, ci_low, ci_high}", path=path, field=field)
            entries[name][metric] = Interval(mean=_number(value["mean"], path, field),
                                             ci_low=_number(value.get("ci_low"), path, field),
                                             ci_high=_number(value.get("ci_high"), path, field))
    check_eval_summary(data, path)  # the rest of the shape report reads too: wrong types named, not crashed on
    meta = {k: data.get(k) for k in ("baseline", "repeats", "workload", "engine", "slo")}
    # a real engine's measurements taken while the host was busy or off its profiled speed (evaluate's
    # `disturbed`; older summaries carry only host_speed): gate refuses to judge code by them
    health = [data.get(k) if isinstance(data.get(k), dict) else {} for k in ("host_speed", "host_load")]
    meta["disturbed"] = bool(data.get("disturbed")) or any(bool(h.get("disturbed")) for h in health)
    meta["disturbed_note"] = next((str(h["note"]) for h in health if h.get("note")), None)
    # how requests were sent; a summary written before evaluate recorded it was open loop
    meta["load"] = {**OPEN_LOOP, **(data.get("load") or {})}
    manifest_path = path.parent.parent / "manifest.json"
    # the run's manifest, when the summary sits in a run directory: what the like-with-like check reads
    manifest = (read_json_object(manifest_path) if path.parent.name == "eval" and manifest_path.is_file()
                else None)
    return GateInput(path=str(path), kind="summary", name="evaluate", entries=entries, meta=meta,
                     manifest=manifest)


def _row_metrics(row: dict, path: Path, where: str) -> dict[str, Interval]:
    out = {}
    for key, value in row.items():
        if metric_direction(key) is None or isinstance(value, bool):
            continue
        if value is None or isinstance(value, (int, float)):
            v = _number(value, path, f"{where}.{key}")
            out[key] = Interval(mean=v, ci_low=v, ci_high=v)
    return out


def _load_benchmark(path: Path, data: dict) -> GateInput:
    _check_version(path, data, required=False)
    name = data["benchmark"]
    if not isinstance(name, str) or not name:
        raise InputError("`benchmark` must be a name", path=path, field="benchmark")
    entries: dict[str, dict[str, Interval]] = {}
    rows = data.get("rows")
    if rows is None:
        entries[name] = _row_metrics(data, path, "")
    else:
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise InputError("`rows` must be a list of objects", path=path, field="rows")
        for i, row in enumerate(rows):
            ident = " ".join(f"{k}={v}" for k, v in row.items()
                             if isinstance(v, (str, int, bool)) and metric_direction(k) is None)
            label = ident or f"row {i}"
            if label in entries:
                raise InputError(f"two rows are both named {label!r}", path=path, field=f"rows[{i}]")
            entries[label] = _row_metrics(row, path, f"rows[{i}]")
    return GateInput(path=str(path), kind="benchmark", name=name, entries=entries,
                     meta={"hardware": data.get("hardware")})


# --- the comparison ----------------------------------------------------------------------------------


def _band(iv: Interval, noise: float) -> tuple[float, float]:
    """The CI widened to at least ±noise/2 of the mean (the noise floor)."""
    m = iv.mean
    assert m is not None
    half = noise * abs(m) / 2
    lo = m if iv.ci_low is None else min(iv.ci_low, m)
    hi = m if iv.ci_high is None else max(iv.ci_high, m)
    return min(lo, m - half), max(hi, m + half)


def _separated(base: Interval, cand: Interval, direction: Direction, noise: float, *, worse: bool) -> bool:
    """True when cand's band lies wholly on the worse (or, worse=False, better) side of base's band."""
    bl, bh = _band(base, noise)
    cl, ch = _band(cand, noise)
    cand_below = ch < bl
    cand_above = cl > bh
    if direction == "higher":
        return cand_below if worse else cand_above
    return cand_above if worse else cand_below


def _relative(base: float, cand: float) -> float | None:
    if base == 0:
        return None if cand == 0 else math.copysign(math.inf, cand)
    return (cand - base) / abs(base)


def compare_metric(strategy: str, metric: str, base: Interval, cand: Interval,
                   settings: GateSettings) -> Check:
    direction = metric_direction(metric) or "higher"
    common = dict(strategy=strategy, metric=metric, direction=direction, baseline=base, candidate=cand)
    if base.mean is None:
        return Check(**common, change=None, status="skipped", reason="undefined in the baseline")
    if cand.mean is None:
        return Check(**common, change=None, status="missing", reason="defined in the baseline, not in the candidate")
    change = _relative(base.mean, cand.mean)
    rel = 0.0 if change is None else change
    worse_by = -rel if direction == "higher" else rel  # > 0: the candidate is worse
    thr = settings.max_regression
    if worse_by > thr:
        if _separated(base, cand, direction, settings.noise, worse=True):
            return Check(**common, change=change, status="regression",
                         reason=f"worse by {worse_by:.1%} > {thr:.1%}, outside the noise")
        return Check(**common, change=change, status="within noise",
                     reason=f"worse by {worse_by:.1%} > {thr:.1%} but the intervals overlap")
    if -worse_by > thr and _separated(base, cand, direction, settings.noise, worse=False):
        return Check(**common, change=change, status="improved", reason=f"better by {-worse_by:.1%}")
    return Check(**common, change=change, status="pass", reason=f"within {thr:.1%}")


def _tau(metrics: dict[str, Interval]) -> float | None:
    tau = metrics.get("committed_per_step")
    if tau is not None and tau.mean is not None:
        return tau.mean
    acc = metrics.get("accepted_per_step")
    return None if acc is None or acc.mean is None else acc.mean + 1


def compare_acceptance(strategy: str, base: dict[str, Interval], cand: dict[str, Interval],
                       settings: GateSettings) -> Check | None:
    """The acceptance-collapse check of one SD strategy; None for a strategy that does not speculate."""
    b = base.get("accepted_per_step")
    if b is None or b.mean is None or b.mean <= 0:
        return None
    c = cand.get("accepted_per_step", Interval(mean=None))
    common = dict(strategy=strategy, metric="accepted_per_step", kind="collapse", direction="higher",
                  baseline=b, candidate=c)
    if c.mean is None:
        return Check(**common, change=None, status="missing", reason="no accepted_per_step in the candidate")
    change = (c.mean - b.mean) / b.mean
    tau_b, tau_c = _tau(base), _tau(cand)
    tau_text = f"τ {tau_b:.3g} → {tau_c:.3g} tokens/step" if tau_b is not None and tau_c is not None else ""
    if tau_b is not None and tau_c is not None and tau_c <= settings.collapse_floor < tau_b:
        return Check(**common, change=change, status="collapse",
                     reason=f"{tau_text} ≤ {settings.collapse_floor:g}")
    drop = -change
    if drop > settings.max_acceptance_drop:
        if _separated(b, c, "higher", settings.noise, worse=True):
            return Check(**common, change=change, status="collapse",
                         reason=f"accepted/step down {drop:.1%} > {settings.max_acceptance_drop:.0%} ({tau_text})")
        return Check(**common, change=change, status="within noise",
                     reason=f"accepted/step down {drop:.1%} but the intervals overlap ({tau_text})")
    return Check(**common, change=change, status="pass", reason=tau_text or "no collapse")


def setup_differences(base: GateInput, cand: GateInput) -> list[str]:
    """What makes two evaluations unlike (module docstring, "Like with like"); empty for benchmarks."""
    if base.kind != "summary":
        return []
    diffs = []
    pairs = [("workload", ("name", "requests", "mean_prompt_len", "mean_output_len")),
             ("engine", ("kind", "max_batch", "k_max", "temperature")), ("slo", None),
             ("load", tuple(OPEN_LOOP))]
    for key, fields in pairs:
        bv, cv = base.meta.get(key), cand.meta.get(key)
        if fields is not None and isinstance(bv, dict) and isinstance(cv, dict):
            bv, cv = ({f: v.get(f) for f in fields} for v in (bv, cv))
        if bv != cv:
            diffs.append(f"{key}: baseline {json.dumps(bv, default=str)}, candidate {json.dumps(cv, default=str)}")
    if base.manifest is not None and cand.manifest is not None:
        real = (base.meta.get("engine") or {}).get("kind") != "sim"
        for key, value in (("models", _model_hashes), ("prompt set", _prompt_set),
                           *((("hardware", _hardware),) if real else ())):
            bv, cv = value(base.manifest), value(cand.manifest)
            if bv != cv:
                diffs.append(f"{key}: baseline {json.dumps(bv, default=str)}, candidate {json.dumps(cv, default=str)}")
    return diffs


def _model_hashes(manifest: dict) -> dict:
    return {name: (entry or {}).get("sha256") for name, entry in (manifest.get("models") or {}).items()}


def _prompt_set(manifest: dict) -> Any:
    return manifest.get("prompt_set")


def _hardware(manifest: dict) -> dict:
    hw = manifest.get("hardware") or {}
    return {k: hw.get(k) for k in ("cpu_model", "cpu_count", "gpu", "ld_preload")}


def _compat_notes(base: GateInput, cand: GateInput) -> list[str]:
    """Differences worth a reader's attention that do not make the runs unlike."""
    if base.kind == "summary" and base.meta.get("repeats") != cand.meta.get("repeats"):
        return [f"repeats differ: baseline {base.meta.get('repeats')}, candidate {cand.meta.get('repeats')}"]
    return []


def gate(base: GateInput, cand: GateInput, *, metrics: Sequence[str] | None = None,
         max_regression: float = DEFAULT_MAX_REGRESSION, noise: float = DEFAULT_NOISE,
         max_acceptance_drop: float = DEFAULT_MAX_ACCEPTANCE_DROP, collapse_floor: float = DEFAULT_COLLAPSE_FLOOR,
         strategies: Sequence[str] | None = None, allow_different: bool = False,
         allow_disturbed: bool = False) -> GateVerdict:
    """Compare every (entry, metric) both inputs share; see the module docstring for the rules."""
    if base.kind != cand.kind:
        raise InputError(f"cannot compare a {base.kind} with a {cand.kind}", path=cand.path)
    for side in (base, cand):
        if side.meta.get("disturbed") and not allow_disturbed:
            raise InputError(f"measured on a disturbed host ({side.meta.get('disturbed_note') or 'see its summary'});"
                             " re-run it on a quiet host, or pass --allow-disturbed to compare anyway",
                             path=side.path, field="disturbed")
    unlike = setup_differences(base, cand)
    if unlike and not allow_different:
        raise InputError("baseline and candidate are not like with like (" + "; ".join(unlike)
                         + "); --allow-different compares them anyway", path=cand.path)
    if base.kind == "benchmark" and base.name != cand.name:
        raise InputError(f"benchmark {cand.name!r} is not the baseline's {base.name!r}", path=cand.path,
                         field="benchmark")
    if collapse_floor < 1:
        raise InputError(f"must be >= 1 token per step, got {collapse_floor:g}", field="collapse-floor")
    shared = [name for name in base.entries if name in cand.entries]
    if strategies:
        for name in strategies:
            for side in (base, cand):
                if name not in side.entries:
                    raise InputError(f"strategy {name!r} is not in this file (it has: "
                                     f"{', '.join(side.entries)})", path=side.path, field="strategy")
        shared = [name for name in shared if name in strategies]
    if not shared:
        raise InputError("baseline and candidate share no strategy/row to compare", path=cand.path)

    if metrics:
        chosen = list(dict.fromkeys(metrics))
        for metric in chosen:
            if metric_direction(metric) is None:
                known = ", ".join(m for m in METRICS if not m.endswith(("_p50", "_p90")))
                raise InputError(f"unknown metric {metric!r} (gateable: {known}, err_*)", field="metric")
            for side in (base, cand):
                if not any(metric in side.entries[name] for name in shared):
                    raise InputError(f"metric {metric!r} is not in this file", path=side.path, field="metric")
    elif base.kind == "summary":
        has_capacity = _has(base, shared) and _has(cand, shared)
        chosen = [DEFAULT_SUMMARY_METRIC if has_capacity else FALLBACK_SUMMARY_METRIC]
    else:
        chosen = list(dict.fromkeys(m for name in shared for m in base.entries[name] if m in cand.entries[name]))
        if not chosen:
            raise InputError("the benchmark rows carry no metric the direction table knows", path=base.path)
    try:
        settings = GateSettings(metrics=chosen, max_regression=max_regression, noise=noise,
                                max_acceptance_drop=max_acceptance_drop, collapse_floor=collapse_floor,
                                strategies=list(strategies) if strategies else None)
    except ValidationError as exc:  # a flag out of range (--collapse-floor nan or 0.5): named as the flag
        bad = InputError.from_validation(exc)
        raise InputError(bad.problem, field=(bad.field or "").replace("_", "-") or None) from None

    checks: list[Check] = []
    for name in shared:
        b, c = base.entries[name], cand.entries[name]
        for metric in chosen:
            if metric in b or metric in c:
                checks.append(compare_metric(name, metric, b.get(metric, Interval(mean=None)),
                                             c.get(metric, Interval(mean=None)), settings))
        if base.kind == "summary":
            collapse = compare_acceptance(name, b, c, settings)
            if collapse is not None:
                checks.append(collapse)
    restrict = set(strategies or ())
    return GateVerdict(
        passed=not any(ch.failed for ch in checks), kind=base.kind, baseline=base.path, candidate=cand.path,
        settings=settings, checks=checks,
        only_in_baseline=[n for n in base.entries if n not in cand.entries and (not restrict or n in restrict)],
        only_in_candidate=[n for n in cand.entries if n not in base.entries and (not restrict or n in restrict)],
        notes=[f"set-up differs (--allow-different): {d}" for d in unlike] + _compat_notes(base, cand) + (
            [f"{FALLBACK_SUMMARY_METRIC} gated: {'the baseline' if not _has(base, shared) else 'the candidate'} "
             f"has no {DEFAULT_SUMMARY_METRIC} (an evaluation on a real engine, or with --no-capacity)"]
            if chosen == [FALLBACK_SUMMARY_METRIC] and not metrics else []))


def _has(side: GateInput, shared: Sequence[str]) -> bool:
    return any((side.entries[name].get(DEFAULT_SUMMARY_METRIC) or Interval(mean=None)).mean is not None
               for name in shared)


def run_gate(baseline: str | Path, candidate: str | Path, **kwargs: Any) -> GateVerdict:
    """Load both files and gate; InputError on any bad input."""
    return gate(load_gate_input(baseline), load_gate_input(candidate), **kwargs)


def append_step_summary(markdown: str, path: str | Path) -> None:
    """Append the verdict to a GitHub Actions job summary ($GITHUB_STEP_SUMMARY)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(markdown + "\n")
