"""`autospec generate` end to end through the real console script, and its bad-input contract."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autospec_testing import make_tiny_model, shared_file

AUTOSPEC = [sys.executable, "-m", "autospec.cli"]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*AUTOSPEC, *args], capture_output=True, text=True, cwd=cwd, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})


def test_generate_json_on_the_bundled_pair(tmp_path):
    prompts = shared_file("humaneval.jsonl.gz")
    res = run_cli("generate", "--prompts", str(prompts), "--limit", "3", "--k", "3", "--max-tokens", "16",
                  "--batch-size", "2", "--json", "--out", str(tmp_path / "run"))
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert len(data["texts"]) == 3 and all(isinstance(t, str) and t for t in data["texts"])
    for key in ("acceptance_rate", "mean_accepted_per_step", "tokens_per_s", "draft_s", "verify_s"):
        assert isinstance(data[key], float)
    assert 0.0 <= data["acceptance_rate"] <= 1.0
    assert data["draft_s"] > 0 and data["verify_s"] > 0
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["schema_version"] == 1
    assert manifest["models"]["target"]["sha256"], "weights must be hashed"
    assert str(prompts) in manifest["inputs"]
    assert {"platform", "cpu_count"} <= set(manifest["hardware"])


def test_k0_and_sd_print_identical_texts(tmp_path):
    prompts = shared_file("gsm8k_test.jsonl")
    texts = []
    for k in ("0", "4"):
        res = run_cli("generate", "--prompts", str(prompts), "--limit", "2", "--k", k, "--max-tokens", "12",
                      "--json")
        assert res.returncode == 0, res.stderr
        texts.append(json.loads(res.stdout)["texts"])
    assert texts[0] == texts[1]


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[list[str], str]]:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    malformed = tmp_path / "bad.jsonl"
    malformed.write_text('{"prompt": "ok"}\n{"prompt": \n')
    other_vocab = make_tiny_model(tmp_path / "other", vocab=50, layers=1)
    good = tmp_path / "good.jsonl"
    good.write_text('{"prompt": "def f():"}\n')
    return {
        "missing model directory": (["--prompts", str(good), "--target", str(tmp_path / "nope"),
                                     "--draft", str(tmp_path / "nope")], "does not exist"),
        "vocabulary mismatch": (["--prompts", str(good), "--draft", str(other_vocab)], "vocabulary"),
        "empty prompt file": (["--prompts", str(empty)], "empty.jsonl"),
        "malformed prompt file": (["--prompts", str(malformed)], "bad.jsonl:2"),
        "negative K": (["--prompts", str(good), "--k", "-1"], "--k must be >= 0"),
        "missing prompt file": (["--prompts", str(tmp_path / "absent.jsonl")], "absent.jsonl"),
    }


@pytest.mark.parametrize("case", ["missing model directory", "vocabulary mismatch", "empty prompt file",
                                  "malformed prompt file", "negative K", "missing prompt file"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, case):
    args, needle = _bad_inputs(tmp_path)[case]
    out_dir = tmp_path / "out"
    res = run_cli("generate", *args, "--out", str(out_dir))
    assert res.returncode == 2, (res.stdout, res.stderr)
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, res.stderr
    assert needle in lines[0]
    assert "Traceback" not in res.stderr + res.stdout
    assert not out_dir.exists(), "no half-written artifacts"
