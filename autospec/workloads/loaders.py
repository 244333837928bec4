"""Request-trace files → Trace, for the formats production traces are published in.

* azure — CSV `TIMESTAMP,ContextTokens,GeneratedTokens` (Azure LLM inference 2023 and 2024).
  Arrival: date-time, e.g. `2023-11-16 18:17:03.9799600`. Tokens: ContextTokens / GeneratedTokens.
* burstgpt — CSV `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`.
  Arrival: seconds. Tokens: Request / Response tokens.
* mooncake — JSONL `{"timestamp": ms, "input_length", "output_length", "hash_ids"}` (Mooncake, vLLM
  timed traces). Arrival: milliseconds. Tokens: input_length / output_length.
* servegen — per-client window CSV (see `autospec.workloads.servegen`). Arrival: generated from each
  window's fit. Tokens: from the window's distributions.

Arrival times are re-based so the first request arrives at 0 (ServeGen keeps its windows' own clock,
so that windows line up across clients). Rows with zero output tokens are dropped: BurstGPT records
failed requests that way, and a request that generates nothing has no decoding to measure. Any other
bad row — a missing column or value, text where a number belongs, NaN, a negative or fractional token
count, an unparsable timestamp — raises InputError naming the file and line. Gzipped files (any name:
the bytes are checked) are read transparently.

Bundled traces ship as package data in `autospec/workloads/data/` and are named, wherever the naming
file lives, as `bundled:<name>` (`BUNDLED_TRACES`; `bundled_trace` gives the file):

* azure-code-2023 — azure_llm_2023_code.csv.gz: Azure LLM inference trace 2023, code: 1 h, 8,819
  requests (CC-BY-4.0, see data/ATTRIBUTION.txt).
"""

from __future__ import annotations

import warnings
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from autospec.errors import InputError
from autospec.workloads._io import first_line, iter_json_records, read_text
from autospec.workloads._table import MAX_TOKENS, read_table
from autospec.workloads.servegen import is_servegen_header, load_servegen
from autospec.workloads.trace import Trace

TRACE_FORMATS = ("azure", "burstgpt", "mooncake", "servegen")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")  # Model, Total tokens, Log Type unused
MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")
BUNDLED_PREFIX = "bundled:"
BUNDLED_TRACES = {"azure-code-2023": "azure_llm_2023_code.csv.gz"}  # name -> file in autospec/workloads/data/


def bundled_trace(name: str) -> Path:
    """The package-data file of a bundled trace (`name` with or without the `bundled:` prefix)."""
    name = name.removeprefix(BUNDLED_PREFIX)
    if name not in BUNDLED_TRACES:
        raise InputError(f"unknown bundled trace {name!r}; known: {', '.join(sorted(BUNDLED_TRACES))}",
                         field="trace")
    # A real file in both an installed wheel and an editable install (data/ sits inside autospec/ in the
    # checkout); the loaders need a filesystem path, and packages are never installed zipped here.
    return Path(str(resources.files("autospec.workloads") / "data" / BUNDLED_TRACES[name]))


def load_trace(path: str | Path, format: str | None = None, *, domain: str | None = None, seed: int = 0,
               span: tuple[float, float] | None = None) -> Trace:
    """Load a trace file in `format` (detected from the file when None); `bundled:<name>` names a bundled one.

    `domain` labels the requests (Azure defaults to "code" for a file whose name says code, every
    other format to "chat"). `seed` and `span` only matter for ServeGen, whose arrivals are drawn.
    """
    if isinstance(path, str) and path.startswith(BUNDLED_PREFIX):
        path = bundled_trace(path)
    path = Path(path)
    format = format or detect_format(path)
    if format == "azure":
        return load_azure(path, domain=domain)
    if format == "burstgpt":
        return load_burstgpt(path, domain=domain or "chat")
    if format == "mooncake":
        return load_mooncake(path, domain=domain or "chat")
    if format == "servegen":
        return load_servegen(path, seed=seed, domain=domain or "chat", span=span)
    raise InputError(f"unknown trace format {format!r}; expected one of {', '.join(TRACE_FORMATS)}",
                     path=path, field="format")


def detect_format(path: str | Path) -> str:
    """The trace format of a file, from its first line (a folder is a ServeGen client pool)."""
    path = Path(path)
    if path.is_dir():
        return "servegen"
    first = first_line(path)
    columns = {c.strip() for c in first.split(",")}
    if first.startswith("{"):
        return "mooncake"
    if set(AZURE_COLUMNS) <= columns:
        return "azure"
    if set(BURSTGPT_COLUMNS) <= columns:
        return "burstgpt"
    if is_servegen_header(first) or len(columns) == 6 and first.split(",")[0].strip().replace(".", "").isdigit():
        return "servegen"
    raise InputError("cannot tell the trace format from the first line; set format to one of "
                     f"{', '.join(TRACE_FORMATS)}", path=path, line=1)


def load_azure(path: str | Path, *, domain: str | None = None) -> Trace:
    """Azure LLM inference trace CSV (2023 and 2024 share the schema)."""
    path = Path(path)
    table = read_table(path, AZURE_COLUMNS)
    raw = table.text("TIMESTAMP")
    try:
        with warnings.catch_warnings():  # pandas warns (to stderr) before it refuses mixed offsets
            warnings.simplefilter("ignore")
            stamps = pd.to_datetime(raw, format="ISO8601", errors="coerce")
        if not pd.api.types.is_datetime64_any_dtype(stamps):  # objects: offsets differ between rows
            raise TypeError("mixed offsets")
    except (ValueError, TypeError, OverflowError):  # e.g. mixed UTC offsets: parse row by row
        stamps = _utc_stamps(table, raw)
    bad = stamps.isna().to_numpy()
    table.raise_first([(bad, lambda i: f"not a date-time: {raw.iloc[i]!r}")], "TIMESTAMP")
    seconds = (stamps - stamps.min()).dt.total_seconds().to_numpy()
    prompt = table.numbers("ContextTokens", whole=True)
    output = table.numbers("GeneratedTokens", whole=True)
    if domain is None:
        domain = "code" if "code" in path.name.lower() else "chat"
    return _trace(path, seconds, prompt, output, domain)


def load_burstgpt(path: str | Path, *, domain: str = "chat") -> Trace:
    """BurstGPT CSV: `Timestamp` in seconds, `Request tokens`, `Response tokens`."""
    path = Path(path)
    table = read_table(path, BURSTGPT_COLUMNS)
    seconds = table.numbers("Timestamp")
    prompt = table.numbers("Request tokens", whole=True)
    output = table.numbers("Response tokens", whole=True)
    return _trace(path, seconds - seconds.min(), prompt, output, domain)


def load_mooncake(path: str | Path, *, domain: str = "chat") -> Trace:
    """Mooncake / vLLM timed-trace JSONL: `timestamp` (ms), `input_length`, `output_length`."""
    path = Path(path)
    text = read_text(path)
    rows: list[tuple[float, float, float]] = []
    for line, record in iter_json_records(text, path):
        if not isinstance(record, dict):
            raise InputError(f"expected a JSON object, got {type(record).__name__}", path=path, line=line)
        rows.append(tuple(_json_number(record, key, path, line, whole=key != "timestamp")  # type: ignore[misc]
                          for key in MOONCAKE_FIELDS))
    values = np.array(rows, dtype=float)
    return _trace(path, (values[:, 0] - values[:, 0].min()) / 1000.0, values[:, 1], values[:, 2], domain)


def _json_number(record: dict, key: str, path: Path, line: int, *, whole: bool) -> float:
    if key not in record:
        raise InputError(f"missing field '{key}'", path=path, line=line, field=key)
    value = record[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InputError(f"not a number: {value!r}", path=path, line=line, field=key)
    if value != value:  # NaN (Python's json accepts the NaN literal)
        raise InputError("value is NaN", path=path, line=line, field=key)
    if value in (float("inf"), float("-inf")):
        raise InputError(f"value must be finite, got {value}", path=path, line=line, field=key)
    if value < 0:
        raise InputError(f"value must be >= 0, got {value}", path=path, line=line, field=key)
    if whole and value != int(value):
        raise InputError(f"must be a whole number of tokens, got {value}", path=path, line=line, field=key)
    if whole and value > MAX_TOKENS:
        raise InputError(f"{value:g} tokens is more than any model reads (at most {MAX_TOKENS:.0e})", path=path,
                         line=line, field=key)
    return float(value)


def _timestamp_or_nat(value: str):
    try:
        return pd.Timestamp(value) if value else pd.NaT
    except (ValueError, TypeError, OverflowError):
        return pd.NaT


def _utc_stamps(table, raw: pd.Series) -> pd.Series:
    """Time stamps with differing UTC offsets, each converted to UTC [chosen: normalise, not reject —
    the offsets say exactly when each request came]. Dropping the offsets instead (as this once did)
    silently misordered the arrivals. A file that mixes stamps with and without an offset cannot be
    ordered (which clock is the naive one?): that is an input error at the first row that differs."""
    parsed = [_timestamp_or_nat(v) for v in raw]
    known = [t for t in parsed if t is not pd.NaT]
    if known:
        aware = known[0].tzinfo is not None
        table.raise_first([(np.array([t is not pd.NaT and (t.tzinfo is not None) != aware for t in parsed]),
                            lambda i: "mixes time stamps with and without a UTC offset; give every row one "
                                      "or none")], "TIMESTAMP")
    return pd.Series([t.tz_convert("UTC").tz_localize(None) if t is not pd.NaT and t.tzinfo is not None else t
                      for t in parsed])


def _trace(path: Path, seconds: np.ndarray, prompt: np.ndarray, output: np.ndarray, domain: str) -> Trace:
    keep = output > 0  # failed requests (BurstGPT) and empty completions: nothing to decode
    if not keep.any():
        raise InputError("no requests with output tokens > 0", path=path)
    seconds, prompt, output = seconds[keep], prompt[keep], output[keep]
    return Trace.from_arrays(seconds - seconds.min(), prompt.astype(np.int64), output.astype(np.int64), domain,
                             name=path.name)
