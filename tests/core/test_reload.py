"""Hot reload installs only complete, settled policies and keyrings (issue 31, section 4 and 7)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from engine_hooks.core.policies import HookPolicies
from engine_hooks.core.reload import ReloadWatcher, fingerprint
from engine_hooks.core.settings import HookSettings
from semgov.policy.source import load_policy_source
from semgov.signing.keys import generate_keypair, key_id_for, load_public_key, load_signing_key
from tests.conftest import ROOT
from tests.core.files import HookFiles

REGO_DEFAULT = ROOT / "policies" / "rego" / "default"


def _watcher(paths: list[Path], asked: list[str]) -> ReloadWatcher:
    return ReloadWatcher(paths, 3600.0, asked.append)  # NOTE: polled by hand, never by its thread


def test_the_watcher_asks_only_once_a_change_reads_the_same_at_two_polls(hook_files: HookFiles) -> None:
    """A file still being written (its content differs at each poll) is never asked for; it is
    asked for once, at the first poll that reads what the previous one read."""
    asked: list[str] = []
    w = _watcher([hook_files.policy, hook_files.trust], asked)
    try:
        f = hook_files.policy / "policy.yaml"
        full = f.read_text().replace("min_approved_fraction: 0.5", "min_approved_fraction: 0.9")
        f.write_text(full[: len(full) // 2])
        assert not w.check() and asked == []  # NOTE: half of it: changed since the start
        f.write_text(full)
        assert not w.check() and asked == []  # NOTE: changed again: not settled yet
        assert w.check() and asked == ["file changed"]
        assert not w.check() and asked == ["file changed"]  # NOTE: asked once per settled content
    finally:
        w.close()


def test_a_touched_or_hidden_file_never_asks(hook_files: HookFiles) -> None:
    """The fingerprint is the content of the files a load reads: a touch, a hidden temp file or an
    editor's copy beside the policy changes nothing."""
    before = fingerprint([hook_files.policy, hook_files.trust])
    (hook_files.policy / "policy.yaml").touch()
    (hook_files.policy / ".policy.yaml.new").write_text("name: half")
    (hook_files.policy / "policy.yaml~").write_text("name: old")
    assert fingerprint([hook_files.policy, hook_files.trust]) == before


def test_hidden_entries_and_temp_copies_in_a_rego_directory_are_never_loaded(tmp_path: Path) -> None:
    """A Kubernetes-style timestamped hidden directory, an editor lock file and a backup copy beside
    a Rego policy are not read: the policy loads as the clean directory does."""
    d = tmp_path / "rego"
    shutil.copytree(REGO_DEFAULT, d)
    clean = load_policy_source(d).revision
    (d / "..2024_01_01_00_00_00.1").mkdir()
    (d / "..2024_01_01_00_00_00.1" / "policy.rego").write_text("package semgov.reuse\nallow := true\n")
    (d / ".#policy.rego").write_text("package semgov.reuse\nallow := true\n")
    (d / "#policy.rego#").write_text("package semgov.reuse\nallow := true\n")
    assert load_policy_source(d).revision == clean


def _env(files: HookFiles) -> dict[str, str]:
    return files.env(SEMGOV_ASYNC_DECISIONS="0")


def test_a_keyring_change_during_a_failed_policy_load_is_never_audited_as_in_force(
    hook_files: HookFiles, tmp_path: Path
) -> None:
    """A new keyring read while the policy fails to load is not claimed: the failure names the
    keyring still in force, and the next reload (policy fixed to the same revision) installs and
    audits the new keyring."""
    settings = HookSettings.from_env(_env(hook_files))
    pols = HookPolicies(settings, load_signing_key(hook_files.signing_key))
    old_digest, revision = pols.keyring_digest, pols.live.revision
    _, pub2 = generate_keypair(tmp_path / "k2")
    kid2 = key_id_for(load_public_key(pub2))
    ring = json.loads(hook_files.trust.read_text())
    ring["keys"].append({"key_id": kid2, "public_key": pub2.read_text()})
    hook_files.trust.write_text(json.dumps(ring))
    policy = hook_files.policy / "policy.yaml"
    good = policy.read_text()
    policy.write_text(good.replace("min_approved_fraction: 0.5", "min_approved_fraction: 7"))
    [failed] = pols.reload()
    assert not failed.ok and failed.keyring == old_digest == pols.keyring_digest
    assert pols.live.evaluator.ctx.keyring.get(kid2) is None
    policy.write_text(good)
    [loaded] = pols.reload()
    assert loaded.ok and loaded.revision == revision and loaded.keyring != old_digest
    assert loaded.keyring == pols.keyring_digest and pols.live.evaluator.ctx.keyring.get(kid2) is not None


def test_a_policy_cut_short_is_refused_at_reload(hook_files: HookFiles) -> None:
    """A policy file caught half-copied (cut at any line) is refused and the old one keeps deciding."""
    settings = HookSettings.from_env(_env(hook_files))
    pols = HookPolicies(settings, load_signing_key(hook_files.signing_key))
    revision = pols.live.revision
    policy = hook_files.policy / "policy.yaml"
    text = policy.read_text().replace("min_approved_fraction: 0.5", "min_approved_fraction: 0.9")
    lines = text.splitlines(keepends=True)
    for n in range(1, len(lines) - 1):  # NOTE: every prefix short of the end marker
        policy.write_text("".join(lines[:n]))
        assert all(not o.ok for o in pols.reload()) and pols.live.revision == revision, n
    policy.write_text(text)
    [loaded] = pols.reload()
    assert loaded.ok and pols.live.revision != revision
