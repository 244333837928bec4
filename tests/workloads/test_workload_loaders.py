"""Trace loaders: the real Azure file, small fixtures for the other formats, and bad rows by property."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autospec.errors import InputError
from autospec.workloads.loaders import detect_format, load_azure, load_burstgpt, load_mooncake, load_trace
from autospec.workloads.servegen import load_servegen

from autospec_testing import SHARED_DATA

DATA_DIR = SHARED_DATA
AZURE = DATA_DIR / "azure_llm_2023_code.csv"
needs_azure = pytest.mark.skipif(not AZURE.is_file(), reason=f"{DATA_DIR} not present")
# database=None: no .hypothesis folder in the checkout; the examples are cheap to regenerate.
FAST = settings(max_examples=30, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def assert_one_line_error(exc: InputError, path: Path, line: int | None) -> None:
    message = str(exc)
    assert "\n" not in message
    assert path.name in message
    if line is not None:
        assert exc.line == line and f"{path.name}:{line}" in message


# --- real data --------------------------------------------------------------------------------

@needs_azure
def test_azure_code_trace_real_file():
    trace = load_trace(AZURE)
    assert len(trace) == 8819
    arrival = trace.column("arrival_s")
    assert arrival[0] == 0.0 and np.all(np.diff(arrival) >= 0)
    # 7 fractional digits: 18:17:03.9799600 → 18:17:04.0319600 is 52 ms
    assert arrival[1] == pytest.approx(0.052, abs=1e-9)
    assert 3400 < trace.duration_s < 3600
    assert set(trace.column("domain")) == {"code"}
    assert trace.column("prompt_len")[0] == 4808 and trace.column("output_len")[0] == 10
    assert trace.stats()["interarrival_cv"] > 5  # the trace's burstiness survives loading
    assert detect_format(AZURE) == "azure"


@needs_azure
def test_azure_domain_override():
    assert set(load_azure(AZURE, domain="chat").column("domain")) == {"chat"}


# --- fixtures for the other formats ----------------------------------------------------------

BURSTGPT_HEADER = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"


def test_burstgpt_fixture_drops_failed_requests(tmp_path):
    path = tmp_path / "BurstGPT_1.csv"
    path.write_text(BURSTGPT_HEADER +
                    "5,ChatGPT,472,18,490,Conversation log\n"
                    "45,ChatGPT,1087,0,1087,Conversation log\n"    # failed: no response
                    "118,GPT-4,417,276,693,API log\n", encoding="utf-8")
    trace = load_trace(path)
    assert detect_format(path) == "burstgpt"
    assert list(trace.column("arrival_s")) == [0.0, 113.0]
    assert list(trace.column("prompt_len")) == [472, 417]
    assert list(trace.column("output_len")) == [18, 276]


def test_mooncake_fixture_ms_to_seconds(tmp_path):
    path = tmp_path / "mooncake_trace.jsonl"
    rows = [{"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47]},
            {"timestamp": 30535, "input_length": 6472, "output_length": 26, "hash_ids": [46, 52]},
            {"timestamp": 30000, "input_length": 10, "output_length": 5, "hash_ids": []}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    trace = load_trace(path)
    assert detect_format(path) == "mooncake"
    assert list(trace.column("arrival_s")) == pytest.approx([0.0, 2.518, 3.053])
    assert list(trace.column("output_len")) == [52, 5, 26]


SERVEGEN_NATIVE = ("0,1.33,8.6,Weibull,0.375,0.397\n600,0,0,,0,0\n"
                   "1200,0.273,6.0,Weibull,0.495,3.38\n1800,0.15,4.07,Gamma,0.06,103.6\n")


def test_servegen_native_with_dataset(tmp_path):
    path = tmp_path / "chunk-7-trace.csv"
    path.write_text(SERVEGEN_NATIVE, encoding="utf-8")
    (tmp_path / "chunk-7-dataset.json").write_text(json.dumps(
        {"0": {"input_tokens": "{100: 0.5, 200: 0.5}", "output_tokens": "{10: 1.0}"},
         "1800": {"input_tokens": "{7: 1.0}", "output_tokens": "{3: 1.0}"}}), encoding="utf-8")
    trace = load_servegen(path, seed=3)
    assert detect_format(path) == "servegen"
    frame = trace.to_frame()
    window = (frame["arrival_s"] // 600).astype(int)
    counts = window.value_counts().to_dict()
    # ServeGen draws ceil(rate * 600) arrivals per window and keeps those inside it
    assert counts[0] in (798, 797) and 1 not in counts and counts[2] in (164, 163) and counts[3] in (90, 89)
    assert set(frame.loc[window < 3, "prompt_len"]) <= {100, 200} and set(frame.loc[window < 3, "output_len"]) == {10}
    assert set(frame.loc[window == 3, "prompt_len"]) == {7}
    assert load_servegen(path, seed=3) == trace
    assert load_servegen(path, seed=4) != trace


def test_servegen_folder_and_span(tmp_path):
    for client in (1, 2):
        (tmp_path / f"chunk-{client}-trace.csv").write_text(SERVEGEN_NATIVE, encoding="utf-8")
    trace = load_trace(tmp_path, seed=0, span=(1200, 1800))
    assert detect_format(tmp_path) == "servegen"
    arrival = trace.column("arrival_s")
    assert 2 * 160 < len(trace) <= 2 * 164 and arrival.min() >= 1200 and arrival.max() < 1800
    assert 400 < trace.column("prompt_len").mean() < 650  # lognormal with the default mean 512


def test_servegen_documented_header_layout(tmp_path):
    path = tmp_path / "windows.csv"
    path.write_text("client_id,window_start_s,window_s,rate,cv,dist,mean_input_tokens,mean_output_tokens\n"
                    "0,0,100,2.0,3.0,gamma,300,40\n"
                    "1,0,100,1.0,2.0,Weibull,100,20\n"
                    "1,100,100,0,0,,100,20\n", encoding="utf-8")
    trace = load_trace(path, seed=0)
    assert detect_format(path) == "servegen"
    assert 290 <= len(trace) <= 300 and trace.column("arrival_s").max() < 100


# --- bad input, by example --------------------------------------------------------------------

@pytest.mark.parametrize("loader, name, content, line, words", [
    (load_azure, "a.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:17:03.9799600,5\n", 1,
     "missing column 'GeneratedTokens'"),
    (load_azure, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,5,3\nyesterday,5,3\n", 3,
     "not a date-time"),
    (load_azure, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.97,5,3,9\n", 2,
     "malformed CSV"),
    (load_azure, "a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", None, "no data rows"),
    (load_burstgpt, "b.csv", BURSTGPT_HEADER + "1,ChatGPT,5,,5,x\n", 2, "missing value"),
    (load_burstgpt, "b.csv", BURSTGPT_HEADER + "1,ChatGPT,5,2.5,5,x\n", 2, "whole number"),
    (load_burstgpt, "b.csv", BURSTGPT_HEADER + "1,ChatGPT,5,3,8,x\n\n2,ChatGPT,inf,3,8,x\n", 4, "finite"),
    (load_mooncake, "m.jsonl", '{"timestamp": 1, "input_length": 3, "output_length": 2}\n{"timestamp": 2}\n', 2,
     "missing field 'input_length'"),
    (load_mooncake, "m.jsonl", '{"timestamp": 1, "input_length": true, "output_length": 2}\n', 1, "not a number"),
    (load_mooncake, "m.jsonl", '{"timestamp": 1, "input_length": NaN, "output_length": 2}\n', 1, "NaN"),
    (load_mooncake, "m.jsonl", '{"timestamp": 1, "input_length": 3, "output_length": 2}\n[1]\n', 2, "JSON object"),
    (load_servegen, "chunk-1-trace.csv", "0,1.0,2.0,Poisson,1,1\n", 1, "dist must be gamma or weibull"),
    (load_servegen, "chunk-1-trace.csv", "0,1.0,2.0,Gamma,1,1\n0,1.0,2.0,Gamma,1,1\n", 2, "must increase"),
    (load_servegen, "chunk-1-trace.csv", "0,1.0,2.0,,1,1\n", 1, "needs dist"),
    (load_servegen, "chunk-1-trace.csv", "0,1.0,2.0,Gamma,0,1\n", 1, "shape must be > 0"),
])
def test_bad_rows_raise_one_line_errors(tmp_path, loader, name, content, line, words):
    path = tmp_path / name
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as info:
        loader(path)
    assert words in str(info.value)
    assert_one_line_error(info.value, path, line)


def test_servegen_bad_dataset_json_names_the_field(tmp_path):
    path = tmp_path / "chunk-1-trace.csv"
    path.write_text("0,1.0,2.0,Gamma,0.25,1\n", encoding="utf-8")
    (tmp_path / "chunk-1-dataset.json").write_text('{"0": {"input_tokens": "__import__(\'os\')"}}', encoding="utf-8")
    with pytest.raises(InputError, match=r"\[0.input_tokens\]"):
        load_servegen(path)


def test_unknown_format(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(InputError, match="cannot tell the trace format"):
        load_trace(path)
    with pytest.raises(InputError, match="unknown trace format"):
        load_trace(path, "parquet")


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_azure(tmp_path / "nope.csv")


# --- bad input, by property -------------------------------------------------------------------
# Each CSV format: how to write a valid row, and which columns hold what kind of value.

CSV_FORMATS = {
    "azure": (load_azure, "TIMESTAMP,ContextTokens,GeneratedTokens",
              lambda i: [f"2023-11-16 18:{17 + i // 60:02d}:{i % 60:02d}.1234567", str(100 + i), str(1 + i)],
              {"TIMESTAMP": "time", "ContextTokens": "tokens", "GeneratedTokens": "tokens"}),
    "burstgpt": (load_burstgpt, BURSTGPT_HEADER.strip(),
                 lambda i: [str(i * 2), "ChatGPT", str(10 + i), str(1 + i), str(11 + 2 * i), "Conversation log"],
                 {"Timestamp": "seconds", "Request tokens": "tokens", "Response tokens": "tokens"}),
    "servegen": (load_servegen, "client_id,window_start_s,window_s,rate,cv,dist,mean_input_tokens,mean_output_tokens",
                 lambda i: ["0", str(i * 10), "10", "0.5", "1.5", "gamma", "50", "8"],
                 {"window_start_s": "seconds", "rate": "seconds", "cv": "seconds", "mean_input_tokens": "tokens"}),
}
CORRUPT = {
    "missing": lambda kind: "",
    "non_numeric": lambda kind: "abc",
    "negative": lambda kind: "-3",
    "nan": lambda kind: "NaN",
}


def write_csv(path: Path, header: str, rows: list[list[str]]) -> None:
    path.write_text(header + "\n" + "".join(",".join(r) + "\n" for r in rows), encoding="utf-8")


@FAST
@given(fmt=st.sampled_from(sorted(CSV_FORMATS)), n=st.integers(1, 15), data=st.data(),
       how=st.sampled_from(sorted(CORRUPT)))
def test_a_corrupt_value_is_reported_at_its_line(tmp_path, fmt, n, data, how):
    loader, header, row, kinds = CSV_FORMATS[fmt]
    rows = [row(i) for i in range(n)]
    bad_row = data.draw(st.integers(0, n - 1), label="bad_row")
    column = data.draw(st.sampled_from(sorted(kinds)), label="column")
    if kinds[column] == "time" and how == "negative":
        how = "non_numeric"  # "-3" is not a date-time either way; keep the case meaningful
    rows[bad_row][header.split(",").index(column)] = CORRUPT[how](kinds[column])
    path = tmp_path / f"{fmt}.csv"
    write_csv(path, header, rows)
    with pytest.raises(InputError) as info:
        loader(path)
    assert_one_line_error(info.value, path, line=bad_row + 2)
    assert info.value.field == column


@FAST
@given(fmt=st.sampled_from(sorted(CSV_FORMATS)), n=st.integers(1, 5), data=st.data())
def test_a_missing_column_is_reported_on_the_header_line(tmp_path, fmt, n, data):
    loader, header, row, kinds = CSV_FORMATS[fmt]
    names = header.split(",")
    drop = names.index(data.draw(st.sampled_from(sorted(kinds)), label="column"))
    path = tmp_path / f"{fmt}.csv"
    write_csv(path, ",".join(c for j, c in enumerate(names) if j != drop),
              [[v for j, v in enumerate(row(i)) if j != drop] for i in range(n)])
    with pytest.raises(InputError) as info:
        loader(path)
    assert_one_line_error(info.value, path, line=1)
    assert "missing column" in str(info.value)


@FAST
@given(fmt=st.sampled_from(sorted(CSV_FORMATS) + ["mooncake"]), n=st.integers(1, 10), data=st.data(),
       byte=st.sampled_from([b"\xff", b"\xe9", b"\x80", b"\xc3("]))
def test_a_non_utf8_byte_is_reported_at_its_line(tmp_path, fmt, n, data, byte):
    path = tmp_path / f"{fmt}.data"
    if fmt == "mooncake":
        lines = [json.dumps({"timestamp": i, "input_length": 5, "output_length": 3}).encode() for i in range(n)]
        loader, first = load_mooncake, 1
    else:
        loader, header, row, _ = CSV_FORMATS[fmt]
        lines = [header.encode()] + [",".join(row(i)).encode() for i in range(n)]
        first = 2
    bad = data.draw(st.integers(first - 1, len(lines) - 1), label="bad_line")
    lines[bad] = lines[bad][:3] + byte + lines[bad][3:]
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(InputError) as info:
        loader(path)
    assert_one_line_error(info.value, path, line=bad + 1)
    assert "UTF-8" in str(info.value)


@FAST
@given(n=st.integers(1, 10), data=st.data(),
       how=st.sampled_from(["missing", "string", "negative", "nan", "fraction", "malformed"]))
def test_mooncake_bad_record_is_reported_at_its_line(tmp_path, n, data, how):
    records = [{"timestamp": 1000 * i, "input_length": 5 + i, "output_length": 1 + i, "hash_ids": [i]}
               for i in range(n)]
    lines = [json.dumps(r) for r in records]
    bad = data.draw(st.integers(0, n - 1), label="bad")
    key = data.draw(st.sampled_from(["timestamp", "input_length", "output_length"]), label="key")
    record = dict(records[bad])
    if how == "missing":
        del record[key]
    elif how == "string":
        record[key] = "12"
    elif how == "negative":
        record[key] = -1
    elif how == "nan":
        record[key] = float("nan")
    elif how == "fraction":
        key = "output_length"
        record[key] = 2.5
    lines[bad] = json.dumps(record)[:-2] if how == "malformed" else json.dumps(record)
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_mooncake(path)
    assert_one_line_error(info.value, path, line=bad + 1)


@FAST
@given(fmt=st.sampled_from(["azure", "burstgpt", "mooncake", "servegen"]),
       content=st.sampled_from(["", "\n", "   \n\n  ", "\ufeff"]))
def test_empty_files_are_input_errors(tmp_path, fmt, content):
    path = tmp_path / f"empty-{fmt}.csv"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_trace(path, fmt)
    assert_one_line_error(info.value, path, line=None)
    assert "empty" in str(info.value)
