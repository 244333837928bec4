"""Reading user files into text and JSON records, with errors that name the file and line.

Every workload reader goes through here so that a missing file, a bad gzip stream, a non-UTF-8 byte
or a malformed JSON line produce the same kind of one-line `InputError`, whichever format it was.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any, Iterator

from autospec.errors import InputError, decode_utf8, existing_file, parse_json, read_bytes_file

_GZIP_MAGIC = b"\x1f\x8b"
_SNIFF_BYTES = 65536


def read_text(path: str | Path) -> str:
    """The whole file decoded as UTF-8 (a leading BOM is dropped; gzip data is decompressed).

    Raises InputError for a missing file, a directory, a corrupt gzip stream, a non-UTF-8 byte (naming
    the line it sits on) and a file with nothing but whitespace in it.
    """
    data = read_bytes_file(path)
    if data[:2] == _GZIP_MAGIC:  # trust the bytes, not the file name
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"not a valid gzip file ({exc})", path=path) from None
    text = decode_utf8(data, path)
    if not text.strip():
        raise InputError("file is empty", path=path)
    return text


def first_line(path: str | Path) -> str:
    """The first non-blank line, stripped, from at most the first 64 KiB (for telling formats apart).

    Decoding problems are left for the full read to report with their line; an empty file is an error.
    """
    path = existing_file(path)
    try:
        with open(path, "rb") as handle:
            head = handle.read(_SNIFF_BYTES)
        if head[:2] == _GZIP_MAGIC:
            with gzip.open(path, "rb") as handle:
                head = handle.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"cannot read file ({exc})", path=path) from None
    for line in head.decode("utf-8-sig", errors="replace").split("\n"):
        if line.strip():
            return line.strip()
    if len(head) < _SNIFF_BYTES:
        raise InputError("file is empty", path=path)
    return ""


def line_of(text: str, offset: int) -> int:
    """1-based line number of a character offset in `text`."""
    return text.count("\n", 0, offset) + 1


def iter_json_records(text: str, path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line, value) pairs from JSONL text, or from the elements of a top-level JSON array.

    A file whose first non-blank character is `[` is read as one JSON array (the ShareGPT layout);
    anything else is read as JSON Lines, skipping blank lines. Records are parsed lazily, so a caller
    that wants the first hundred prompts of a multi-gigabyte dump stops after a hundred.
    """
    start = len(text) - len(text.lstrip())
    if text[start:start + 1] == "[":
        yield from _array_elements(text, start, path)
        return
    for number, raw in enumerate(text.split("\n"), start=1):  # not splitlines(): U+2028 is legal inside JSON strings
        if not raw.strip():
            continue
        yield number, parse_json(raw, path=path, line=number)


def _array_elements(text: str, start: int, path: str | Path) -> Iterator[tuple[int, Any]]:
    """Walk a JSON array element by element so each element keeps the line it starts on."""
    decoder = json.JSONDecoder()
    pos = _skip_ws(text, start + 1)
    if text[pos:pos + 1] == "]":
        return
    while True:
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise InputError(f"not valid JSON ({exc.msg} at column {exc.colno})", path=path, line=exc.lineno) from None
        except RecursionError:
            raise InputError("not valid JSON: nested too deeply", path=path, line=line_of(text, pos)) from None
        yield line_of(text, pos), value
        pos = _skip_ws(text, end)
        sep = text[pos:pos + 1]
        if sep == "]":
            if text[pos + 1:].strip():
                raise InputError("not valid JSON (extra data after the closing ']')", path=path,
                                 line=line_of(text, _skip_ws(text, pos + 1)))
            return
        if sep != ",":
            raise InputError("not valid JSON (expected ',' or ']' between array elements)", path=path,
                             line=line_of(text, pos))
        pos = _skip_ws(text, pos + 1)


def _skip_ws(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos
