"""The bench harness is not an installed package: import it from the repo root."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO_ROOT not in sys.path:
    sys.path.insert(0, REPO_ROOT)


@pytest.fixture(autouse=True, scope="session")
def _matplotlib_outside_home(tmp_path_factory) -> Iterator[None]:
    """matplotlib keeps its settings and font cache in ~/.config and ~/.cache
    unless MPLCONFIGDIR names another folder: the plotting tests use their own."""
    patch = pytest.MonkeyPatch()
    patch.setenv("MPLCONFIGDIR", str(tmp_path_factory.mktemp("matplotlib")))
    yield
    patch.undo()
