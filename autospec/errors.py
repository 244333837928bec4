"""User-facing errors.

Anything a user can get wrong (a file, a flag, a config field) raises `InputError`; the CLI prints its
one-line message and exits with code 2, without a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["InputError"]


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
