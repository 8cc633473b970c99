"""The hook's audit log names its own origin (issue 31, item 6): no longer ``semgov-hook`` for every server.

``SEMGOV_AUDIT_ORIGIN`` sets it; unset, each log directory gets its own random one, kept across
restarts, so a proof from one server's log is not a proof for another's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_hooks.core.events import open_audit_log
from engine_hooks.core.settings import HookConfigError, HookSettings
from semgov.signing.keys import load_signing_key
from tests.core.files import HookFiles


def _origin(files: HookFiles, audit_dir: Path, **env: str) -> str:
    settings = HookSettings.from_env(files.env(SEMGOV_AUDIT_DIR=str(audit_dir), **env))
    log = open_audit_log(settings, load_signing_key(files.signing_key))
    try:
        return log.origin
    finally:
        log.close()


def test_each_hook_log_gets_its_own_origin(hook_files: HookFiles, tmp_path: Path) -> None:
    """Two servers' logs get two origins, neither the old shared constant; a restart keeps its own."""
    a, b = _origin(hook_files, tmp_path / "a"), _origin(hook_files, tmp_path / "b")
    assert a != b and "semgov-hook" not in (a, b)
    assert _origin(hook_files, tmp_path / "a") == a


def test_semgov_audit_origin_names_the_log(hook_files: HookFiles, tmp_path: Path) -> None:
    """SEMGOV_AUDIT_ORIGIN is the log's origin; a malformed one is a configuration error naming it."""
    named = "eu-1.example/semgov"
    assert _origin(hook_files, tmp_path / "c", SEMGOV_AUDIT_ORIGIN=named) == named
    with pytest.raises(HookConfigError, match="SEMGOV_AUDIT_ORIGIN"):
        _origin(hook_files, tmp_path / "d", SEMGOV_AUDIT_ORIGIN="x" * 300)
