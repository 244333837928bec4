"""Strategies → vLLM's speculative_config: the one place a `StrategySpec` becomes the
`--speculative-config` JSON vLLM runs (used by the vLLM replay, `autospec deploy`'s
`vllm_speculative_config.json` and the tests), with the draft as `method = "draft_model"`.

Anything this mapping cannot express raises InputError "strategy X is not supported on the vllm engine
(reason)" rather than running something different under the same name. vLLM's scheduler hooks (a
`scheduler_cls`: schedule, update_from_output, update_draft_token_ids) see per request the drafted and
sampled token ids — so drafted and accepted counts — and the step's wall time; they do not see the
draft's or the target's distributions. Hence:

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
  length oracle, oracle-m    unsupported: the true match length (simulator only)
  verify all                 vLLM verifies every draft it schedules
  verify adaspec, dspark,    unsupported: per-token draft confidences (vLLM's own DSpark prefix
    dspark-async               scheduler, enable_adaptive_verification, is Model Runner V2 / GPU only)
  schedule fcfs              vLLM's scheduler; las, lp-sjf, laps-sd unsupported (own priority/preemption)
  execution sm_split, chunk_size, early_exit   unsupported (vLLM has none of them)

An online strategy's config carries one autospec-only key (ONLINE_KEY, the scheduler's settings):
`launch_parts` (and through it `engine.engine_kwargs`) turns it into vLLM's `scheduler_cls` +
`additional_config` (and async_scheduling off); vLLM itself rejects the key, so such a config never runs
without its policy. The online scheduler's one-step lag (vLLM drafts step n+1's tokens inside step n, so
K is chosen before step n's acceptance is known) is documented in autospec/serving/vllm/online.py.

Nothing here imports vLLM. The table with its reasons is docs/vllm.md, "What is refused, and why".
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from autospec.errors import InputError
from autospec.policies.batch_schedule import BatchScheduleParams
from autospec.serving.vllm.online import (
    ONLINE_KEY,
    ONLINE_LENGTH_POLICIES,
    ONLINE_SCHEDULER_CLS,
    needs_fit,
    online_settings,
)
from autospec.strategy import PolicySection, StrategySpec

__all__ = ["DEFAULT_K_MAX", "launch_parts", "speculative_config_for", "unsupported", "vllm_form"]

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
    "oracle-m": "the true match length, which only the simulator knows",
}
VERIFY_MISSING_SIGNAL = {
    "adaspec": "per-token draft confidences (AdaSpec's verifier trims by cumulative confidence)",
    "dspark": "per-token draft confidences (DSpark's survival estimates)",
    "dspark-async": "per-token draft confidences (DSpark's survival estimates)",
}


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
    _check_execution_schedule_verify(spec)
    policy = spec.length.policy
    if policy == "none":
        if k_schedule is not None:
            raise unsupported(spec, "a K schedule needs a drafting strategy, not no-SD")
        return {}
    if policy in ONLINE_LENGTH_POLICIES:
        return _online_config(spec, draft, k_schedule, k_max, fit, temperature)
    if policy != "static":
        raise unsupported(spec, _length_refusal(policy))
    return _static_config(spec, draft, k_schedule)


def _check_execution_schedule_verify(spec: StrategySpec) -> None:
    """Refuse the execution, schedule and verify policies vLLM has no form for (decision table)."""
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


def _length_refusal(policy: str) -> str:
    """Why a length policy that is neither none, static nor online has no vLLM config."""
    if policy in LENGTH_MISSING_SIGNAL:
        return (f"length policy {policy!r} needs {LENGTH_MISSING_SIGNAL[policy]}, which vLLM's scheduler "
                f"hooks do not see{HOOKS_SEE}")
    if policy == "batch-schedule":
        return ("length policy 'batch-schedule' becomes vLLM's per-batch-size schedule through "
                "autospec.serving.vllm.speculative_config.vllm_form (it needs the deployment's max batch)")
    return f"length policy {policy!r} has no vLLM form"


def _static_config(spec: StrategySpec, draft: Path | None,
                   k_schedule: Sequence[tuple[int, int, int]] | None) -> dict[str, Any]:
    """speculative_config_for's static-K branch (with an optional per-batch-size schedule)."""
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
            "draft_sample_method": "greedy",  # as for static K (_static_config)
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
