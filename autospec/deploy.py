"""Deployable configs for a chosen strategy: `deploy/` (written by `autospec tune`).

* `autospec_strategy.toml` — the strategy as a preset file: `autospec evaluate --strategies` and
  `autospec generate --strategy` take it as is. It is the strategy as the run evaluated it: the fit's
  values in every parameter the preset left to the fit (`autospec.strategy.apply_fit`; DSpark: the
  fitted calibrator with its parameters under `[verify.calibration]`, and the SPS(B) table), so the
  deployed policy computes what the evaluated one did without the run's fit/ — loading the file
  restores the calibrator (`DsparkParams.calibration`), and a later fit no longer replaces it (a
  preset's own values win). Without a fit such a policy is deployed uncalibrated, and the notes (and
  README) say so, as `evaluate` warns.
* `vllm_speculative_config.json` — when vLLM can express the strategy with its own config (no-SD,
  static K, a per-batch-size schedule), exactly the JSON vLLM's `--speculative-config` takes (method,
  draft model path, `num_speculative_tokens` and, for a per-batch-size schedule,
  `num_speculative_tokens_per_batch_size` as [first, last, K] rows); nothing else is in it, so
  `vllm serve TARGET --speculative-config "$(cat deploy/vllm_speculative_config.json)"` works.
  An online length policy (gp-lcb, smartspec) runs inside vLLM's engine core through autospec's
  scheduler, so its file holds the launch pieces: {"supported": true, "strategy": ...,
  "speculative_config": {...}, "scheduler_cls": ..., "additional_config": {...}, "async_scheduling":
  false, "notes": [...]} — vLLM's --speculative-config, --scheduler-cls, --additional-config and
  --no-async-scheduling (README.md spells the command out). Handed whole to --speculative-config it is
  refused by vLLM (unknown keys) rather than run as plain K = K_max. The policy's fitted latency model
  is the run directory's fit/models.json (DIR/fit next to DIR/deploy) unless the caller names one.
  When vLLM cannot express it (a per-request verify policy, a policy needing draft confidences or
  distributions, FASER execution knobs), the file says so instead: {"supported": false, "strategy":
  ..., "notes": [why]} — it must not start a deployment that silently runs something else. The
  mapping is `autospec.serving.vllm.speculative_config.speculative_config_for`, the same one
  `--engine vllm` runs.
* `README.md` — the command lines and the notes. When the run's profile timed vLLM's worker on Intel
  OpenMP (profile.json's `vllm_worker`, from an LD_PRELOAD the user set), the vLLM command carries that
  LD_PRELOAD, so the deployed engine drafts as the measured one did; when it timed several GNU OpenMP
  threads, a note says SD was priced that way (`openmp.sd_openmp_warning`).

When vLLM is installed, a supported config is validated by building vLLM's engine config from it
(`validate_speculative_config`); the result is recorded in the returned summary and README.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autospec.artifacts import write_text
from autospec.calibration import read_profile_meta
from autospec.config import PairSpec
from autospec.errors import InputError
from autospec.fit import FitResult, load_fit
from autospec.serving.vllm.engine import validate_speculative_config, vllm_available
from autospec.serving.vllm.online import ONLINE_KEY
from autospec.serving.vllm.openmp import sd_openmp_warning
from autospec.serving.vllm.speculative_config import launch_parts, speculative_config_for, vllm_form
from autospec.strategy import StrategySpec, apply_fit, calibration_flags, spec_to_toml, uncalibrated

CONFIG_FILE = "vllm_speculative_config.json"
STRATEGY_FILE = "autospec_strategy.toml"


def vllm_config(spec: StrategySpec, pair: PairSpec, max_batch: int, *, k_max: int | None = None,
                fit: Path | None = None) -> dict[str, Any]:
    """{"supported": True, "config": {...}} or {"supported": False, "notes": [...]}. `k_max` and `fit`
    (a run directory or fit/models.json) are what an online length policy runs with
    (`speculative_config_for`); the config then carries the online scheduler's settings."""
    form, rows = vllm_form(spec, max_batch)
    try:
        cfg = speculative_config_for(form, pair.target, pair.draft, rows, k_max=k_max, fit=fit)
    except InputError as exc:
        return {"supported": False, "notes": [exc.problem]}
    return {"supported": True, "config": cfg}


def run_fit(deploy_dir: Path) -> Path | None:
    """The fit of the run directory deploy/ sits in (DIR/fit/models.json next to DIR/deploy), if any."""
    path = Path(deploy_dir).parent / "fit" / "models.json"
    return path if path.is_file() else None


def run_worker(deploy_dir: Path) -> dict[str, Any] | None:
    """What the vLLM worker of the run's profile computed on (DIR/profile/profile.json's `vllm_worker`,
    next to DIR/deploy), if that profile was timed on vLLM and recorded it."""
    meta = read_profile_meta(Path(deploy_dir).parent)
    return meta.vllm_worker.model_dump() if meta is not None and meta.vllm_worker is not None else None


def launch_env(worker: dict[str, Any] | None) -> str:
    """The environment prefix of the vLLM command: the profile's LD_PRELOAD when its worker ran on Intel
    OpenMP (that is what the user preloaded; vLLM preloads GNU's by itself), else nothing."""
    if worker and worker.get("openmp") == "intel" and worker.get("ld_preload"):
        return f"LD_PRELOAD={worker['ld_preload']} "
    return ""


def online_payload(name: str, cfg: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The deploy file for an online strategy: vLLM's speculative config plus how to start the
    scheduler that runs the policy (module docstring)."""
    parts = launch_parts(cfg)
    return {"supported": True, "strategy": name, **parts, "notes": notes}


def write_deploy(deploy_dir: Path, spec: StrategySpec, pair: PairSpec, max_batch: int,
                 validate: bool = True, *, k_max: int | None = None, fit: Path | None = None) -> dict[str, Any]:
    """Write deploy/ for `spec`; returns what was written (for tune/summary.json and the report).

    `autospec tune` hands it the best configuration vLLM can run; a strategy vLLM cannot express gets
    the not-expressible file (module docstring). `k_max` and `fit` are what an online length policy
    (gp-lcb, smartspec) runs with; `fit` defaults to the run directory's fit/models.json (`run_fit`)
    and `k_max` to that fit's K_max. The fit's policy defaults (DSpark's calibrator and SPS table) are
    written into autospec_strategy.toml (module docstring); the returned "calibration" says how the
    deployed file runs a calibrated policy (None when the strategy has none)."""
    if fit is None:
        fit = run_fit(deploy_dir)
    fitted: FitResult | None = None
    no_fit = "no fit/models.json beside deploy/"
    if fit is not None:
        try:
            fitted = load_fit(fit)
        except InputError as exc:  # speculative_config_for reports it too, if the strategy needs the fit
            no_fit = f"its fit is unreadable: {exc.problem}"
    if k_max is None and fitted is not None:
        k_max = fitted.models.k_max
    policy_inputs = fitted.policy_inputs if fitted is not None else None
    # the strategy as evaluated: the fit's calibrator and SPS table baked in (module docstring)
    deployed = apply_fit(spec, policy_inputs)
    result = vllm_config(spec, pair, max_batch, k_max=k_max, fit=fit)
    notes = list(result.get("notes", []))
    raw = uncalibrated(deployed)
    if raw:
        notes.append(f"{spec.name} is deployed uncalibrated ({', '.join(raw)} ranks drafts by raw draft confidences: "
                     + (no_fit if fitted is None else "the fit gives no calibrator")
                     + "); `autospec fit DIR` makes one, and a deploy from that run carries it")
    validated: bool | None = None
    if result["supported"] and validate and vllm_available():
        try:
            validate_speculative_config(result["config"], pair.target, max_num_seqs=max_batch)
            validated = True
        except InputError as exc:
            validated = False
            notes.append(exc.problem)
    worker = run_worker(deploy_dir)
    openmp_note = sd_openmp_warning(worker) if worker and result["supported"] and result["config"] else None
    if openmp_note:
        notes.append(openmp_note)
    write_text(deploy_dir / STRATEGY_FILE, spec_to_toml(deployed))
    online = result["supported"] and ONLINE_KEY in result["config"]
    if online:
        notes.insert(0, "online length policy: vLLM runs it through --scheduler-cls and --additional-config "
                        "(README.md); autospec must be importable where vLLM runs, and the fitted latency "
                        "model named in additional_config must exist there")
        payload: dict[str, Any] = online_payload(spec.name, result["config"], notes)
    elif result["supported"]:
        payload = result["config"]
    else:
        payload = {"supported": False, "strategy": spec.name, "notes": notes}
    # Exactly vLLM's JSON: no schema_version (vLLM rejects unknown keys), so not write_json.
    write_text(deploy_dir / CONFIG_FILE, json.dumps(payload, indent=2) + "\n")
    write_text(deploy_dir / "README.md", _readme(spec, pair, max_batch, result, validated, notes, launch_env(worker)))
    return {"dir": str(deploy_dir), "strategy": spec.name, "vllm_supported": result["supported"],
            "vllm_validated": validated, "notes": notes, "files": [STRATEGY_FILE, CONFIG_FILE, "README.md"],
            # per policy that takes a calibrator (DSpark): how the deployed file runs it
            "calibration": calibration_flags([deployed], None).get(spec.name)}


def _readme(spec: StrategySpec, pair: PairSpec, max_batch: int, result: dict[str, Any], validated: bool | None,
            notes: list[str], env: str = "") -> str:
    lines = [f"# Deploy: {spec.name}", "", spec.strategy.description, "",
             f"- autospec: `autospec evaluate --strategies {STRATEGY_FILE} ...` (torch or sim engine)"]
    if result["supported"]:
        parts = launch_parts(result["config"])
        cfg = json.dumps(parts["speculative_config"])
        if "scheduler_cls" in parts:
            lines += [f"- vLLM: `{env}vllm serve {pair.target} --max-num-seqs {max_batch} --speculative-config '{cfg}' "
                      f"--scheduler-cls {parts['scheduler_cls']} --additional-config "
                      f"'{json.dumps(parts['additional_config'])}' --no-async-scheduling` (the length policy "
                      f"runs inside vLLM's engine core; {CONFIG_FILE} holds the same pieces: speculative_config, "
                      "scheduler_cls, additional_config, async_scheduling — for `vllm.LLM(...)` / "
                      "`EngineArgs(...)` keyword arguments)"]
        else:
            lines += [f"- vLLM: `{env}vllm serve {pair.target} --max-num-seqs {max_batch} --speculative-config "
                      f"'{cfg}'`" if result["config"] else f"- vLLM: `{env}vllm serve {pair.target}` (no speculative "
                      "decoding: the tuned strategy drafts nothing)"]
        lines.append("- validated against vLLM's engine config: "
                     + {True: "yes", False: "FAILED (see notes)", None: "no (vLLM not installed here)"}[validated])
    else:
        lines.append(f"- vLLM: **not expressible** — {CONFIG_FILE} says why; serve it with autospec's own "
                     "engine or pick the best vLLM-expressible strategy from tune/trials.parquet")
    if notes:
        lines += ["", "## Notes", *(f"- {n}" for n in notes)]
    return "\n".join(lines) + "\n"
