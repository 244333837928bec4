"""Artifacts get the permissions of any file the user writes (0666 & ~umask), not mkstemp's 0600."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from contextlib import contextmanager

import pandas as pd
import pytest

from autospec import artifacts
from autospec.artifacts import write_json, write_parquet, write_text

from stage_helpers import write_synthetic_run


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask, expected", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_every_writer_honours_the_umask(tmp_path, mask, expected):
    with umask(mask):
        write_json(tmp_path / "a" / "x.json", {"k": 1})
        write_text(tmp_path / "a" / "x.txt", "text\n")
        write_parquet(tmp_path / "a" / "x.parquet", pd.DataFrame({"v": [1, 2]}))
    for name in ("x.json", "x.txt", "x.parquet"):
        assert mode(tmp_path / "a" / name) == expected, name
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["x.json", "x.parquet", "x.txt"]  # no temp left


def test_rewriting_an_artifact_takes_the_current_umask(tmp_path):
    path = tmp_path / "x.json"
    with umask(0o077):
        write_json(path, {"k": 1})
    with umask(0o022):
        write_json(path, {"k": 2})
    assert mode(path) == 0o644


def test_the_umask_fallback_reads_without_changing_it():
    with umask(0o027):
        assert artifacts._umask_by_setting() == 0o027
        assert artifacts.current_umask() == 0o027
        assert os.umask(0o027) == 0o027  # left as it was


def test_a_command_writes_its_artifacts_with_the_users_umask(tmp_path):
    run = write_synthetic_run(tmp_path / "run")
    res = subprocess.run([sys.executable, "-m", "autospec", "fit", str(run)], capture_output=True, text=True,
                         timeout=600, umask=0o027)
    assert res.returncode == 0, res.stderr[-2000:]
    assert mode(run / "fit" / "models.json") == 0o640
