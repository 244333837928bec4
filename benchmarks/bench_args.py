"""Argument checks the benchmark scripts share: bounded numbers as argparse types, and `run` to end a
script on bad input (an argparse error or an autospec InputError: a bad trace, format or preset) with one
`error:` line and exit code 2, as the autospec CLI does (docs/inputs.md)."""

from __future__ import annotations

import argparse
import math
import sys
from typing import Callable


def whole(low: int, high: int) -> Callable[[str], int]:
    """An argparse type: a whole number in [low, high] (a count of requests, repeats, a batch size...)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{value} is outside [{low}, {high}]")
        return value

    return parse


def between(low: float, high: float) -> Callable[[str], float]:
    """An argparse type: a finite number in (low, high]."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not (math.isfinite(value) and low < value <= high):
            raise argparse.ArgumentTypeError(f"{value} is outside ({low}, {high}]")
        return value

    return parse


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage dump replaced by one `error:` line (exit 2)."""

    def error(self, message: str):  # type: ignore[override]
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def run(main: Callable[[], None]) -> None:
    """Run a benchmark's main; an autospec InputError (a bad trace, format, preset or run directory) is one
    line and exit code 2."""
    from autospec.errors import InputError

    try:
        main()
    except InputError as exc:
        print(f"error: {exc.one_line()}", file=sys.stderr)
        raise SystemExit(2) from None
