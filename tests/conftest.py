"""Shared fixtures: tiny random Hugging Face pairs built on the spot, the bundled pair."""

from __future__ import annotations

from pathlib import Path

import pytest

from autospec.models import BUNDLED_DRAFT, BUNDLED_TARGET

from autospec_testing import make_tiny_model


@pytest.fixture(scope="session")
def tiny_pair(tmp_path_factory) -> tuple[Path, Path]:
    """A 2-layer target and a different 1-layer draft over a 6-token vocabulary."""
    root = tmp_path_factory.mktemp("tiny_pair")
    target = make_tiny_model(root / "target", vocab=6, layers=2, seed=1)
    draft = make_tiny_model(root / "draft", vocab=6, layers=1, seed=2)
    return target, draft


@pytest.fixture(scope="session")
def bundled_pair() -> tuple[Path, Path]:
    if not (BUNDLED_TARGET / "config.json").is_file():
        pytest.fail("the bundled pair is missing from the package")
    return BUNDLED_TARGET, BUNDLED_DRAFT
