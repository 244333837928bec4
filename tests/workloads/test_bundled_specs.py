"""Bundled workload specs and the bundled trace: everything resolves inside the package.

A user who installed autospec has no `../shared/data` next to their working directory, so every spec in
workloads/ must name its trace as `bundled:<name>` (or synthesize one) and build from anywhere.
"""

from __future__ import annotations

import gzip
import hashlib
import shutil
from pathlib import Path

import pytest

from autospec.config import bundled_workload
from autospec.errors import InputError
from autospec.workloads.loaders import BUNDLED_TRACES, bundled_trace, detect_format, load_trace
from autospec.workloads.spec import load_workload, read_workload_spec

from autospec_testing import shared_file

REPO = Path(__file__).resolve().parents[2]
SPECS = sorted((REPO / "workloads").glob("*.toml"))
DATA = REPO / "autospec" / "workloads" / "data"
AZURE_SHA256 = "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6"  # as ATTRIBUTION.txt says


@pytest.fixture
def no_shared_data(tmp_path, monkeypatch):
    """cwd in an empty folder, AUTOSPEC_DATA_DIR at another empty one: no ../shared/data to be found."""
    empty = tmp_path / "empty-data"
    empty.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("AUTOSPEC_DATA_DIR", str(empty))
    monkeypatch.chdir(work)
    return work


def test_every_bundled_spec_names_its_trace_without_a_path():
    assert {p.stem for p in SPECS} >= {"azure-code-cpu", "bursty", "poisson"}
    for path in SPECS:
        spec = read_workload_spec(path)
        assert spec.is_synthetic or spec.trace.startswith("bundled:"), path.name


@pytest.mark.parametrize("path", SPECS, ids=lambda p: p.stem)
def test_every_bundled_spec_builds_without_the_shared_data(path, no_shared_data):
    # With its prompts: the default prompt sets are package data too (autospec.workloads.default_prompts).
    trace = load_workload(bundled_workload(path.stem))
    assert 50 <= len(trace) <= 300 and trace.has_prompts
    # The same spec copied elsewhere builds the same trace: nothing depends on where the file lives.
    moved = no_shared_data / "elsewhere" / path.name
    moved.parent.mkdir()
    shutil.copy(path, moved)
    assert load_workload(moved) == trace


def test_azure_code_cpu_comes_from_the_bundled_trace(no_shared_data):
    spec = read_workload_spec(bundled_workload("azure-code-cpu"))
    assert spec.trace == "bundled:azure-code-2023"
    trace = spec.model_copy(update={"prompts": []}).build(no_shared_data)
    assert len(trace) == 200 and set(trace.column("domain")) == {"code"}
    assert trace.column("output_len").max() <= 64
    assert trace.stats()["interarrival_cv"] > 2  # the real trace's bursts survive the window


def test_bundled_trace_is_the_whole_hour_gzipped_with_its_attribution():
    path = bundled_trace("azure-code-2023")
    assert path == DATA / "azure_llm_2023_code.csv.gz" and path.stat().st_size < 200_000
    assert hashlib.sha256(gzip.decompress(path.read_bytes())).hexdigest() == AZURE_SHA256
    assert detect_format(path) == "azure"
    trace = load_trace("bundled:azure-code-2023")
    assert len(trace) == 8819 and 3300 < trace.column("arrival_s").max() < 3600
    attribution = (DATA / "ATTRIBUTION.txt").read_text(encoding="utf-8")
    for needle in ("CC-BY-4.0", "Azure LLM inference trace 2023", "Azure Public Dataset",
                   "AzureLLMInferenceTrace_code.csv", "gzipped", AZURE_SHA256):
        assert needle in attribution


def test_bundled_trace_matches_the_published_file():
    original = shared_file("azure_llm_2023_code.csv")
    assert gzip.decompress(bundled_trace("azure-code-2023").read_bytes()) == original.read_bytes()


def test_unknown_bundled_trace_names_the_field_and_the_known_ones(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text('[workload]\ntrace = "bundled:azure-chat-2099"\nformat = "azure"\nprompts = []\n')
    with pytest.raises(InputError) as info:
        load_workload(path)
    line = info.value.one_line()
    assert info.value.field == "workload.trace" and "azure-chat-2099" in line
    assert "bundled:azure-code-2023" in line and "w.toml" in line
    with pytest.raises(InputError, match="unknown bundled trace"):
        load_trace("bundled:nope")
    assert set(BUNDLED_TRACES) == {"azure-code-2023"}
