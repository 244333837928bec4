"""Deployable configs for a chosen strategy: `deploy/` (written by `autospec tune`).

* `autospec_strategy.toml` — the strategy as a preset file: `autospec evaluate --strategies` and
  `autospec generate --strategy` take it as is.
* `vllm_speculative_config.json` — when vLLM can express the strategy, exactly the JSON vLLM's
  `--speculative-config` takes (method, draft model path, `num_speculative_tokens` and, for a per-batch-size
  schedule, `num_speculative_tokens_per_batch_size` as [first, last, K] rows); nothing else is in it, so
  `vllm serve TARGET --speculative-config "$(cat deploy/vllm_speculative_config.json)"` works. When vLLM
  cannot express it (a per-request verify policy, a latency-model-driven K, FASER execution knobs), the
  file says so instead: {"supported": false, "strategy": ..., "notes": [why]} — it must not start a
  deployment that silently runs something else. The mapping is `autospec.engines.vllm_engine.
  speculative_config_for`, the same one `--engine vllm` runs.
* `README.md` — the command lines and the notes.

When vLLM is installed, a supported config is validated by building vLLM's engine config from it
(`validate_speculative_config`); the result is recorded in the returned summary and README.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autospec.config import PairSpec
from autospec.errors import InputError
from autospec.strategy import PolicySection, StrategySpec, spec_to_toml

CONFIG_FILE = "vllm_speculative_config.json"
STRATEGY_FILE = "autospec_strategy.toml"


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


def vllm_config(spec: StrategySpec, pair: PairSpec, max_batch: int) -> dict[str, Any]:
    """{"supported": True, "config": {...}} or {"supported": False, "notes": [...]}."""
    from autospec.engines.vllm_engine import speculative_config_for

    form, rows = vllm_form(spec, max_batch)
    try:
        cfg = speculative_config_for(form, pair.target, pair.draft, rows)
    except InputError as exc:
        return {"supported": False, "notes": [exc.problem]}
    return {"supported": True, "config": cfg}


def write_deploy(deploy_dir: Path, spec: StrategySpec, pair: PairSpec, max_batch: int,
                 validate: bool = True, fallback: tuple[StrategySpec, str] | None = None) -> dict[str, Any]:
    """Write deploy/ for `spec`; returns what was written (for tune/summary.json and the report).

    `fallback` — (spec, why) of the best strategy vLLM *can* express — is offered inside the
    not-expressible file (under "fallback", with its own config) when `spec` itself is not."""
    from autospec.artifacts import write_text
    from autospec.engines.vllm_engine import validate_speculative_config, vllm_available

    result = vllm_config(spec, pair, max_batch)
    notes = list(result.get("notes", []))
    validated: bool | None = None
    if result["supported"] and validate and vllm_available():
        try:
            validate_speculative_config(result["config"], pair.target, max_num_seqs=max_batch)
            validated = True
        except InputError as exc:
            validated = False
            notes.append(exc.problem)
    write_text(deploy_dir / STRATEGY_FILE, spec_to_toml(spec))
    if result["supported"]:
        payload: dict[str, Any] = result["config"]
    else:
        payload = {"supported": False, "strategy": spec.name, "notes": notes}
        if fallback is not None:
            alt = vllm_config(fallback[0], pair, max_batch)
            if alt["supported"]:
                payload["fallback"] = {"strategy": fallback[0].name, "why": fallback[1],
                                       "speculative_config": alt["config"]}
                notes.append(f"best vLLM-expressible alternative: {fallback[0].name} ({fallback[1]}); its "
                             "config is under \"fallback\" in this file")
    # Exactly vLLM's JSON: no schema_version (vLLM rejects unknown keys), so not write_json.
    write_text(deploy_dir / CONFIG_FILE, json.dumps(payload, indent=2) + "\n")
    write_text(deploy_dir / "README.md", _readme(spec, pair, max_batch, result, validated, notes))
    return {"dir": str(deploy_dir), "strategy": spec.name, "vllm_supported": result["supported"],
            "vllm_validated": validated, "notes": notes, "files": [STRATEGY_FILE, CONFIG_FILE, "README.md"]}


def _readme(spec: StrategySpec, pair: PairSpec, max_batch: int, result: dict[str, Any], validated: bool | None,
            notes: list[str]) -> str:
    lines = [f"# Deploy: {spec.name}", "", spec.strategy.description, "",
             f"- autospec: `autospec evaluate --strategies {STRATEGY_FILE} ...` (torch or sim engine)"]
    if result["supported"]:
        cfg = json.dumps(result["config"])
        lines += [f"- vLLM: `vllm serve {pair.target} --max-num-seqs {max_batch} --speculative-config "
                  f"'{cfg}'`" if result["config"] else f"- vLLM: `vllm serve {pair.target}` (no speculative "
                  "decoding: the tuned strategy drafts nothing)"]
        lines.append("- validated against vLLM's engine config: "
                     + {True: "yes", False: "FAILED (see notes)", None: "no (vLLM not installed here)"}[validated])
    else:
        lines.append(f"- vLLM: **not expressible** — {CONFIG_FILE} says why; serve it with autospec's own "
                     "engine or pick the best vLLM-expressible strategy from tune/trials.parquet")
    if notes:
        lines += ["", "## Notes", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"
