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
        generate=GenerateSpec(prompts_per_set=4, batch_size=4, max_tokens=48, strategy="static-k3",
                              compare_to_no_sd=True))
    _generate(spec, as_json, out_dir)


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
