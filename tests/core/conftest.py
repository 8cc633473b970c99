"""Fixtures of the governed-serving core's tests: real keys, keyring, context key and policy on disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.core.files import HookFiles, make_hook_files


@pytest.fixture
def hook_files(tmp_path: Path) -> HookFiles:
    return make_hook_files(tmp_path)
