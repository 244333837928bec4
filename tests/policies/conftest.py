"""Fixtures for the policy tests (builders live in policy_helpers.py)."""

from __future__ import annotations

import pytest

from autospec.latency import LinearLatencyModel

from policy_helpers import simple_linear_model


@pytest.fixture
def simple_model() -> LinearLatencyModel:
    """Context-free time model: a draft pass costs 10 ms; a target pass 50 ms + 10 ms per token."""
    return simple_linear_model()
