"""Named prompt datasets (`autospec.workloads.datasets`): every format on small hand-written fixtures in
the public layouts, the one-line errors, the `random` token-id prompts, and the ways in (workload
specs, run configs, `autospec generate/profile --dataset`)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autospec.cli import app
from autospec.errors import InputError
from autospec.workloads.datasets import DATASET_NAMES, DatasetSelection, load_dataset, random_prompts

FIXTURES = Path(__file__).parent / "fixtures"


# --- the file formats --------------------------------------------------------------------------------

@pytest.mark.parametrize("name, file, count, domain, first_text, first_id", [
    ("humaneval", "humaneval.jsonl.gz", 3, "code", "def clamp(x: float, low: float, high: float) -> float:\n",
     "humaneval.jsonl.gz#Fixture/0"),
    ("gsm8k", "gsm8k.jsonl", 3, "math", "A baker fills 6 trays", "gsm8k.jsonl:1"),
    ("mt-bench", "mt_bench_question.jsonl", 4, "chat", "Write a short letter inviting",
     "mt_bench_question.jsonl#9001"),
    ("spec-bench", "spec_bench_question.jsonl", 5, "chat", "Suggest three names for a bicycle",
     "spec_bench_question.jsonl#1"),
    # The second record opens with the assistant: it carries no prompt and is skipped.
    ("sharegpt", "sharegpt.json", 3, "chat", "What is a good way to keep basil", "sharegpt.json#fx1"),
    # OpenAI-style turns: the system turn is not the prompt, the first user turn is.
    ("sharegpt", "sharegpt_openai.jsonl", 3, "chat", "List the planets that have rings.",
     "sharegpt_openai.jsonl#oa1"),
    ("jsonl", "prompts.jsonl", 4, "code", "def fahrenheit_to_celsius(f):", "prompts.jsonl#p1"),
])
def test_each_named_format_reads_its_fixture(name, file, count, domain, first_text, first_id):
    prompts = load_dataset(name, FIXTURES / file)
    assert len(prompts) == count
    assert prompts[0].domain == domain
    assert prompts[0].text.startswith(first_text)
    assert prompts[0].source_id == first_id
    assert all(p.token_ids is None for p in prompts)


def test_sharegpt_takes_the_first_human_turn_of_each_conversation():
    texts = [p.text for p in load_dataset("sharegpt", FIXTURES / "sharegpt.json")]
    assert texts == ["What is a good way to keep basil fresh in the kitchen?",
                     "Explain what a hash map is to a ten-year-old.",
                     "Give me three tips for writing clearer emails."]


def test_mbpp_original_and_sanitized_give_the_docstring_prompt_with_the_first_test():
    original = load_dataset("mbpp", FIXTURES / "mbpp.jsonl")
    sanitized = load_dataset("mbpp", FIXTURES / "sanitized-mbpp.json")
    assert [len(original), len(sanitized)] == [4, 3]
    assert {p.domain for p in original + sanitized} == {"code"}
    assert original[0].text == ('"""\nWrite a function to count how many vowels appear in a lowercase word.\n'
                                "assert count_vowels('banana') == 3\n\"\"\"\n")
    assert sanitized[1].text == ('"""\nWrite a function that returns the last character of a non-empty string.\n'
                                 "assert last_char('tulip') == 'p'\n\"\"\"\n")
    assert [p.source_id for p in original[:2]] == ["mbpp.jsonl#901", "mbpp.jsonl#902"]
    # Only the first test goes into the prompt: the others are the hidden checks.
    assert "sky" not in original[0].text


def test_jsonl_keeps_record_domains_unless_relabelled_and_reads_another_field():
    assert [p.domain for p in load_dataset("jsonl", FIXTURES / "prompts.jsonl")] == ["code", "chat", "code", "math"]
    assert {p.domain for p in load_dataset("jsonl", FIXTURES / "prompts.jsonl", domain="x")} == {"x"}
    texts = [p.text for p in load_dataset("jsonl", FIXTURES / "instructions.jsonl", field="instruction")]
    assert texts[0] == "Write a haiku about a lighthouse." and "unused" not in texts
    with pytest.raises(InputError, match="only applies to dataset 'jsonl'"):
        load_dataset("gsm8k", FIXTURES / "gsm8k.jsonl", field="question")


def test_limit_and_domain_relabel():
    prompts = load_dataset("mt-bench", FIXTURES / "mt_bench_question.jsonl", limit=2, domain="writing")
    assert [p.source_id for p in prompts] == ["mt_bench_question.jsonl#9001", "mt_bench_question.jsonl#9002"]
    assert {p.domain for p in prompts} == {"writing"}


def test_a_named_dataset_forces_its_layout():
    # An MBPP file read as GSM8K is an error on its first record, not a silent re-detection as MBPP.
    with pytest.raises(InputError) as info:
        load_dataset("gsm8k", FIXTURES / "mbpp.jsonl")
    assert info.value.one_line() == f"{FIXTURES / 'mbpp.jsonl'}:1 [question]: missing field 'question'"
    # HumanEval records have no `turns`.
    with pytest.raises(InputError, match="missing field 'turns'"):
        load_dataset("mt-bench", FIXTURES / "humaneval.jsonl.gz")


def test_names_are_case_and_separator_insensitive():
    assert len(load_dataset("MT_Bench", FIXTURES / "mt_bench_question.jsonl")) == 4


# --- errors ------------------------------------------------------------------------------------------

@pytest.mark.skipif(importlib.util.find_spec("datasets") is not None,
                    reason="the `datasets` package is installed: a cached copy could answer instead")
@pytest.mark.parametrize("name, expects, where", [
    ("mbpp", "the original mbpp.jsonl or sanitized-mbpp.json", "github.com/google-research/google-research"),
    ("humaneval", "HumanEval.jsonl.gz", "github.com/openai/human-eval"),
    ("gsm8k", "test.jsonl", "github.com/openai/grade-school-math"),
    ("mt-bench", "question.jsonl", "github.com/lm-sys/FastChat"),
    ("spec-bench", "question.jsonl", "github.com/hemingkx/Spec-Bench"),
    ("sharegpt", "ShareGPT_V3_unfiltered_cleaned_split.json", "anon8231489123/ShareGPT_Vicuna_unfiltered"),
])
def test_missing_file_says_which_file_and_where_to_get_it(name, expects, where):
    with pytest.raises(InputError) as info:
        load_dataset(name)
    line = info.value.one_line()
    assert "\n" not in line
    assert f"dataset '{name}' needs --dataset-path FILE" in line
    assert expects in line and where in line


def test_a_path_that_does_not_exist_is_named(tmp_path):
    missing = tmp_path / "mbpp.jsonl"
    with pytest.raises(InputError) as info:
        load_dataset("mbpp", missing)
    line = info.value.one_line()
    assert line.startswith(str(missing)) and "no such file" in line and "sanitized-mbpp.json" in line


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(InputError) as info:
        load_dataset("sonnet")
    line = info.value.one_line()
    assert "unknown dataset 'sonnet'" in line
    assert all(name in line for name in DATASET_NAMES)


def test_builtin_datasets_take_no_file():
    with pytest.raises(InputError, match="reads no file"):
        load_dataset("stdlib", FIXTURES / "prompts.jsonl")
    with pytest.raises(InputError, match="reads no file"):
        load_dataset("random", FIXTURES / "prompts.jsonl", vocab_size=10)


# --- random ------------------------------------------------------------------------------------------

def test_random_lengths_are_exact_and_ids_lie_in_the_vocabulary():
    prompts = load_dataset("random", limit=20, vocab_size=37, exclude_ids=(0, 36), input_len=11, seed=3)
    assert len(prompts) == 20
    assert all(len(p.token_ids) == 11 for p in prompts)
    ids = {t for p in prompts for t in p.token_ids}
    assert ids <= set(range(1, 36))  # below the vocabulary, none of the excluded (special) ids
    assert len(ids) > 25  # drawn across the vocabulary, not a handful of ids
    assert {p.domain for p in prompts} == {"random"}
    assert len({p.source_id for p in prompts}) == 20


def test_random_is_deterministic_by_seed():
    a = load_dataset("random", limit=4, vocab_size=1000, input_len=16, seed=7)
    b = load_dataset("random", limit=4, vocab_size=1000, input_len=16, seed=7)
    c = load_dataset("random", limit=4, vocab_size=1000, input_len=16, seed=8)
    assert a == b
    assert [p.token_ids for p in a] != [p.token_ids for p in c]


def test_random_range_ratio_spreads_lengths_within_the_bounds():
    prompts = random_prompts(200, 20, vocab_size=50, range_ratio=0.5, seed=0)
    lengths = {len(p.token_ids) for p in prompts}
    assert min(lengths) >= 10 and max(lengths) <= 30
    assert len(lengths) > 10  # actually spread, not one length


def test_random_refuses_bad_settings():
    with pytest.raises(InputError, match="vocabulary size"):
        load_dataset("random", limit=2)
    with pytest.raises(InputError, match="range ratio"):
        load_dataset("random", limit=2, vocab_size=10, range_ratio=1.0)
    with pytest.raises(InputError, match="no token id"):
        load_dataset("random", limit=2, vocab_size=2, exclude_ids=(0, 1))


def test_encoders_send_random_token_ids_as_they_are(bundled_pair):
    from autospec.serving.factory import encode_prompts, load_tokenizer, prompt_token_ids, random_vocab

    tokenizer = load_tokenizer(bundled_pair[0])
    vocab = random_vocab(tokenizer)
    assert vocab["vocab_size"] <= len(tokenizer)
    prompts = load_dataset("random", limit=3, input_len=9, seed=1, **vocab)
    assert encode_prompts(tokenizer, prompts) == [list(p.token_ids) for p in prompts]
    assert not {t for p in prompts for t in p.token_ids} & set(tokenizer.all_special_ids)
    # A text prompt is still tokenized.
    text = load_dataset("gsm8k", FIXTURES / "gsm8k.jsonl", limit=1)[0]
    assert prompt_token_ids(tokenizer, text) == tokenizer.encode(text.text, add_special_tokens=False)
    # An id the tokenizer does not have is refused rather than sent to the model.
    outside = random_prompts(1, 4, vocab_size=len(tokenizer) + 100, seed=0)[0]
    outside = type(outside)(outside.text, outside.domain, outside.source_id, (1, len(tokenizer) + 5))
    with pytest.raises(InputError, match="outside the tokenizer's vocabulary"):
        encode_prompts(tokenizer, [outside])


# --- stdlib ------------------------------------------------------------------------------------------

def test_stdlib_dataset_is_the_standard_library_code_prompts():
    from autospec.workloads.stdlib_prompts import stdlib_prompts

    prompts = load_dataset("stdlib", limit=3)
    assert prompts == stdlib_prompts(3)
    assert {p.domain for p in prompts} == {"code"}
    assert load_dataset() == stdlib_prompts()  # the default dataset


# --- profile's selection -----------------------------------------------------------------------------

def test_profile_selects_per_domain_from_a_dataset():
    from autospec.profile import select_prompts

    prompts = select_prompts([], 2, DatasetSelection("mbpp", FIXTURES / "sanitized-mbpp.json"))
    assert [p.source_id for p in prompts] == ["sanitized-mbpp.json#951", "sanitized-mbpp.json#952"]
    mixed = select_prompts([], 1, DatasetSelection("jsonl", FIXTURES / "prompts.jsonl"))
    assert [(p.domain, p.source_id) for p in mixed] == [("code", "prompts.jsonl#p1"), ("chat", "prompts.jsonl#p2"),
                                                        ("math", "prompts.jsonl#p4")]
    rnd = select_prompts([], 3, DatasetSelection("random", input_len=5), seed=2,
                         vocab={"vocab_size": 20, "exclude_ids": (0,)})
    assert [len(p.token_ids) for p in rnd] == [5, 5, 5]
    with pytest.raises(InputError, match="not both"):
        select_prompts([FIXTURES / "prompts.jsonl"], 2, DatasetSelection("jsonl", FIXTURES / "prompts.jsonl"))


# --- workload specs and run configs ------------------------------------------------------------------

def _workload(tmp_path: Path, prompts: str) -> Path:
    spec = tmp_path / "w.toml"
    spec.write_text(f'[workload]\ngenerator = "poisson"\nrate = 2\nduration_s = 5\nseed = 1\nprompts = {prompts}\n')
    return spec


def test_a_workload_spec_names_datasets(tmp_path):
    from autospec.workloads.spec import load_workload, read_workload_spec

    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "mbpp.jsonl").write_bytes((FIXTURES / "mbpp.jsonl").read_bytes())
    path = _workload(tmp_path, f'[{{ dataset = "mbpp", path = "data/mbpp.jsonl", limit = 2 }}, '
                               f'{{ dataset = "gsm8k", path = "{FIXTURES / "gsm8k.jsonl"}" }}, '
                               f'"{FIXTURES / "mt_bench_question.jsonl"}"]')
    sets = read_workload_spec(path).prompt_sets(tmp_path)  # relative to the TOML's folder
    assert {d: len(ps) for d, ps in sets.items()} == {"code": 2, "math": 3, "chat": 4}
    trace = load_workload(path)
    texts = set(trace.column("prompt"))
    assert texts <= {p.text for ps in sets.values() for p in ps} and len(texts) > 1


@pytest.mark.parametrize("prompts, needle", [
    ('[{ dataset = "sonnet" }]', "[workload.prompts.0.dataset]: unknown dataset 'sonnet'"),
    ('[{ dataset = "random" }]', "dataset 'random' gives token ids, not text"),
    ('[{ domain = "code" }]', "needs `path` (a prompt file) or `dataset`"),
    ('[{ dataset = "stdlib", path = "x.jsonl" }]', "dataset 'stdlib' reads no file"),
    ('[{ dataset = "mbpp", path = "absent.jsonl" }]', "no such file; dataset 'mbpp' expects"),
])
def test_bad_dataset_sources_are_one_line(tmp_path, prompts, needle):
    from autospec.workloads.spec import load_workload

    with pytest.raises(InputError) as info:
        load_workload(_workload(tmp_path, prompts))
    assert needle in info.value.one_line() and "\n" not in info.value.one_line()


def test_existing_prompt_sources_still_work(tmp_path):
    from autospec.workloads.spec import read_workload_spec

    path = _workload(tmp_path, f'["{FIXTURES / "prompts.jsonl"}", '
                               f'{{ path = "{FIXTURES / "gsm8k.jsonl"}", domain = "code", limit = 1 }}]')
    sets = read_workload_spec(path).prompt_sets(tmp_path)
    assert {d: len(ps) for d, ps in sets.items()} == {"code": 3, "chat": 1, "math": 1}


def test_run_config_dataset_path_resolves_against_the_config(tmp_path):
    from autospec.config import load_run_spec

    cfg = tmp_path / "run.toml"
    cfg.write_text('[generate]\ndataset = "mbpp"\ndataset_path = "data/mbpp.jsonl"\n')
    spec = load_run_spec(cfg)
    assert spec.generate.dataset_path == tmp_path.resolve() / "data" / "mbpp.jsonl"
    assert spec.generate.dataset_selection().name == "mbpp"
    cfg.write_text('[generate]\ndataset = "mbpp"\nprompts = ["a.jsonl"]\n')
    with pytest.raises(InputError, match="either prompts or dataset"):
        load_run_spec(cfg)


# --- the CLI -----------------------------------------------------------------------------------------

def _generate(*args: str):
    return CliRunner().invoke(app, ["generate", "--max-tokens", "4", "--json", *args])


def test_cli_generate_on_mbpp(tmp_path):
    res = _generate("--dataset", "mbpp", "--dataset-path", str(FIXTURES / "mbpp.jsonl"), "--limit", "2",
                    "--out", str(tmp_path / "run"))
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["requests"] == 2 and len(data["texts"]) == 2
    outputs = json.loads((tmp_path / "run" / "generate" / "outputs.json").read_text())
    assert outputs["prompts"] == ["mbpp.jsonl#901", "mbpp.jsonl#902"]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert str(FIXTURES / "mbpp.jsonl") in manifest["inputs"]


def test_cli_generate_on_sharegpt():
    res = _generate("--dataset", "sharegpt", "--dataset-path", str(FIXTURES / "sharegpt.json"))
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["requests"] == 3


def test_cli_generate_on_random_token_ids():
    res = _generate("--dataset", "random", "--random-input-len", "12", "--limit", "2", "--k", "2")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["requests"] == 2


@pytest.mark.parametrize("args, needle", [
    (["--dataset", "mbpp"], "dataset 'mbpp' needs --dataset-path FILE"),
    (["--dataset", "mbpp", "--dataset-path", "/nonexistent/mbpp.jsonl"], "/nonexistent/mbpp.jsonl"),
    (["--dataset", "sonnet"], "unknown dataset 'sonnet'; known datasets: stdlib, random"),
    (["--dataset", "gsm8k", "--prompts", str(FIXTURES / "gsm8k.jsonl")], "give --dataset or --prompts, not both"),
    (["--dataset-path", str(FIXTURES / "gsm8k.jsonl")], "--dataset-path needs --dataset NAME"),
    (["--dataset", "random", "--random-range-ratio", "1.5"], "--random-range-ratio must be in [0, 1)"),
])
def test_cli_dataset_errors_are_one_line_exit_2(tmp_path, args, needle):
    if args == ["--dataset", "mbpp"] and importlib.util.find_spec("datasets") is not None:
        pytest.skip("the `datasets` package is installed: a cached copy could answer instead")
    out = tmp_path / "run"
    res = _generate(*args, "--out", str(out))
    assert res.exit_code == 2, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], res.stderr
    assert "Traceback" not in res.output and not out.exists()


def test_cli_profile_dataset_errors_exit_2_before_writing(tmp_path):
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["profile", "--out", str(out), "--quick", "--dataset", "humaneval",
                                   "--dataset-path", str(tmp_path / "HumanEval.jsonl.gz")])
    assert res.exit_code == 2, res.output
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "HumanEval.jsonl.gz" in lines[0] and "no such file" in lines[0]
    res = CliRunner().invoke(app, ["profile", "--out", str(out), "--dataset", "nope"])
    assert res.exit_code == 2 and "unknown dataset 'nope'" in res.stderr
    assert not out.exists()
