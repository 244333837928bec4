"""User-facing errors.

Anything a user can get wrong (a file, a flag, a config field) raises `InputError`; the CLI prints its
one-line message and exits with code 2, without a traceback.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

__all__ = ["InputError", "Interrupted", "decode_utf8", "existing_file", "parse_json", "parse_toml", "read_bytes_file",
           "read_text_file"]


class InputError(Exception):
    """Bad user input: the message names the file (and line or field) and the problem."""

    def __init__(self, problem: str, *, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None):
        self.problem = problem
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        super().__init__(self.one_line())

    @classmethod
    def from_validation(cls, err: Any, path: str | Path | None = None, *, prefix: str | None = None) -> "InputError":
        """A pydantic ValidationError as one line: its first problem's field (the dotted location,
        under `prefix` when given, e.g. "workload") and message, plus how many more problems there are.

        A validator that raised an error carrying its own `field` (a cross-field problem naming the
        field to blame, e.g. strategy.SpecFieldError) names that field and its `problem`; a ValueError
        from a validator reads as its text (pydantic's "Value error, " dropped); a key the model does
        not know reads "unknown key". `err` is duck-typed (anything with pydantic's `errors()`), so
        this module stays free of pydantic."""
        errors = err.errors()
        first = errors[0]
        cause = (first.get("ctx") or {}).get("error")
        if isinstance(cause, Exception) and getattr(cause, "field", None):
            field, problem = str(cause.field), str(getattr(cause, "problem", None) or cause)
        else:
            field = ".".join(str(part) for part in first["loc"])
            if first["type"] == "extra_forbidden":
                problem = "unknown key"
            elif first["type"] == "value_error" and isinstance(cause, Exception):
                problem = str(cause)
            else:
                problem = first["msg"]
        if prefix:
            field = f"{prefix}.{field}" if field else prefix
        more = len(errors) - 1
        if more:
            problem += f" (and {more} more problem{'s' if more > 1 else ''})"
        return cls(problem, path=path, field=field or None)

    def one_line(self) -> str:
        where = ""
        if self.path is not None:
            where = self.path
            if self.line is not None:
                where += f":{self.line}"
        if self.field is not None:
            where = f"{where} [{self.field}]" if where else f"[{self.field}]"
        text = f"{where}: {self.problem}" if where else self.problem
        return " ".join(text.split())  # always one line


class Interrupted(Exception):
    """The user stopped a command (Ctrl-C) where it can say what it kept and how to go on; the CLI prints
    the message on one line and exits with 130 (128 + SIGINT), as a shell does for an interrupted job."""


def parse_json(text: str, *, path: str | Path | None = None, line: int | None = None) -> Any:
    """json.loads with its failures as InputError: malformed JSON (with its line, offset by `line` when
    the text is one line of a file), and nesting too deep for the parser — JSON nested a hundred
    thousand deep makes Python's decoder raise RecursionError, which no reader should see."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        at = exc.lineno if line is None else line + exc.lineno - 1
        raise InputError(f"not valid JSON ({exc.msg} at column {exc.colno})", path=path, line=at) from None
    except RecursionError:
        raise InputError("not valid JSON: nested too deeply", path=path, line=line) from None


def parse_toml(text: str, *, path: str | Path | None = None) -> dict[str, Any]:
    """tomllib.loads with its failures as InputError: a syntax error with its line, and arrays or inline
    tables nested too deep for the parser (RecursionError)."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        match = re.search(r"line (\d+)", str(exc))
        raise InputError(f"invalid TOML ({exc})", path=path, line=int(match.group(1)) if match else None) from None
    except RecursionError:
        raise InputError("invalid TOML: nested too deeply", path=path) from None


def existing_file(path: str | Path, what: str = "file") -> Path:
    """`path` as a regular file: InputError for a missing path, a directory, or a pipe or device (whose
    read would block for ever or never end), and for a name the OS refuses (too long)."""
    path = Path(path)
    try:
        if not path.exists():
            raise InputError(f"{what} not found", path=path)
        if path.is_dir():
            raise InputError(f"{what} is a directory, expected a file", path=path)
        if not path.is_file():
            raise InputError(f"{what} is not a regular file (a pipe or a device); save the data to a file", path=path)
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", path=str(path)[:200]) from None
    return path


def read_bytes_file(path: str | Path, what: str = "file") -> bytes:
    """The bytes of a regular file (see existing_file), an unreadable one an InputError."""
    path = existing_file(path, what)
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read {what}: {exc.strerror or exc}", path=path) from None


def decode_utf8(data: bytes, path: str | Path, what: str = "file") -> str:
    """`data` as UTF-8 (a leading BOM dropped); a byte that is not UTF-8 is an InputError with its line."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(f"{what} is not UTF-8 text (byte 0x{data[exc.start]:02x}); re-save it as UTF-8",
                         path=path, line=data.count(b"\n", 0, exc.start) + 1) from None


def read_text_file(path: str | Path, what: str = "file") -> str:
    """A small text file the user names (a config, a preset) as UTF-8 (see read_bytes_file, decode_utf8)."""
    return decode_utf8(read_bytes_file(path, what), path, what)
