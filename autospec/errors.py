"""User-facing errors.

Anything a user can get wrong (a file, a flag, a config field) raises `InputError`; the CLI prints its
one-line message and exits with code 2, without a traceback.
"""

from __future__ import annotations

from pathlib import Path


class InputError(Exception):
    """Bad user input: the message names the file (and line or field) and the problem."""

    def __init__(self, problem: str, *, path: str | Path | None = None, line: int | None = None,
                 field: str | None = None):
        self.problem = problem
        self.path = None if path is None else str(path)
        self.line = line
        self.field = field
        super().__init__(self.one_line())

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
