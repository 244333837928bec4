"""Workload specs: the bundled TOMLs build, relative paths resolve, and bad tables name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from autospec.errors import InputError
from autospec.workloads.spec import WorkloadSpec, load_workload, read_workload_spec, workload_spec_from_dict

from autospec_testing import SHARED_DATA

REPO = Path(__file__).resolve().parents[2]
DATA_DIR = SHARED_DATA
needs_data = pytest.mark.skipif(not (DATA_DIR / "azure_llm_2023_code.csv").is_file(),
                                reason=f"{DATA_DIR} not present")
BUNDLED = sorted((REPO / "workloads").glob("*.toml"))


def write_spec(tmp_path: Path, body: str, name: str = "w.toml") -> Path:
    path = tmp_path / name
    path.write_text("[workload]\n" + body, encoding="utf-8")
    return path


def test_bundled_specs_exist():
    assert {p.name for p in BUNDLED} >= {"azure-code-cpu.toml", "bursty.toml", "poisson.toml"}


@needs_data
@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.name)
def test_bundled_specs_build(path, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # paths must not depend on where the command runs
    monkeypatch.delenv("AUTOSPEC_DATA_DIR", raising=False)
    trace = load_workload(path)
    assert 50 <= len(trace) <= 300  # sized for a 2-core CPU replay
    assert trace.has_prompts
    assert trace.column("output_len").max() <= 128 and trace.column("prompt_len").max() <= 256
    assert load_workload(path) == trace  # seeded


@needs_data
def test_azure_code_cpu_shape():
    trace = load_workload(REPO / "workloads" / "azure-code-cpu.toml")
    assert len(trace) == 200 and set(trace.column("domain")) == {"code"}
    assert trace.column("output_len").max() <= 64
    assert trace.stats()["interarrival_cv"] > 2  # still bursty after windowing


def test_synthetic_without_prompts_needs_no_data(tmp_path):
    path = write_spec(tmp_path, 'format = "synthetic"\ngenerator = "gamma"\nrate = 4\ncv = 2\nduration_s = 30\n'
                                "max_requests = 50\nprompts = []\nseed = 3\n")
    trace = load_workload(path)
    assert len(trace) == 50 and not trace.has_prompts


def test_relative_trace_and_prompt_paths_resolve_against_the_toml(tmp_path, monkeypatch):
    folder = tmp_path / "specs"
    folder.mkdir()
    (tmp_path / "trace.jsonl").write_text('{"timestamp": 0, "input_length": 9, "output_length": 4}\n'
                                          '{"timestamp": 1500, "input_length": 7, "output_length": 2}\n',
                                          encoding="utf-8")
    (tmp_path / "p.txt").write_text("hello\nworld\n", encoding="utf-8")
    path = write_spec(folder, 'trace = "../trace.jsonl"\ntime_scale = 2\n'
                              'prompts = [{ path = "../p.txt", domain = "chat" }]\n')
    monkeypatch.chdir("/")  # resolution must not depend on the working directory
    trace = load_workload(path)
    assert list(trace.column("arrival_s")) == [0.0, 3.0]
    assert set(trace.column("prompt")) <= {"hello", "world"} and trace.has_prompts


@pytest.mark.parametrize("body, field, words", [
    ('trace = "x.csv"\nfromat = "azure"\n', "workload.fromat", "unknown key"),
    ('format = "parquet"\ntrace = "x"\n', "workload.format", "unknown format"),
    ('format = "synthetic"\ngenerator = "poisson"\nduration_s = 5\n', "workload.rate", "needs 'rate'"),
    ('format = "synthetic"\ngenerator = "poisson"\nrate = -1\nduration_s = 5\n', "workload.rate", "greater than 0"),
    ('trace = "x.csv"\nrate = 3\n', "workload.rate", "only applies"),
    ('format = "azure"\n', "workload.trace", "needs a trace"),
    ('format = "synthetic"\ntrace = "x.csv"\ngenerator = "poisson"\nrate = 1\nduration_s = 1\n', "workload.trace",
     "no trace"),
    ('trace = "x.csv"\nmax_requests = 0\n', "workload.max_requests", "greater than 0"),
    ('trace = "x.csv"\nprompts = [{ path = "a", bogus = 1 }]\n', "workload.prompts", "unknown key"),
    ('format = "synthetic"\ngenerator = "onoff"\nrate = 1\noff_rate = 2\nduration_s = 5\n', "workload.off_rate",
     "cannot exceed"),
])
def test_bad_tables_name_the_field(tmp_path, body, field, words):
    path = write_spec(tmp_path, body)
    with pytest.raises(InputError) as info:
        load_workload(path)
    message = str(info.value)
    assert "\n" not in message and path.name in message
    assert info.value.field.startswith(field) and words in message


def test_toml_syntax_error_has_a_line(tmp_path):
    path = write_spec(tmp_path, 'rate = 1\nduration_s = = 3\n')
    with pytest.raises(InputError) as info:
        read_workload_spec(path)
    assert info.value.line == 3


def test_no_workload_table(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text("[engine]\nname = 'sim'\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"no \[workload\] table"):
        read_workload_spec(path)


def test_missing_trace_file_names_it(tmp_path):
    path = write_spec(tmp_path, 'trace = "absent.csv"\nformat = "azure"\nprompts = []\n')
    with pytest.raises(InputError, match="absent.csv: file not found"):
        load_workload(path)


def test_empty_window_is_reported(tmp_path):
    path = write_spec(tmp_path, 'format = "synthetic"\ngenerator = "poisson"\nrate = 0.001\nduration_s = 1\n'
                                "prompts = []\n")
    with pytest.raises(InputError, match="no requests arrive") as info:
        load_workload(path)
    assert path.name in str(info.value)


def test_spec_from_dict_is_the_same_model():
    spec = workload_spec_from_dict({"generator": "poisson", "rate": 2, "duration_s": 10})
    assert isinstance(spec, WorkloadSpec) and spec.is_synthetic
