"""Prompt sets: the text a workload's requests carry, labelled by domain (code, chat, math, ...).

`load_prompts` reads any of the prompt files users bring and tells the layout apart by itself:

| layout | how it is recognised | prompt text | domain |
|---|---|---|---|
| Spec-Bench / MT-Bench questions (JSONL) | records with `turns` | first turn | chat |
| ShareGPT (JSON array or JSONL) | records with `conversations` | first human turn | chat |
| MBPP (JSONL, or the sanitized JSON array) | records with `test_list` | docstring: statement + 1st test | code |
| HumanEval (JSONL, optionally gzipped) | records with `task_id` | `prompt` | code |
| GSM8K (JSONL) | records with `question` | `question` | math |
| plain JSONL | records with `prompt` | `prompt` | the record's `domain`, else chat |
| token ids (JSONL) | records with `prompt_token_ids` | the ids, sent as given | the record's `domain`, else chat |
| plain text (`.txt`) | the file suffix | each non-empty line | chat |

The layout is decided by the first record; every later record must then carry that layout's fields,
so a broken line is reported as a missing field on that line rather than as an "unknown format".
`layout=` forces a layout by name (`autospec.workloads.datasets` does, for named datasets) and
`field=` reads the text from any field of plain records.

The default prompt sets (needing nothing outside the package) are in `autospec.workloads.default_prompts`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from autospec.errors import InputError
from autospec.workloads._io import iter_json_records, read_text

DEFAULT_DOMAIN = "chat"  # for prompts whose file says nothing about their domain
_JSON_SUFFIXES = {".json", ".jsonl", ".ndjson"}


@dataclass(frozen=True)
class Prompt:
    """One prompt: its text, its domain label and where it came from (`file#id` or `file:line`).

    `token_ids`, when set, are the prompt itself (the `random` dataset, `prompt_token_ids` records):
    encoders send them as they are instead of tokenizing `text`, which is then only a description.
    """

    text: str
    domain: str
    source_id: str
    token_ids: tuple[int, ...] | None = None


def load_prompts(path: str | Path, domain: str | None = None, limit: int | None = None, *,
                 layout: str | None = None, field: str | None = None) -> list[Prompt]:
    """Read a prompt file of any supported layout (see the module docstring), in file order.

    `domain`, when given, labels every prompt (overriding the layout's default and any per-record
    `domain`); `limit` keeps the first `limit` prompts and stops reading there. `layout` (a name in
    `LAYOUTS`) skips detection: every record must then carry that layout's fields; `field` reads plain
    records' text from that key instead of `prompt` (it implies the plain layout). Bad input — a missing,
    empty, non-UTF-8 or malformed file, a record without its text field, an unknown layout — raises
    `InputError` naming the file and line.
    """
    path = Path(path)
    if domain is not None and (not isinstance(domain, str) or not domain.strip()):
        raise InputError(f"domain must be a non-empty string, got {domain!r}", path=path, field="domain")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InputError(f"limit must be a positive integer, got {limit!r}", path=path, field="limit")

    forced = _forced_layout(layout, field, path)
    text = read_text(path)
    if _is_plain_text(path) and forced is None:
        prompts: Iterable[Prompt] = _text_prompts(text, path, domain)
    else:
        prompts = _json_prompts(text, path, domain, forced)
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


def _json_prompts(text: str, path: Path, domain: str | None, layout: "_Layout | None" = None) -> Iterator[Prompt]:
    suffixes = {s.lower() for s in path.suffixes}
    if not suffixes & _JSON_SUFFIXES and text.lstrip()[:1] not in ("{", "["):
        raise InputError(
            "unknown prompt file format: expected .txt (one prompt per line) or JSON/JSONL "
            "(MT-Bench, ShareGPT, HumanEval, GSM8K, or records with a 'prompt' field)", path=path)
    if _is_one_json_object(text):
        raise InputError("unknown prompt file format: one JSON object spread over several lines; expected JSON "
                         "Lines (one record per line) or a JSON array of records", path=path)
    yield from _record_prompts(iter_json_records(text, path), path, domain, layout)


def prompts_from_records(records: Iterable[tuple[int, Any]], path: str | Path, domain: str | None = None, *,
                         layout: str | None = None, field: str | None = None) -> Iterator[Prompt]:
    """Prompts from (line, record) pairs already parsed (e.g. rows of a Hugging Face dataset), exactly as
    `load_prompts` reads a file's; `path` names the source in errors and source ids."""
    path = Path(path)
    return _record_prompts(records, path, domain, _forced_layout(layout, field, path))


def _record_prompts(records: Iterable[tuple[int, Any]], path: Path, domain: str | None,
                    layout: "_Layout | None") -> Iterator[Prompt]:
    for line, record in records:
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
    except (json.JSONDecodeError, RecursionError):  # JSON Lines fail with "Extra data" after the first record
        return False


@dataclass(frozen=True)
class _Layout:
    """A recognised record layout: the key that marks it and how to pull one prompt out of a record."""

    name: str
    marker: str
    text_of: Callable[[dict[str, Any], Path, int], str | None]  # None: the record has no usable prompt
    id_key: str | None
    domain: str | None  # None: per record (`domain` field), else the default
    ids_of: Callable[[dict[str, Any], Path, int], tuple[int, ...]] | None = None  # the prompt as token ids

    def extract(self, record: dict[str, Any], path: Path, line: int, domain: str | None) -> Prompt | None:
        token_ids = self.ids_of(record, path, line) if self.ids_of else None
        text = self.text_of(record, path, line)
        if text is None:
            return None
        if domain is None:
            domain = self.domain or _record_domain(record, path, line)
        record_id = record.get(self.id_key) if self.id_key else None
        source_id = f"{path.name}#{record_id}" if record_id not in (None, "") else f"{path.name}:{line}"
        return Prompt(text, domain, source_id, token_ids)


def _required_text(record: dict[str, Any], key: str, path: Path, line: int) -> str:
    if key not in record:
        raise InputError(f"missing field '{key}'", path=path, line=line, field=key)
    value = record[key]
    if not isinstance(value, str):
        raise InputError(f"field '{key}' must be a string, got {type(value).__name__}", path=path, line=line, field=key)
    if not value.strip():
        raise InputError(f"field '{key}' is empty", path=path, line=line, field=key)
    return value


def _token_ids(record: dict[str, Any], path: Path, line: int) -> tuple[int, ...]:
    """A `prompt_token_ids` record's ids: a non-empty list of non-negative integers (the tokenizer's
    vocabulary is checked where they are encoded, `serving.factory.prompt_token_ids`)."""
    ids = record["prompt_token_ids"]
    if not isinstance(ids, list) or not ids:
        raise InputError("field 'prompt_token_ids' must be a non-empty list of token ids", path=path, line=line,
                         field="prompt_token_ids")
    bad = next((t for t in ids if isinstance(t, bool) or not isinstance(t, int) or t < 0), None)
    if bad is not None:
        raise InputError(f"field 'prompt_token_ids' holds {bad!r}, not a token id (an integer >= 0)", path=path,
                         line=line, field="prompt_token_ids")
    return tuple(ids)


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


def _mbpp_prompt(record: dict[str, Any], path: Path, line: int) -> str:
    """An MBPP problem as the usual code-completion prompt: a docstring holding the statement and the
    first test (the bigcode-evaluation-harness form), which tells the model the function's name and
    signature. [chosen] The original release's statement is `text`, the sanitized one's `prompt`."""
    statement = _required_text(record, "text" if "text" in record or "prompt" not in record else "prompt",
                               path, line)
    tests = record.get("test_list")
    if not isinstance(tests, list) or not tests or not isinstance(tests[0], str) or not tests[0].strip():
        raise InputError("field 'test_list' must be a non-empty list of strings", path=path, line=line,
                         field="test_list")
    return f'"""\n{statement.strip()}\n{tests[0].strip()}\n"""\n'


# Checked in order: HumanEval and sanitized MBPP records also have `prompt`, and MBPP records `task_id`,
# so `test_list` must win over `task_id`, and `task_id` over plain `prompt`.
_LAYOUTS = (
    _Layout("mt_bench", "turns", _first_turn, "question_id", "chat"),
    _Layout("sharegpt", "conversations", _first_human_turn, "id", "chat"),
    _Layout("mbpp", "test_list", _mbpp_prompt, "task_id", "code"),
    _Layout("humaneval", "task_id", lambda r, p, n: _required_text(r, "prompt", p, n), "task_id", "code"),
    _Layout("gsm8k", "question", lambda r, p, n: _required_text(r, "question", p, n), "id", "math"),
    _Layout("plain", "prompt", lambda r, p, n: _required_text(r, "prompt", p, n), "id", None),
    # A prompt given as the token ids to send (what a replay sends, exactly: text round-tripped through
    # the tokenizer can come back as other ids); its text is only a description
    _Layout("token_ids", "prompt_token_ids", lambda r, p, n: f"<{len(r['prompt_token_ids'])} token ids>", "id",
            None, _token_ids),
)


def _detect(record: dict[str, Any], path: Path, line: int) -> _Layout:
    for layout in _LAYOUTS:
        if layout.marker in record:
            return layout
    keys = ", ".join(sorted(map(str, record))[:8]) or "none"
    raise InputError(
        f"unknown prompt record format (keys: {keys}); expected one of 'turns' (MT-Bench), 'conversations' "
        "(ShareGPT), 'test_list' (MBPP), 'task_id' + 'prompt' (HumanEval), 'question' (GSM8K), 'prompt' or "
        "'prompt_token_ids'",
        path=path, line=line)


LAYOUTS = tuple(layout.name for layout in _LAYOUTS)


def _forced_layout(name: str | None, field: str | None, path: Path) -> _Layout | None:
    """The layout `load_prompts(layout=, field=)` asks for; None leaves it to detection."""
    if field is not None:
        if not isinstance(field, str) or not field.strip():
            raise InputError(f"field must be a non-empty string, got {field!r}", path=path, field="field")
        if name not in (None, "plain"):
            raise InputError(f"a text field only applies to plain records, not to layout '{name}'", path=path,
                             field="field")
        return _Layout("plain", field, lambda r, p, n: _required_text(r, field, p, n), "id", None)
    if name is None:
        return None
    for layout in _LAYOUTS:
        if layout.name == name:
            return layout
    raise InputError(f"unknown prompt layout {name!r}; expected one of {', '.join(LAYOUTS)}", path=path,
                     field="layout")


def prompt_set_digest(prompts: Sequence[Prompt]) -> dict[str, Any]:
    """What a manifest records of a prompt set: its size per domain and a sha256 over every prompt's id,
    domain and text (or token ids), in order — the same prompts on another machine give the same hash."""
    h = hashlib.sha256()
    domains: dict[str, int] = {}
    for p in prompts:
        content = p.text if p.token_ids is None else ",".join(map(str, p.token_ids))
        for part in (p.source_id, p.domain, content):
            h.update(part.encode("utf-8"))
            h.update(b"\0")
        domains[p.domain] = domains.get(p.domain, 0) + 1
    return {"prompts": len(prompts), "domains": domains, "sha256": h.hexdigest()}
