"""The `autospec` command line. Each command parses, calls one stage function, prints with rich.

Bad input anywhere (files, flags, configs) surfaces as `InputError`: one line on stderr naming the
file/field and the problem, exit code 2, no traceback, and no half-written artifacts.
"""

from __future__ import annotations

import functools
import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from autospec.errors import InputError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="Benchmark and autotune speculative decoding for LLM serving.")
out = Console()
err = Console(stderr=True)


def fail_cleanly(fn):
    """Turn InputError into the one-line, exit-code-2 contract."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            err.print(f"error: {exc.one_line()}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None

    return wrapper


def _prompts(paths: list[Path], per_set: int | None):
    from autospec.workloads.prompts import bundled_prompt_sets, load_prompts

    if paths:
        prompts = []
        for p in paths:
            prompts.extend(load_prompts(p, limit=per_set))
        return prompts
    sets = bundled_prompt_sets(limit=per_set)
    return [p for domain in sorted(sets) for p in sets[domain]]


def _generate(spec, as_json: bool, out_dir: Path | None) -> dict:
    """Shared by `generate` and `run`: SD generation with a printed summary."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autospec.artifacts import build_manifest, write_json, write_text
    from autospec.config import dump_run_spec
    from autospec.generate import (build_engine, encode_prompts, load_tokenizer, needs_latency_model,
                                   quick_latency_model, run_generate, strategy_spec)
    from autospec.strategy import build_strategy

    g = spec.generate
    strat_spec = strategy_spec(g.strategy, g.k)
    prompts = _prompts(g.prompts, g.prompts_per_set)
    engine = build_engine(spec.pair, spec.engine, g.temperature)
    tokenizer = load_tokenizer(spec.pair.target)
    prompt_ids = encode_prompts(tokenizer, prompts)
    latency_model = quick_latency_model(engine) if needs_latency_model(strat_spec) else None
    decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
    runs = [strat_spec]
    if g.compare_to_no_sd and strat_spec.length.policy != "none":
        runs.insert(0, strategy_spec(None, 0))
    results = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json or not err.is_terminal) as progress:
        for s in runs:
            task = progress.add_task(f"{s.name}", total=len(prompt_ids))
            results.append(run_generate(engine, prompt_ids, build_strategy(s), max_tokens=g.max_tokens,
                                        batch_size=g.batch_size, ignore_eos=g.ignore_eos,
                                        latency_model=latency_model, decode=decode,
                                        on_batch_done=lambda n, t=task: progress.advance(t, n)))
    main = results[-1]
    summary = main.summary()
    if len(results) == 2:
        base = results[0].summary()
        summary["no_sd_tokens_per_s"] = base["tokens_per_s"]
        summary["speedup_vs_no_sd"] = summary["tokens_per_s"] / base["tokens_per_s"]
        summary["t0_identical_to_no_sd"] = (results[0].token_ids == main.token_ids) if g.temperature == 0 else None
    report = {"texts": main.texts, **summary}
    if out_dir is not None:
        write_text(out_dir / "config.toml", dump_run_spec(spec))
        write_json(out_dir / "generate" / "summary.json", summary)
        write_json(out_dir / "generate" / "outputs.json",
                   {"prompts": [p.source_id for p in prompts], "texts": main.texts, "token_ids": main.token_ids})
        write_json(out_dir / "manifest.json", build_manifest(
            spec.model_dump(mode="json"), seed=spec.engine.seed,
            models={"target": spec.pair.target, "draft": spec.pair.draft}, inputs=g.prompts))
    if as_json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        table = Table(title=f"autospec generate — {main.strategy}")
        table.add_column("metric")
        table.add_column("value", justify="right")
        for key, value in summary.items():
            table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
        out.print(table)
        if out_dir is not None:
            out.print(f"run directory: {out_dir}")
    return report


@app.command()
@fail_cleanly
def generate(
    prompts: Optional[list[Path]] = typer.Option(None, "--prompts", help="prompt file(s): HumanEval, GSM8K, "
                                                 "MT-Bench/Spec-Bench, ShareGPT, JSONL with `prompt`, or .txt; "
                                                 "default: the bundled domain sets"),
    k: Optional[int] = typer.Option(None, "--k", help="static draft length K (0 = no SD); overrides --strategy"),
    strategy: str = typer.Option("static-k4", "--strategy", help="preset name (see `autospec presets`) or file"),
    temperature: float = typer.Option(0.0, "--temperature"),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    batch_size: int = typer.Option(8, "--batch-size"),
    limit: Optional[int] = typer.Option(None, "--limit", help="prompts per file"),
    ignore_eos: bool = typer.Option(False, "--ignore-eos"),
    target: Optional[Path] = typer.Option(None, "--target", help="target model directory (HF format)"),
    draft: Optional[Path] = typer.Option(None, "--draft", help="draft model directory (HF format)"),
    device: str = typer.Option("cpu", "--device"),
    seed: int = typer.Option(0, "--seed"),
    compare: bool = typer.Option(False, "--compare", help="also run K=0 and report the speed-up"),
    out_dir: Optional[Path] = typer.Option(None, "--out", help="write a run directory here"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of a table"),
) -> None:
    """Speculative decoding over a prompt file with one strategy (FCFS static batching)."""
    from pydantic import ValidationError

    from autospec.config import EngineSpec, GenerateSpec, PairSpec, RunSpec

    if k is not None and k < 0:
        raise InputError(f"--k must be >= 0, got {k}", field="k")
    for name, value, low in (("--max-tokens", max_tokens, 1), ("--batch-size", batch_size, 1)):
        if value < low:
            raise InputError(f"{name} must be >= {low}, got {value}", field=name)
    if temperature < 0:
        raise InputError(f"--temperature must be >= 0, got {temperature}", field="temperature")
    try:
        pair = PairSpec()
        if target is not None:
            pair.target = target
            pair.draft = draft
        elif draft is not None:
            pair.draft = draft
        spec = RunSpec(pair=pair, engine=EngineSpec(device=device, seed=seed),
                       generate=GenerateSpec(prompts=prompts or [], prompts_per_set=limit, strategy=strategy, k=k,
                                             temperature=temperature, max_tokens=max_tokens, batch_size=batch_size,
                                             ignore_eos=ignore_eos, compare_to_no_sd=compare))
    except ValidationError as exc:
        e = exc.errors()[0]
        raise InputError(e["msg"], field=".".join(map(str, e["loc"]))) from None
    if spec.pair.draft is None and (k or 0) > 0:
        raise InputError("SD needs a draft model: pass --draft", field="draft")
    _generate(spec, as_json, out_dir)


@app.command()
@fail_cleanly
def run(
    config: Optional[Path] = typer.Argument(None, help="run config TOML (default: the embedded default)"),
    out_dir: Path = typer.Option(Path("runs/default"), "--out", help="run directory"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The main job on a config (default: the bundled pair over the bundled prompt domains)."""
    from autospec.config import GenerateSpec, RunSpec, load_run_spec

    spec = load_run_spec(config) if config is not None else RunSpec(
        generate=GenerateSpec(prompts_per_set=4, batch_size=1, max_tokens=48, strategy="static-k4",
                              compare_to_no_sd=True))
    _generate(spec, as_json, out_dir)


@app.command()
@fail_cleanly
def profile(
    out_dir: Path = typer.Option(..., "--out", help="run directory (writes DIR/profile/ and DIR/manifest.json)"),
    quick: bool = typer.Option(False, "--quick", help="small grid and few prompts (a few minutes on a CPU)"),
    k_max: int = typer.Option(8, "--k-max", help="longest draft chain recorded / verified"),
    prompts: Optional[list[Path]] = typer.Option(None, "--prompts", help="prompt file(s); default: the bundled "
                                                 "code/chat/math sets"),
    target: Optional[Path] = typer.Option(None, "--target", help="target model directory (HF format)"),
    draft: Optional[Path] = typer.Option(None, "--draft", help="draft model directory (HF format)"),
    device: str = typer.Option("cpu", "--device"),
    seed: int = typer.Option(0, "--seed"),
    prompts_per_domain: Optional[int] = typer.Option(None, "--prompts-per-domain", min=1,
                                                     help="acceptance-trace prompts per domain "
                                                          "(default 16, 6 with --quick)"),
) -> None:
    """Measure draft/target step latency and record acceptance traces."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autospec.artifacts import build_manifest, write_json
    from autospec.config import EngineSpec, PairSpec
    from autospec.generate import build_engine, load_tokenizer
    from autospec.profile import EncodedPrompt, ProfileSettings, run_profile, write_profile

    if not 1 <= k_max <= 32:
        raise InputError(f"--k-max must be in 1..32, got {k_max}", field="k-max")
    if (target is None) != (draft is None):
        raise InputError("pass both --target and --draft (profiling needs a pair)", field="target")
    pair = PairSpec() if target is None else PairSpec(target=target, draft=draft)
    for p in (pair.target, pair.draft):
        if p is None or not (Path(p) / "config.json").is_file():
            raise InputError("not a model directory (no config.json)", path=p)
    settings = ProfileSettings.quick(k_max) if quick else ProfileSettings(k_max=k_max)
    settings = settings.model_copy(update={"seed": seed, **({"prompts_per_domain": prompts_per_domain}
                                                             if prompts_per_domain is not None else {})})
    texts = _prompts(prompts or [], settings.prompts_per_domain)
    if prompts:  # user files may mix domains: keep at most prompts_per_domain of each
        per_domain: dict[str, list] = {}
        for t in texts:
            per_domain.setdefault(t.domain, []).append(t)
        texts = [t for group in per_domain.values() for t in group[: settings.prompts_per_domain]]
    tokenizer = load_tokenizer(pair.target)
    encoded = []
    for t in texts:
        ids = tokenizer.encode(t.text, add_special_tokens=False)
        if ids:
            encoded.append(EncodedPrompt(t.source_id, t.domain, ids))
    engine = build_engine(pair, EngineSpec(device=device, seed=seed, k_max=k_max), 0.0)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=not err.is_terminal) as bar:
        def task(name: str, total: int):
            tid = bar.add_task(name, total=total)
            return lambda n: bar.advance(tid, n)

        result = run_profile(engine, encoded, settings, task)
    write_profile(out_dir, result, settings, {"device": device, "prompts": len(encoded)})
    config = {"command": "profile", "settings": settings.model_dump(), "device": device,
              "pair": pair.model_dump(mode="json")}
    write_json(out_dir / "manifest.json", build_manifest(
        config, seed=seed, models={"target": pair.target, "draft": pair.draft}, inputs=prompts or []))
    table = Table(title="autospec profile")
    table.add_column("item")
    table.add_column("value", justify="right")
    table.add_row("latency rows", str(len(result.latency)))
    table.add_row("acceptance rows", str(len(result.acceptance)))
    for domain, m in result.acceptance.groupby("domain")["match_len"].mean().items():
        table.add_row(f"mean match length ({domain})", f"{m:.2f}")
    table.add_row("gpu telemetry", "yes" if result.telemetry.get("available") else "no")
    table.add_row("wall s", f"{result.wall_s:.1f}")
    out.print(table)
    out.print(f"profile written to {out_dir / 'profile'}")


@app.command()
@fail_cleanly
def fit(
    run_dir: Path = typer.Argument(..., help="run directory holding profile/ (from `autospec profile`)"),
    seed: int = typer.Option(0, "--seed", help="seed of the 80/20 train/held-out split"),
) -> None:
    """Fit latency models (AdaSpec linear, FASER piecewise, SPS table) and STS calibration to a profile."""
    from autospec.fit import fit_profile, write_fit

    models = fit_profile(run_dir, seed=seed)
    path = write_fit(run_dir, models)
    table = Table(title="autospec fit (held-out errors)")
    table.add_column("model")
    table.add_column("draft", justify="right")
    table.add_column("target", justify="right")
    table.add_row("linear MAPE", f"{models.linear_mape['draft']:.1%}", f"{models.linear_mape['target']:.1%}")
    table.add_row("piecewise MAPE", f"{models.piecewise_mape['draft']:.1%}", f"{models.piecewise_mape['target']:.1%}")
    for name in ("draft", "target"):
        c = models.linear[name]
        table.add_row(f"{name} α / γ / δ", *(["", f"{c['alpha']:.3g} / {c['gamma']:.3g} / {c['delta']:.3g}"]
                                           if name == "target" else
                                           [f"{c['alpha']:.3g} / {c['gamma']:.3g} / {c['delta']:.3g}", ""]))
    table.add_row("STS ECE before → after", "", f"{models.sts['ece_before']:.3f} → {models.sts['ece_after']:.3f}")
    for domain, probs in models.per_position_acceptance.items():
        table.add_row(f"P(m ≥ 1..{len(probs)}) {domain}", "", " ".join(f"{p:.2f}" for p in probs))
    out.print(table)
    out.print(f"fit written to {path}")


@app.command()
@fail_cleanly
def evaluate(
    workload: Path = typer.Option(..., "--workload", help="workload spec TOML ([workload] table)"),
    strategies: str = typer.Option(..., "--strategies", help="comma-separated presets or preset files; "
                                   "no-sd is added as the speed-up baseline when not listed"),
    engine: str = typer.Option("torch", "--engine", help="torch | sim"),
    profile_dir: Optional[Path] = typer.Option(None, "--profile", help="profiled + fitted run directory "
                                               "(required for --engine sim; latency model for torch)"),
    out_dir: Path = typer.Option(..., "--out", help="run directory to write eval/ and manifest.json to"),
    repeats: int = typer.Option(1, "--repeats", help="runs per strategy; CIs bootstrap across them"),
    slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", help="TTFT SLO in seconds (default 2)"),
    slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", help="TPOT SLO in seconds (default 0.2)"),
    max_batch: int = typer.Option(8, "--max-batch", help="batch slots"),
    kv_budget: Optional[int] = typer.Option(None, "--kv-budget", help="KV tokens the running requests may hold"),
    temperature: float = typer.Option(0.0, "--temperature"),
    k_max: int = typer.Option(8, "--k-max"),
    target: Optional[Path] = typer.Option(None, "--target", help="target model directory (torch engine)"),
    draft: Optional[Path] = typer.Option(None, "--draft", help="draft model directory (torch engine)"),
    device: str = typer.Option("cpu", "--device"),
    seed: int = typer.Option(0, "--seed"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON object"),
) -> None:
    """Replay a workload under strategies with continuous batching; writes eval/*.parquet + summary.json."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from autospec.evaluate import DEFAULT_SLO_TPOT_S, DEFAULT_SLO_TTFT_S, HEADLINE, run_evaluate, spec_from_flags

    names = [s.strip() for s in strategies.split(",") if s.strip()]
    if not names:
        raise InputError("--strategies lists no strategy", field="strategies")
    if engine not in ("torch", "sim"):
        raise InputError(f"unknown engine {engine!r}; use torch or sim", field="engine")
    flags: dict = dict(workload=workload, strategies=names, engine=engine, profile=profile_dir, repeats=repeats,
                       slo={"ttft_s": DEFAULT_SLO_TTFT_S if slo_ttft is None else slo_ttft,
                            "tpot_s": DEFAULT_SLO_TPOT_S if slo_tpot is None else slo_tpot},
                       max_batch=max_batch, kv_budget_tokens=kv_budget, temperature=temperature, k_max=k_max,
                       seed=seed, device=device)
    if target is not None or draft is not None:
        from autospec.config import PairSpec

        flags["pair"] = PairSpec(**{k: v for k, v in (("target", target), ("draft", draft)) if v is not None})
    spec = spec_from_flags(**flags)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, disable=as_json or not err.is_terminal) as progress:
        def track(label: str, total: int):
            task = progress.add_task(label, total=total)
            return lambda _rid: progress.advance(task)

        result = run_evaluate(spec, out_dir, progress=track)
    summary = result.summary
    if as_json:
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
        return
    table = Table(title=f"autospec evaluate — {summary['workload']['name'] or workload.name} on {engine} "
                        f"({spec.repeats} repeat{'s' if spec.repeats > 1 else ''}; mean [95% CI])")
    # One column per strategy: a few strategies × many metrics reads better tall than wide.
    table.add_column("metric")
    for name in summary["strategies"]:
        table.add_column(name, justify="right")

    def cell(v: dict) -> str:
        if v["mean"] is None:
            return "–"
        if spec.repeats == 1 or v["ci_low"] is None:
            return f"{v['mean']:.4g}"
        return f"{v['mean']:.4g} [{v['ci_low']:.3g}, {v['ci_high']:.3g}]"

    for metric in HEADLINE:
        table.add_row(metric, *(cell(m[metric]) for m in summary["strategies"].values()))
    out.print(table)
    out.print(f"SLO: TTFT ≤ {spec.slo.ttft_s:g} s, TPOT ≤ {spec.slo.tpot_s:g} s · run directory: {out_dir}")


@app.command()
@fail_cleanly
def presets() -> None:
    """List the bundled strategy presets."""
    from autospec.strategy import list_presets, load_preset

    table = Table(title="strategy presets")
    table.add_column("name")
    table.add_column("length / verify / schedule")
    table.add_column("description")
    for name in list_presets():
        s = load_preset(name)
        table.add_row(name, f"{s.length.policy} / {s.verify.policy} / {s.schedule.policy}", s.strategy.description)
    out.print(table)


@app.command()
def version() -> None:
    """Print the autospec version."""
    from autospec import __version__

    out.print(__version__)


if __name__ == "__main__":
    app()
