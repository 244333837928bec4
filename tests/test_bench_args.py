"""benchmarks/bench_args.py: the bounded argparse types and one-line errors the benchmark scripts share,
and a script using them (trace_replay_speed.py) refusing bad flags with one `error:` line and exit 2 —
before it measures anything or writes its JSON."""

from __future__ import annotations

import argparse

import pytest

from autospec_testing import assert_bench_refuses
from benchmarks.bench_args import OneLineParser, between, whole


def test_whole_accepts_only_whole_numbers_inside_its_bounds():
    parse = whole(1, 10)
    assert parse("1") == 1 and parse("10") == 10
    for text, why in (("0", "outside [1, 10]"), ("11", "outside [1, 10]"), ("2.5", "not a whole number"),
                      ("nan", "not a whole number"), ("", "not a whole number")):
        with pytest.raises(argparse.ArgumentTypeError, match=why.replace("[", r"\[").replace("]", r"\]")):
            parse(text)


def test_between_is_open_below_closed_above_and_finite():
    parse = between(0.0, 1.0)
    assert parse("1") == 1.0 and parse("1e-9") == pytest.approx(1e-9)
    for text in ("0", "-0.5", "1.0001", "inf", "nan"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"outside \(0.0, 1.0\]"):
            parse(text)
    with pytest.raises(argparse.ArgumentTypeError, match="not a number"):
        parse("half")


def test_a_bad_flag_is_one_error_line_and_exit_2(capsys):
    ap = OneLineParser(prog="bench")
    ap.add_argument("--load", type=between(0.0, 1.0))
    with pytest.raises(SystemExit) as exc:
        ap.parse_args(["--load", "2"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: argument --load: 2.0 is outside (0.0, 1.0] (see bench --help)"]


@pytest.mark.parametrize("args, says", [
    (["--load", "0"], "argument --load: 0.0 is outside (0.0, 1.0]"),
    (["--max-batch", "1e9"], "argument --max-batch: '1e9' is not a whole number"),
    (["--trace", "."], "--trace . is not a file"),
])
def test_trace_replay_speed_refuses_bad_flags_without_writing(tmp_path, args, says):
    assert_bench_refuses("trace_replay_speed.py", args, says, tmp_path / "out.json")
