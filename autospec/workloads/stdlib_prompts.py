"""The default code prompts: Python read from the running interpreter's standard library.

The bundled pair was trained on the standard library's source, so any Python has text in the pair's
own domain — but most of it is text the pair was trained on, and a prompt from there would measure
recall, not speculation. `training/train.py` (the repository's training tool) holds out the tail of its token stream for
validation; the files wholly inside that tail are listed in the model card (`corpus.held_out`, by
module path with each file's sha256). Only those files are read here, so no default prompt comes from
a training file: a prompt whose text also stands in a training file (a docstring one module copied from
another) is listed in the card (`shared_with_training`) and left out. tests/workloads/
test_default_prompts.py checks both against the training split.

A prompt is a natural cut of that source: a `def` or `class` header with its docstring, which the
model then continues into the body. Nothing is copied into the repository; the text is read at run
time from `sysconfig.get_paths()["stdlib"]`. A held-out file that is missing, or whose bytes differ
from the card's hash (another Python version), is skipped [chosen: a changed file may now share text
with training files of that version's layout; skipping keeps the guarantee exact]. What was read is
identified by `prompts.prompt_set_digest`, which manifests record.
"""

from __future__ import annotations

import ast
import hashlib
import json
import sysconfig
from functools import lru_cache
from itertools import chain, zip_longest
from pathlib import Path

from autospec.errors import InputError
from autospec.models import MODEL_CARD
from autospec.workloads.prompts import Prompt

MIN_DOCSTRING_CHARS = 40  # [chosen] a one-word docstring gives the model nothing to continue from
MAX_PROMPT_CHARS = 2_000  # [chosen] keeps a long class docstring from filling a small model's context


def held_out_modules(card_path: Path | None = None) -> tuple[list[dict], set[str]]:
    """The model card's held-out files [{module, path, sha256}] in training order, and the ids of the
    prompts cut from them whose text also stands in a training file (`shared_with_training`)."""
    card = json.loads((card_path or MODEL_CARD).read_text(encoding="utf-8"))
    try:
        held = card["corpus"]["held_out"]
        return list(held["files"]), set(held.get("shared_with_training", ()))
    except (KeyError, TypeError):
        raise InputError("the model card lists no held-out files (corpus.held_out); run `python -m "
                         "training.train held-out` (from a clone of the repository) on the training Python",
                         path=card_path or MODEL_CARD) from None


def definition_prompts(source: str, module: str) -> list[Prompt]:
    """Every def/class with a docstring, cut after the docstring's closing line, in source order."""
    lines = source.splitlines(keepends=True)
    prompts = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        doc = ast.get_docstring(node, clean=False)
        if not doc or len(doc.strip()) < MIN_DOCSTRING_CHARS:
            continue
        end = node.body[0].end_lineno  # the docstring expression's last line
        text = "".join(lines[node.lineno - 1: end])
        if len(text) > MAX_PROMPT_CHARS:
            continue
        prompts.append((node.lineno, Prompt(text, "code", f"stdlib:{module}:{node.lineno}:{node.name}")))
    return [p for _, p in sorted(prompts, key=lambda item: item[0])]


@lru_cache(maxsize=1)
def _all_stdlib_prompts() -> tuple[Prompt, ...]:
    root = Path(sysconfig.get_paths()["stdlib"])
    per_file = []
    files, shared = held_out_modules()
    for entry in files:
        path = root / entry["path"]
        try:
            data = path.read_bytes()
        except OSError:
            continue  # not in this Python's stdlib
        if hashlib.sha256(data).hexdigest() != entry["sha256"]:
            continue  # another version of the module
        prompts = definition_prompts(data.decode("utf-8"), entry["module"])
        per_file.append([p for p in prompts if p.source_id not in shared])
    # Interleave the files, so that the first N prompts (a quick profile's few) span many modules.
    return tuple(p for p in chain.from_iterable(zip_longest(*per_file)) if p is not None)


def stdlib_prompts(limit: int | None = None) -> list[Prompt]:
    """Code prompts from the held-out standard-library files (see the module docstring)."""
    prompts = list(_all_stdlib_prompts())
    if not prompts:
        raise InputError("no default code prompts: none of the standard-library files the bundled pair held out "
                         f"is present unchanged in this Python ({sysconfig.get_paths()['stdlib']}); "
                         "name prompts with --dataset/--prompts")
    return prompts[:limit] if limit is not None else prompts

