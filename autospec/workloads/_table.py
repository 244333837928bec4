"""CSV tables with row-level errors: pandas parses, and every bad value is reported with its line.

pandas alone reports a bad value as a NaN somewhere in a column; users need "trace.csv:1234 [Request
tokens]: not a number: 'abc'". So the CSV is read as text columns, with the DataFrame index kept as
the physical line number, and each column is converted and checked here. When several rows are bad
the first line in the file is reported, whichever column it is in.
"""

from __future__ import annotations

import io
import re
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from autospec.errors import InputError
from autospec.workloads._io import read_text

_NAN_WORDS = {"nan", "+nan", "-nan"}
# [chosen] the most tokens a trace may give one request's prompt or output: no model reads a billion, and
# past 2^63 the int64 arrays every workload holds overflow (a row of 1e30 did)
MAX_TOKENS = 10**9


def first_flagged(checks: Sequence[tuple[Any, Any]]) -> tuple[int, str] | None:
    """The earliest row any (mask, message) check flags, with its message, or None. `message` is a text
    or a function of the row (for messages that quote the row's value)."""
    first: tuple[int, Any] | None = None
    for mask, message in checks:
        hits = np.flatnonzero(np.asarray(mask, bool))
        if len(hits) and (first is None or hits[0] < first[0]):
            first = (int(hits[0]), message)
    if first is None:
        return None
    row, message = first
    return row, (message(row) if callable(message) else message)


class Table:
    """A CSV file's rows as text, with `lines[i]` the file line of row `i`."""

    def __init__(self, path: Path, frame: pd.DataFrame, lines: np.ndarray):
        self.path = path
        self.frame = frame
        self.lines = lines

    def __len__(self) -> int:
        return len(self.frame)

    def error(self, problem: str, row: int, column: str | None = None) -> InputError:
        return InputError(problem, path=self.path, line=int(self.lines[row]), field=column)

    def text(self, column: str) -> pd.Series:
        return self.frame[column].str.strip()

    def numbers(self, column: str, *, whole: bool = False, minimum: float | None = 0.0) -> np.ndarray:
        """Column as floats; every value must be present, numeric, finite (and whole, and >= minimum); a
        whole number (a token count) at most MAX_TOKENS."""
        raw = self.text(column)
        values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=float)
        missing = (raw == "").to_numpy()
        nan_word = raw.str.lower().isin(_NAN_WORDS).to_numpy()
        not_number = np.isnan(values) & ~missing & ~nan_word
        infinite = np.isinf(values)
        finite = np.isfinite(values)
        below = finite & (values < minimum) if minimum is not None else np.zeros(len(values), bool)
        fractional = finite & (values != np.round(values)) if whole else np.zeros(len(values), bool)
        huge = finite & (values > MAX_TOKENS) if whole else np.zeros(len(values), bool)
        self.raise_first([
            (missing, lambda i: "missing value"),
            (not_number, lambda i: f"not a number: {raw.iloc[i]!r}"),
            (nan_word, lambda i: "value is NaN"),
            (infinite, lambda i: f"value must be finite, got {raw.iloc[i]!r}"),
            (below, lambda i: f"value must be >= {minimum:g}, got {raw.iloc[i]}"),
            (fractional, lambda i: f"must be a whole number of tokens, got {raw.iloc[i]}"),
            (huge, lambda i: f"{raw.iloc[i]} tokens is more than any model reads (at most {MAX_TOKENS:.0e})"),
        ], column)
        return values

    def raise_first(self, checks: Sequence[tuple[np.ndarray, object]], column: str | None = None) -> None:
        """Raise for the earliest row flagged by any (mask, message-for-row) check; do nothing if none is."""
        flagged = first_flagged(checks)
        if flagged is not None:
            raise self.error(flagged[1], flagged[0], column)

def read_table(path: str | Path, required: Sequence[str], *, header: bool = True,
               names: Sequence[str] | None = None) -> Table:
    """Read a CSV whose columns include `required`; blank lines are skipped but keep the numbering.

    With `header=False`, `names` names the columns of a headerless file (every row must have them all).
    Raises InputError for an unreadable file, a row with too many fields, a missing column (line 1),
    or a table with no data rows.
    """
    path = Path(path)
    text = read_text(path)
    try:
        # header=None even for files with a header: the first line then fixes the field count, so a
        # row with extra fields is a ParserError naming its line instead of being silently re-aligned.
        frame = pd.read_csv(io.StringIO(text), dtype=str, keep_default_na=False, skip_blank_lines=False,
                            header=None)
    except pd.errors.ParserError as exc:
        match = re.search(r"line (\d+)", str(exc))
        line = int(match.group(1)) if match else None
        detail = re.sub(r"^.*C error: ", "", str(exc)).strip()
        raise InputError(f"malformed CSV row ({detail})", path=path, line=line) from None
    except (pd.errors.EmptyDataError, ValueError) as exc:
        raise InputError(f"cannot parse as CSV ({exc})", path=path) from None
    lines = np.arange(len(frame)) + 1
    frame = frame.fillna("")
    if header:
        frame.columns = [str(c).strip() for c in frame.iloc[0]]
        seen: set[str] = set()
        for name in frame.columns:  # a repeated name makes frame[name] a table, not a column
            if name in seen and name:
                raise InputError(f"column {name!r} appears twice in the header", path=path, line=1, field=name)
            seen.add(name)
        frame, lines = frame.iloc[1:].reset_index(drop=True), lines[1:]
        missing = [c for c in required if c not in frame.columns]
        if missing:
            found = ", ".join(frame.columns)
            raise InputError(f"missing column {missing[0]!r} (found: {found})", path=path, line=1, field=missing[0])
    else:
        if frame.shape[1] > len(names or []):
            raise InputError(f"malformed CSV row (expected {len(names or [])} fields, saw {frame.shape[1]})",
                             path=path, line=1)
        frame = frame.reindex(columns=range(len(names or [])), fill_value="")
        frame.columns = list(names or [])
    blank = (frame.apply(lambda col: col.str.strip()) == "").all(axis=1).to_numpy()
    frame, lines = frame[~blank].reset_index(drop=True), lines[~blank]
    if frame.empty:
        raise InputError("no data rows", path=path)
    return Table(path, frame, lines)
