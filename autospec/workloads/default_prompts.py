"""The default prompt sets, one per domain, needing nothing outside the installed package.

* code — def/class headers with their docstrings, from the running interpreter's standard library:
  only the files the bundled pair held out from training (`autospec.workloads.stdlib_prompts`).
* chat — 48 everyday assistant requests in 8 categories, written for autospec
  (`data/chat_prompts.jsonl`).
* math — 48 multi-step arithmetic word problems with answers, written for autospec
  (`data/math_prompts.jsonl`).

The bundled pair is a Python code model, so chat and math are its out-of-domain traffic: their
acceptance is what a user's off-domain requests would see. `autospec profile`, `generate`, `run` and
every workload spec without `prompts` use these; `--dataset` / `--prompts` name others.
"""

from __future__ import annotations

from importlib import resources

from autospec.workloads.prompts import Prompt, load_prompts
from autospec.workloads.stdlib_prompts import stdlib_prompts

OWN_SETS = {"chat": "chat_prompts.jsonl", "math": "math_prompts.jsonl"}


def own_prompts(domain: str, limit: int | None = None) -> list[Prompt]:
    """One of the prompt sets the project wrote itself (package data)."""
    with resources.as_file(resources.files("autospec.workloads") / "data" / OWN_SETS[domain]) as path:
        return load_prompts(path, domain=domain, limit=limit)


def bundled_prompt_sets(limit: int | None = None) -> dict[str, list[Prompt]]:
    """The default domain prompt sets {"code", "chat", "math"}, each cut to its first `limit` prompts."""
    return {"code": stdlib_prompts(limit), **{domain: own_prompts(domain, limit) for domain in OWN_SETS}}

