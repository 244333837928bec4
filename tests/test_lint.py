"""Habits that keep the code legible (issue 14, item 6): ruff (lint and import order) over the project's
Python, and a type check (mypy) of the layers everything else builds on — the contract, the policies and
serving. Both are configured in pyproject.toml; both run here so that CI runs them through the README's
one test command."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TYPED = ["autospec/contract.py", "autospec/policies", "autospec/serving"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_clean():
    res = _run("ruff", "check", "--no-cache", "autospec", "tests", "benchmarks", "training")
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]


def test_types_of_contract_policies_serving():
    res = _run("mypy", "--no-incremental", *TYPED)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
