"""Prompt files: every supported layout, the bundled sets, and one-line errors for bad input."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autospec.errors import InputError
from autospec.workloads.prompts import Prompt, load_prompts

from autospec_testing import SHARED_DATA

DATA_DIR = SHARED_DATA
BUNDLED = ("humaneval.jsonl.gz", "mt_bench_questions.jsonl", "gsm8k_test.jsonl")
needs_data = pytest.mark.skipif(not all((DATA_DIR / name).is_file() for name in BUNDLED),
                                reason=f"{DATA_DIR} not present")


def write_jsonl(path: Path, records: list) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    return path


def assert_one_line_error(exc: InputError, path: Path, line: int | None = None) -> None:
    message = str(exc)
    assert "\n" not in message
    assert path.name in message
    if line is not None:
        assert f":{line}" in message and exc.line == line


# --- the real files ---------------------------------------------------------------------------

@needs_data
def test_humaneval_gz_is_code_with_task_ids():
    prompts = load_prompts(DATA_DIR / "humaneval.jsonl.gz")
    assert len(prompts) == 164
    assert {p.domain for p in prompts} == {"code"}
    assert prompts[0].source_id == "humaneval.jsonl.gz#HumanEval/0"
    assert prompts[0].text.startswith("from typing import List")


@needs_data
def test_mt_bench_takes_the_first_turn_as_chat():
    prompts = load_prompts(DATA_DIR / "mt_bench_questions.jsonl")
    assert len(prompts) == 80
    assert {p.domain for p in prompts} == {"chat"}
    first = json.loads((DATA_DIR / "mt_bench_questions.jsonl").read_text(encoding="utf-8").splitlines()[0])
    assert prompts[0].text == first["turns"][0]
    assert prompts[0].source_id == f"mt_bench_questions.jsonl#{first['question_id']}"


@needs_data
def test_gsm8k_is_math_with_line_ids_and_limit():
    prompts = load_prompts(DATA_DIR / "gsm8k_test.jsonl", limit=5)
    assert len(prompts) == 5
    assert {p.domain for p in prompts} == {"math"}
    assert [p.source_id for p in prompts] == [f"gsm8k_test.jsonl:{i}" for i in range(1, 6)]
    assert len(load_prompts(DATA_DIR / "gsm8k_test.jsonl")) == 1319


# --- the other layouts ------------------------------------------------------------------------

def test_sharegpt_array_first_human_turn_and_skips_empty(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps([
        {"id": "a1", "conversations": [{"from": "human", "value": "hello there"}, {"from": "gpt", "value": "hi"}]},
        {"id": "a2", "conversations": []},
        {"id": "a3", "conversations": [{"from": "system", "value": "be nice"}, {"from": "human", "value": "q2"}]},
        {"id": "a4", "conversations": [{"role": "user", "content": "openai style"}]},
    ], indent=1), encoding="utf-8")
    prompts = load_prompts(path)
    assert prompts == [Prompt("hello there", "chat", "sharegpt.json#a1"), Prompt("q2", "chat", "sharegpt.json#a3"),
                       Prompt("openai style", "chat", "sharegpt.json#a4")]
    assert len(load_prompts(path, limit=2)) == 2


def test_sharegpt_array_error_names_the_elements_line(tmp_path):
    path = tmp_path / "sharegpt.json"
    path.write_text('[\n {"id": "a", "conversations": [{"from": "human", "value": "x"}]},\n'
                    ' {"id": "b", "conversations": 7}\n]\n', encoding="utf-8")
    with pytest.raises(InputError) as info:
        load_prompts(path)
    assert_one_line_error(info.value, path, line=3)


def test_plain_jsonl_domains_and_override(tmp_path):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a", "domain": "code"}, {"prompt": "b"}])
    assert [p.domain for p in load_prompts(path)] == ["code", "chat"]
    assert [p.domain for p in load_prompts(path, domain="math")] == ["math", "math"]


def test_token_id_records_are_sent_as_given(tmp_path):
    """A prompt given as ids (what a replay sends) reaches the engine as those ids, untokenized."""
    from autospec.serving.factory import encode_prompts

    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt_token_ids": [5, 0, 7], "domain": "code", "id": "r1"},
                                              {"prompt_token_ids": [9]}])
    prompts = load_prompts(path)
    assert [(p.token_ids, p.domain, p.source_id) for p in prompts] == [((5, 0, 7), "code", "p.jsonl#r1"),
                                                                        ((9,), "chat", "p.jsonl:2")]

    class NoTokenizer:  # ids never go through the tokenizer; only the vocabulary size is read
        def __len__(self):
            return 10

        def encode(self, text, **kwargs):
            raise AssertionError("token ids must not be re-tokenized")

    assert encode_prompts(NoTokenizer(), prompts) == [[5, 0, 7], [9]]
    with pytest.raises(InputError, match="outside the tokenizer's vocabulary of 8"):
        encode_prompts(type("Small", (NoTokenizer,), {"__len__": lambda self: 8})(), prompts)


def test_plain_text_one_prompt_per_nonempty_line(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("first\n\n  \nsecond line\r\n", encoding="utf-8")
    prompts = load_prompts(path, domain="code")
    assert prompts == [Prompt("first", "code", "p.txt:1"), Prompt("second line", "code", "p.txt:4")]


def test_gzipped_jsonl_by_content(tmp_path):
    path = tmp_path / "p.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"task_id": "T/1", "prompt": "def f():"}\n'))
    assert load_prompts(path) == [Prompt("def f():", "code", "p.jsonl.gz#T/1")]


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("content, line, words", [
    (b"", None, "empty"),
    (b"  \n\n", None, "empty"),
    (b'{"prompt": "a"}\n{"prompt": "b"\n', 2, "not valid JSON"),
    (b'{"task_id": "x", "prompt": "a"}\n\n{"task_id": "y"}\n', 3, "missing field 'prompt'"),
    (b'{"question": "a"}\n{"question": 3}\n', 2, "must be a string"),
    (b'{"turns": []}\n', 1, "non-empty list"),
    (b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n', 2, "UTF-8"),
    (b'{"foo": 1, "bar": 2}\n', 1, "unknown prompt record format"),
    (b'[1, 2]\n', 1, "expected a JSON object"),
    (b'{"prompt": "a", "domain": ""}\n', 1, "domain"),
    (b'{"prompt": "   "}\n', 1, "empty"),
    (b'{"prompt_token_ids": [1, 2]}\n{"prompt_token_ids": []}\n', 2, "non-empty list of token ids"),
    (b'{"prompt_token_ids": [1, -2]}\n', 1, "holds -2, not a token id"),
    (b'{"prompt_token_ids": [1, true]}\n', 1, "holds True, not a token id"),
    (b'{"prompt_token_ids": "1 2"}\n', 1, "non-empty list of token ids"),
])
def test_bad_jsonl_raises_one_line_input_error(tmp_path, content, line, words):
    path = tmp_path / "bad.jsonl"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        load_prompts(path)
    assert words in str(info.value)
    assert_one_line_error(info.value, path, line)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(InputError, match="not found"):
        load_prompts(tmp_path / "absent.jsonl")
    with pytest.raises(InputError, match="directory"):
        load_prompts(tmp_path)


def test_unknown_suffix_that_is_not_json(tmp_path):
    path = tmp_path / "prompts.csv"
    path.write_text("a,b\n1,2\n", encoding="utf-8")
    with pytest.raises(InputError, match="unknown prompt file format"):
        load_prompts(path)


def test_a_single_json_object_is_an_unknown_format(tmp_path):
    path = tmp_path / "prompts.json"
    path.write_text(json.dumps({"prompts": ["a", "b"]}, indent=2), encoding="utf-8")
    with pytest.raises(InputError, match="unknown prompt file format"):
        load_prompts(path)


def test_corrupt_gzip(tmp_path):
    path = tmp_path / "p.jsonl.gz"
    path.write_bytes(gzip.compress(b'{"prompt": "a"}\n')[:-6])
    with pytest.raises(InputError, match="gzip"):
        load_prompts(path)


def test_only_skippable_records_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", [{"conversations": [{"from": "gpt", "value": "x"}]}])
    with pytest.raises(InputError, match="no prompts"):
        load_prompts(path)


@pytest.mark.parametrize("limit", [0, -1, 1.5, True])
def test_bad_limit(tmp_path, limit):
    path = write_jsonl(tmp_path / "p.jsonl", [{"prompt": "a"}])
    with pytest.raises(InputError, match="limit"):
        load_prompts(path, limit=limit)


CORRUPTIONS = {
    "malformed": lambda rec: json.dumps(rec)[:-1],
    "missing": lambda rec: json.dumps({"other": 1}),
    "non_string": lambda rec: json.dumps({"prompt": 12}),
    "latin1": lambda rec: '{"prompt": "caf\udce9"}',  # a lone surrogate, written below as a raw 0xE9 byte
}


@settings(max_examples=30, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 12), bad_at=st.integers(0, 11), kind=st.sampled_from(sorted(CORRUPTIONS)),
       texts=st.lists(st.text(st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=20)
                      .filter(str.strip), min_size=12, max_size=12))
def test_any_corrupted_line_is_reported_with_its_line(tmp_path, n, bad_at, kind, texts):
    bad_at = min(bad_at, n - 1)
    lines = [json.dumps({"prompt": t}) for t in texts[:n]]
    lines[bad_at] = CORRUPTIONS[kind]({"prompt": texts[bad_at]})
    path = tmp_path / "h.jsonl"
    path.write_bytes("\n".join(lines).encode("utf-8", errors="surrogateescape") + b"\n")
    with pytest.raises(InputError) as info:
        load_prompts(path)
    assert_one_line_error(info.value, path, line=bad_at + 1)
