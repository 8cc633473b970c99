"""A worker loads signed policy bundles (issue 36, part 3): complete, stable, trusted, never older
unless forced; the revision it runs is in the reload's audit detail and in a metric."""

from __future__ import annotations

import http.server
import shutil
import threading
from pathlib import Path

import pytest

from engine_hooks.core.bundles import BundleWatcher, read_state
from engine_hooks.core.metrics import HookMetrics
from engine_hooks.core.policies import HookPolicies
from engine_hooks.core.settings import HookConfigError, HookSettings
from semgov.bundle.bundle import build_bundle
from semgov.bundle.files import collect
from semgov.bundle.jws import BundleSigner, parse_trust
from semgov.policy.source import load_policy_source
from semgov.signing.keys import load_signing_key
from tests.bundle.conftest import make_signer, trust_json
from tests.core.files import HookFiles
from tests.core.test_policy_lifecycle import governor, records, wait_for


class Rig:
    """A worker's settings with a bundle directory, its signer, and a hand-polled watcher."""

    def __init__(self, files: HookFiles, tmp: Path, **env: str) -> None:
        self.files, self.tmp = files, tmp
        self.drop = tmp / "drop"
        self.drop.mkdir()
        self.signer = make_signer(tmp / "bkeys", "release")
        (tmp / "bkeys" / "trust.json").write_bytes(trust_json(self.signer))
        self.env = files.env(
            SEMGOV_ASYNC_DECISIONS="0",
            SEMGOV_BUNDLE=str(self.drop),
            SEMGOV_BUNDLE_TRUST=str(tmp / "bkeys" / "trust.json"),
            SEMGOV_BUNDLE_WORK_DIR=str(tmp / "work"),
            **env,
        )
        self.settings = HookSettings.from_env(self.env)
        self.asked: list[str] = []
        self.refusals: list[str] = []

    def policies(self) -> HookPolicies:
        return HookPolicies(self.settings, load_signing_key(self.files.signing_key))

    def watcher(self, source: str | None = None, force: bool = False) -> BundleWatcher:
        return BundleWatcher(
            source or str(self.drop),
            parse_trust(trust_json(self.signer), source="trust.json"),
            self.tmp / "work",
            force=force,
            request=self.asked.append,
            refused=self.refusals.append,
            start=False,
        )

    def policy_variant(self, fraction: str) -> Path:
        d = self.tmp / f"policy-{fraction}"
        shutil.copytree(self.files.policy, d, dirs_exist_ok=True)
        f = d / "policy.yaml"
        base = (self.files.policy / "policy.yaml").read_text()
        f.write_text(base.replace("min_approved_fraction: 0.5", f"min_approved_fraction: {fraction}"))
        return d

    def bundle(self, revision: str, fraction: str = "0.9", signer: BundleSigner | None = None) -> bytes:
        files = collect(self.policy_variant(fraction), self.files.trust)
        return build_bundle(files, revision, signer or self.signer, issued_at=1)

    def drop_bundle(self, name: str, data: bytes) -> Path:
        tmp = self.drop / f".{name}.part"
        tmp.write_bytes(data)
        return tmp.replace(self.drop / name)


@pytest.fixture
def rig(hook_files: HookFiles, tmp_path: Path) -> Rig:
    return Rig(hook_files, tmp_path)


def test_a_dropped_bundle_is_installed_once_stable_and_decides(rig: Rig) -> None:
    """A trusted bundle is installed at the second poll that reads it, and the next reload decides
    with its policy; the policy_loaded detail names the bundle revision and signer."""
    pols, w = rig.policies(), rig.watcher()
    assert pols.bundle is None
    rig.drop_bundle("r42.tar.gz", rig.bundle("42"))
    assert w.check() is None and rig.asked == []  # NOTE: seen once: not yet stable
    state = w.check()
    assert state is not None and state.revision == "42" and rig.asked == ["bundle 42"]
    [loaded] = pols.reload()
    assert loaded.ok and loaded.kind == "policy_loaded" and loaded.bundle == "42"
    assert "from bundle 42 (" in loaded.detail and "signed by release" in loaded.detail
    assert pols.live.revision == load_policy_source(rig.policy_variant("0.9")).revision
    assert pols.reload() == [] and w.check() is None and rig.refusals == []


def test_a_bundle_still_being_written_is_never_installed(rig: Rig) -> None:
    """Bytes that differ at each poll are not verified or installed; once they settle they are."""
    w, data = rig.watcher(), rig.bundle("42")
    target = rig.drop / "r42.tar.gz"
    for cut in (len(data) // 3, 2 * len(data) // 3):
        target.write_bytes(data[:cut])
        assert w.check() is None
    target.write_bytes(data)
    assert w.check() is None and w.check() is not None and rig.refusals == []


@pytest.mark.parametrize("tamper", ["untrusted", "changed"])
def test_an_untrusted_or_changed_bundle_is_refused_naming_it(rig: Rig, tamper: str) -> None:
    """Each is reported once, naming the bundle file and the problem; nothing is installed."""
    pols, w = rig.policies(), rig.watcher()
    revision = pols.live.revision
    if tamper == "untrusted":
        data = rig.bundle("42", signer=make_signer(rig.tmp / "other", "intruder"))
        why = ".signatures.json: signed by key 'intruder', which is not trusted"
    else:
        data = _changed_member(rig, "42")
        why = "policy/policy.yaml: digest mismatch: changed after signing"
    path = rig.drop_bundle("r42.tar.gz", data)
    assert w.check() is None and w.check() is None and w.check() is None
    assert rig.refusals == [f"{path}: {why}"]
    assert read_state(rig.tmp / "work") is None and pols.reload() == [] and pols.live.revision == revision


def _changed_member(rig: Rig, revision: str) -> bytes:
    from tests.bundle.conftest import repack

    return repack(rig.bundle(revision), {"policy/policy.yaml": b"name: changed\n...\n"})


def test_a_rollback_is_refused_unless_forced(rig: Rig) -> None:
    """With 42 installed, a source offering only 41 is refused naming both revisions; a watcher with
    SEMGOV_BUNDLE_FORCE installs it, and the reload goes back to 41's policy."""
    pols, w = rig.policies(), rig.watcher()
    p42 = rig.drop_bundle("r42.tar.gz", rig.bundle("42", "0.9"))
    w.check(), w.check()
    pols.reload()
    p42.unlink()
    p41 = rig.drop_bundle("r41.tar.gz", rig.bundle("41", "0.7"))
    assert w.check() is None and w.check() is None
    assert rig.refusals == [
        f"{p41}: .manifest: revision 41 is older than the running revision 42: "
        "a rollback is refused unless forced"
    ]
    forced = rig.watcher(force=True)
    assert forced.check() is None and forced.check() is not None
    [loaded] = pols.reload()
    assert loaded.ok and loaded.bundle == "41"
    assert pols.live.revision == load_policy_source(rig.policy_variant("0.7")).revision


def test_the_highest_trusted_revision_wins_and_a_restart_resumes_it(rig: Rig) -> None:
    """Among several bundles the highest revision is installed; a new worker (a restart) decides
    with the installed bundle from the start, and its revision stays the floor."""
    w = rig.watcher()
    for rev in ("7", "12-abc", "9"):
        rig.drop_bundle(f"r{rev}.tar.gz", rig.bundle(rev, f"0.{rev[0]}"))
    w.check()
    assert (w.check() or pytest.fail("nothing installed")).revision == "12-abc"
    again = rig.policies()
    assert again.bundle is not None and again.bundle.revision == "12-abc"
    assert again.live.revision == load_policy_source(rig.policy_variant("0.1")).revision


def test_a_bundle_is_fetched_over_http(rig: Rig) -> None:
    """An http:// source is fetched on the watcher's thread and installed on the same rules."""
    (rig.tmp / "site").mkdir()
    (rig.tmp / "site" / "b.tar.gz").write_bytes(rig.bundle("3"))
    with _serve(rig.tmp / "site") as url:
        w = rig.watcher(f"{url}/b.tar.gz")
        assert w.check() is None
        state = w.check()
    assert state is not None and state.revision == "3" and state.source == f"{url}/b.tar.gz"
    [loaded] = rig.policies().reload() or [None]
    assert loaded is None  # NOTE: a new worker resumed the installed bundle: nothing to reload


def test_the_running_revision_is_a_metric() -> None:
    """semgov:policy_bundle_revision is -1 without a bundle and the revision's number with one."""
    m = HookMetrics()
    assert m.registry.get_sample_value("semgov:policy_bundle_revision") == -1
    m.bundle("20261207065300-3f2a")
    assert m.registry.get_sample_value("semgov:policy_bundle_revision") == 20261207065300


def test_a_bundle_source_needs_trusted_keys(hook_files: HookFiles, tmp_path: Path) -> None:
    """SEMGOV_BUNDLE without SEMGOV_BUNDLE_TRUST, or naming nothing, refuses to start."""
    with pytest.raises(HookConfigError, match="without SEMGOV_BUNDLE_TRUST"):
        HookSettings.from_env(hook_files.env(SEMGOV_BUNDLE=str(tmp_path)))
    with pytest.raises(HookConfigError, match="neither a directory nor an http"):
        HookSettings.from_env(hook_files.env(SEMGOV_BUNDLE=str(tmp_path / "nope")))


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class _serve:
    """A loopback HTTP server for ``root`` while the block runs."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def __enter__(self) -> str:
        handler = lambda *a: _Quiet(*a, directory=str(self.root))  # noqa: E731
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_running_worker_installs_audits_and_reports_its_bundle(rig: Rig, mode: str) -> None:
    """A governor watching the bundle directory installs a trusted bundle (policy_loaded naming
    bundle 42, the revision metric at 42, the decision thread or process deciding with it) and
    audits an untrusted one as policy_load_failed naming the file and the signer."""
    env = {k: v for k, v in rig.env.items() if k.startswith("SEMGOV_BUNDLE")}
    gov = governor(rig.files, mode, SEMGOV_RELOAD_POLL_MS="50", **env)
    gov.watch()
    try:
        before = gov.revision
        rig.drop_bundle("r42.tar.gz", rig.bundle("42"))
        wait_for(lambda: gov.reloads == 1)
        assert gov.revision != before
        assert gov.metrics.registry.get_sample_value("semgov:policy_bundle_revision") == 42
        bad = rig.drop_bundle("r43.tar.gz", rig.bundle("43", signer=make_signer(rig.tmp / "x", "intruder")))
        wait_for(lambda: gov.reload_failures == 1)
        assert gov.wait_idle(30)
    finally:
        gov.close()
    events = {r["kind"]: r["detail"] for r in records(rig.files) if r.get("kind", "").startswith("policy_")}
    assert "from bundle 42 (" in events["policy_loaded"] and "signed by release" in events["policy_loaded"]
    assert (
        f"{bad}: .signatures.json: signed by key 'intruder', which is not trusted"
        in events["policy_load_failed"]
    )
