"""Shared pytest configuration for the flashinfer Python tests.

* ``@pytest.mark.gpu`` tests are skipped, with the reason, when torch is missing or
  ``torch.cuda.is_available()`` is False. Everything else runs on any machine.
* ``@pytest.mark.smoke`` selects a small, fast subset (``pytest -m smoke``).
* Every test is seeded from its own node id (parameters included), so each case draws
  different random inputs, and re-running one case draws the same inputs again. Set
  FLASHINFER_TEST_SEED=<int> to draw a different (still reproducible) set everywhere.
"""

from __future__ import annotations

import os
import zlib

import pytest

try:
    import torch
except ImportError:  # the CPU-only tests that need torch skip themselves with importorskip
    torch = None


def _gpu_skip_reason() -> str | None:
    if torch is None:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device: torch.cuda.is_available() is False"
    return None


def pytest_configure(config: pytest.Config) -> None:
    # pyproject.toml lists these too; registering here keeps `--strict-markers` happy when
    # pytest runs from another rootdir.
    config.addinivalue_line("markers", "gpu: needs a CUDA device (skipped without one)")
    config.addinivalue_line("markers", "smoke: a small subset for quick iterations")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=f"GPU test skipped: {reason}")
    for item in items:
        if item.get_closest_marker("gpu") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed_per_test(request: pytest.FixtureRequest) -> None:
    """Seed torch's CPU and CUDA generators from the test's node id."""
    if torch is not None:
        salt = int(os.environ.get("FLASHINFER_TEST_SEED", "0"))
        torch.manual_seed(zlib.crc32(request.node.nodeid.encode()) ^ salt)
