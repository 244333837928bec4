"""Run configs (TOML in/out), the manifest, and `autospec run` on a config."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from autospec.artifacts import read_json, write_json
from autospec.config import RunSpec, dump_run_spec, load_run_spec
from autospec.errors import InputError

from autospec_testing import shared_file


def test_toml_round_trip(tmp_path):
    spec = RunSpec()
    spec.generate.strategy = "dsde"
    spec.generate.max_tokens = 7
    path = tmp_path / "run.toml"
    path.write_text(dump_run_spec(spec))
    again = load_run_spec(path)
    assert again.generate.strategy == "dsde" and again.generate.max_tokens == 7
    assert again.pair.target == spec.pair.target


def test_relative_paths_resolve_against_the_config_file(tmp_path):
    (tmp_path / "sub").mkdir()
    path = tmp_path / "sub" / "run.toml"
    path.write_text('[generate]\nprompts = ["p.jsonl"]\n[pair]\ntarget = "../t"\ndraft = "../d"\n')
    spec = load_run_spec(path)
    assert spec.generate.prompts == [tmp_path / "sub" / "p.jsonl"]
    assert spec.pair.target == tmp_path / "sub" / ".." / "t"


@pytest.mark.parametrize("text,field", [
    ("[generate]\nmax_tokenz = 3\n", "generate.max_tokenz"),
    ("[generate]\nmax_tokens = -1\n", "generate.max_tokens"),
    ("[engine]\ndtype = 'int4'\n", "engine.dtype"),
    ("schema_version = 99\n", "schema_version"),
])
def test_bad_config_names_the_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_run_spec(path)
    assert info.value.field == field
    assert "bad.toml" in info.value.one_line() and "\n" not in info.value.one_line()


def test_invalid_toml_is_an_input_error(tmp_path):
    path = tmp_path / "broken.toml"
    path.write_text("[generate\n")
    with pytest.raises(InputError, match="invalid TOML"):
        load_run_spec(path)


def test_artifacts_refuse_unknown_schema_versions(tmp_path):
    write_json(tmp_path / "a.json", {"x": 1})
    assert read_json(tmp_path / "a.json")["x"] == 1
    (tmp_path / "b.json").write_text(json.dumps({"schema_version": 42}))
    with pytest.raises(InputError, match="schema_version"):
        read_json(tmp_path / "b.json")


def test_run_on_a_config_writes_a_run_directory(tmp_path):
    prompts = shared_file("mt_bench_questions.jsonl")
    config = tmp_path / "run.toml"
    config.write_text(f'[generate]\nprompts = ["{prompts}"]\nprompts_per_set = 2\nk = 2\nmax_tokens = 8\n'
                      'compare_to_no_sd = true\n')
    res = subprocess.run([sys.executable, "-m", "autospec.cli", "run", str(config), "--out", str(tmp_path / "r"),
                          "--json"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["t0_identical_to_no_sd"] is True
    assert summary["speedup_vs_no_sd"] > 0
    run_dir = tmp_path / "r"
    assert {p.name for p in run_dir.iterdir()} >= {"manifest.json", "config.toml", "generate"}
    assert load_run_spec(run_dir / "config.toml").generate.k == 2
