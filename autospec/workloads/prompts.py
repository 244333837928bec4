"""Prompt sets: the text a workload's requests carry, labelled by domain (code, chat, math, ...).

`load_prompts` reads any of the prompt files users bring and tells the layout apart by itself:

| layout | how it is recognised | prompt text | domain |
|---|---|---|---|
| Spec-Bench / MT-Bench questions (JSONL) | records with `turns` | first turn | chat |
| ShareGPT (JSON array or JSONL) | records with `conversations` | first human turn | chat |
| HumanEval (JSONL, optionally gzipped) | records with `task_id` | `prompt` | code |
| GSM8K (JSONL) | records with `question` | `question` | math |
| plain JSONL | records with `prompt` | `prompt` | the record's `domain`, else chat |
| plain text (`.txt`) | the file suffix | each non-empty line | chat |

The layout is decided by the first record; every later record must then carry that layout's fields,
so a broken line is reported as a missing field on that line rather than as an "unknown format".

`bundled_prompt_sets` loads the three default domain sets (HumanEval, MT-Bench, GSM8K) from the shared
data folder, which is found via `AUTOSPEC_DATA_DIR`, else `../shared/data` from the working directory,
else `../shared/data` next to the repository.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from autospec.errors import InputError
from autospec.workloads._io import iter_json_records, read_text

DEFAULT_DOMAIN = "chat"  # for prompts whose file says nothing about their domain
DATA_DIR_ENV = "AUTOSPEC_DATA_DIR"
BUNDLED_FILES: dict[str, str] = {
    "code": "humaneval.jsonl.gz",
    "chat": "mt_bench_questions.jsonl",
    "math": "gsm8k_test.jsonl",
}
_JSON_SUFFIXES = {".json", ".jsonl", ".ndjson"}


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, its domain label and where it came from (`file#id` or `file:line`)."""

    text: str
    domain: str
    source_id: str


def load_prompts(path: str | Path, domain: str | None = None, limit: int | None = None) -> list[Prompt]:
    """Read a prompt file of any supported layout (see the module docstring), in file order.

    `domain`, when given, labels every prompt (overriding the layout's default and any per-record
    `domain`); `limit` keeps the first `limit` prompts and stops reading there. Bad input — a missing,
    empty, non-UTF-8 or malformed file, a record without its text field, an unknown layout — raises
    `InputError` naming the file and line.
    """
    path = Path(path)
    if domain is not None and (not isinstance(domain, str) or not domain.strip()):
        raise InputError(f"domain must be a non-empty string, got {domain!r}", path=path, field="domain")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"limit must be a positive integer, got {limit!r}", path=path, field="limit")

    text = read_text(path)
    if _is_plain_text(path):
        prompts: Iterable[Prompt] = _text_prompts(text, path, domain)
    else:
        prompts = _json_prompts(text, path, domain)
    result = list(islice(prompts, limit))
    if not result:
        raise InputError("no prompts in file", path=path)
    return result


def _is_plain_text(path: Path) -> bool:
    """`.txt` (or `.txt.gz`) is plain text; JSON suffixes are JSON; anything else is sniffed later."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes and suffixes[-1] == ".gz":
        suffixes = suffixes[:-1]
    return bool(suffixes) and suffixes[-1] == ".txt"


def _text_prompts(text: str, path: Path, domain: str | None) -> Iterator[Prompt]:
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.rstrip("\r")
        if line.strip():
            yield Prompt(line, domain or DEFAULT_DOMAIN, f"{path.name}:{number}")


def _json_prompts(text: str, path: Path, domain: str | None) -> Iterator[Prompt]:
    suffixes = {s.lower() for s in path.suffixes}
    if not suffixes & _JSON_SUFFIXES and text.lstrip()[:1] not in ("{", "["):
        raise InputError(
            "unknown prompt file format: expected .txt (one prompt per line) or JSON/JSONL "
            "(MT-Bench, ShareGPT, HumanEval, GSM8K, or records with a 'prompt' field)", path=path)
    if _is_one_json_object(text):
        raise InputError("unknown prompt file format: one JSON object spread over several lines; expected JSON "
                         "Lines (one record per line) or a JSON array of records", path=path)
    layout: _Layout | None = None
    for line, record in iter_json_records(text, path):
        if not isinstance(record, dict):
            raise InputError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
        if layout is None:
            layout = _detect(record, path, line)
        prompt = layout.extract(record, path, line, domain)
        if prompt is not None:
            yield prompt


def _is_one_json_object(text: str) -> bool:
    """A pretty-printed JSON object (e.g. {"prompts": [...]}), which JSONL parsing would call malformed."""
    stripped = text.strip()
    if not stripped.startswith("{") or "\n" not in stripped:
        return False
    try:
        return isinstance(json.loads(stripped), dict)
    except json.JSONDecodeError:  # JSON Lines fail here with "Extra data" after the first record
        return False


@dataclass(frozen=True)
class _Layout:
    """A recognised record layout: the key that marks it and how to pull one prompt out of a record."""

    name: str
    marker: str
    text_of: Callable[[dict[str, Any], Path, int], str | None]  # None: the record has no usable prompt
    id_key: str | None
    domain: str | None  # None: per record (`domain` field), else the default

    def extract(self, record: dict[str, Any], path: Path, line: int, domain: str | None) -> Prompt | None:
        text = self.text_of(record, path, line)
        if text is None:
            return None
        if domain is None:
            domain = self.domain or _record_domain(record, path, line)
        record_id = record.get(self.id_key) if self.id_key else None
        source_id = f"{path.name}#{record_id}" if record_id not in (None, "") else f"{path.name}:{line}"
        return Prompt(text, domain, source_id)


def _required_text(record: dict[str, Any], key: str, path: Path, line: int) -> str:
    if key not in record:
        raise InputError(f"missing field '{key}'", path=path, line=line, field=key)
    value = record[key]
    if not isinstance(value, str):
        raise InputError(f"field '{key}' must be a string, got {type(value).__name__}", path=path, line=line, field=key)
    if not value.strip():
        raise InputError(f"field '{key}' is empty", path=path, line=line, field=key)
    return value


def _first_turn(record: dict[str, Any], path: Path, line: int) -> str:
    turns = record.get("turns")
    if "turns" not in record:
        raise InputError("missing field 'turns'", path=path, line=line, field="turns")
    if not isinstance(turns, list) or not turns:
        raise InputError("field 'turns' must be a non-empty list of strings", path=path, line=line, field="turns")
    return _required_text({"turns[0]": turns[0]}, "turns[0]", path, line)


def _first_human_turn(record: dict[str, Any], path: Path, line: int) -> str | None:
    """The first human turn of a ShareGPT conversation; None when it has none.

    Real ShareGPT dumps hold conversations that are empty or open with the assistant; they carry no
    prompt, so they are skipped rather than treated as errors. Both `{from, value}` and OpenAI-style
    `{role, content}` turns are accepted.
    """
    if "conversations" not in record:
        raise InputError("missing field 'conversations'", path=path, line=line, field="conversations")
    turns = record["conversations"]
    if not isinstance(turns, list):
        raise InputError("field 'conversations' must be a list of turns", path=path, line=line, field="conversations")
    for turn in turns:
        if not isinstance(turn, dict):
            raise InputError("each conversation turn must be a JSON object", path=path, line=line,
                             field="conversations")
        speaker = turn.get("from", turn.get("role"))
        if speaker in ("human", "user"):
            text = turn.get("value", turn.get("content"))
            if isinstance(text, str) and text.strip():
                return text
            return None
    return None


def _record_domain(record: dict[str, Any], path: Path, line: int) -> str:
    if "domain" not in record:
        return DEFAULT_DOMAIN
    value = record["domain"]
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"field 'domain' must be a non-empty string, got {value!r}", path=path, line=line,
                         field="domain")
    return value


# Checked in order: HumanEval records also have `prompt`, so `task_id` must win over plain `prompt`.
_LAYOUTS = (
    _Layout("mt_bench", "turns", _first_turn, "question_id", "chat"),
    _Layout("sharegpt", "conversations", _first_human_turn, "id", "chat"),
    _Layout("humaneval", "task_id", lambda r, p, n: _required_text(r, "prompt", p, n), "task_id", "code"),
    _Layout("gsm8k", "question", lambda r, p, n: _required_text(r, "question", p, n), "id", "math"),
    _Layout("plain", "prompt", lambda r, p, n: _required_text(r, "prompt", p, n), "id", None),
)


def _detect(record: dict[str, Any], path: Path, line: int) -> _Layout:
    for layout in _LAYOUTS:
        if layout.marker in record:
            return layout
    keys = ", ".join(sorted(map(str, record))[:8]) or "none"
    raise InputError(
        f"unknown prompt record format (keys: {keys}); expected one of 'turns' (MT-Bench), 'conversations' "
        "(ShareGPT), 'task_id' + 'prompt' (HumanEval), 'question' (GSM8K) or 'prompt'", path=path, line=line)


# --- the bundled default prompt sets -------------------------------------------------------------

def data_dir_candidates() -> list[Path]:
    """Where the shared data folder is looked for, in order (the env var alone when it is set)."""
    override = os.environ.get(DATA_DIR_ENV)
    if override:
        return [Path(override)]
    repo = Path(__file__).resolve().parents[2]
    candidates = [Path.cwd() / ".." / "shared" / "data", repo / ".." / "shared" / "data"]
    unique: list[Path] = []
    for c in candidates:
        if c.resolve() not in {u.resolve() for u in unique}:
            unique.append(c)
    return unique


def bundled_prompt_paths() -> dict[str, Path]:
    """Domain → file of the default prompt sets, from the first folder that holds all of them."""
    candidates = data_dir_candidates()
    for folder in candidates:
        paths = {domain: folder / name for domain, name in BUNDLED_FILES.items()}
        if all(p.is_file() for p in paths.values()):
            return {domain: p.resolve() for domain, p in paths.items()}
    looked = ", ".join(str(c.resolve()) for c in candidates)
    needed = ", ".join(BUNDLED_FILES.values())
    raise InputError(f"default prompt sets not found: looked in {looked} for {needed}; "
                     f"set {DATA_DIR_ENV} to the folder that holds them or name prompt files explicitly")


def bundled_prompt_sets(limit: int | None = None) -> dict[str, list[Prompt]]:
    """The default domain prompt sets: {"code": HumanEval, "chat": MT-Bench, "math": GSM8K}."""
    return {domain: load_prompts(path, domain=domain, limit=limit) for domain, path in bundled_prompt_paths().items()}
