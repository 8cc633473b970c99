"""Signed policy bundles for a running worker: fetched, verified and unpacked off the hot path.

:class:`BundleWatcher` (thread ``semgov-bundle``, every ``SEMGOV_RELOAD_POLL_MS``) reads the bundle
source (``SEMGOV_BUNDLE``: a directory of ``*.tar.gz`` bundles, hidden entries and temporary copies
skipped, or an ``http(s)://`` URL, fetched with a timeout and a size limit) and installs a bundle
only when it is

- **complete and stable**: the same bytes at two consecutive polls;
- **signed by a trusted key** (``SEMGOV_BUNDLE_TRUST``) with every member's digest as signed
  (:func:`semgov.bundle.bundle.verify_bundle`);
- **not older** than the installed revision, unless ``SEMGOV_BUNDLE_FORCE`` (among several
  bundles the highest revision is the candidate).

Installing means: unpack the bundle's policy and keyring into the work directory
(``SEMGOV_BUNDLE_WORK_DIR``), write ``current.json`` naming it (atomically), and ask for a reload.
The reload runs between two decisions on the decision thread (or in the decision process), like
any policy reload: :meth:`engine_hooks.core.policies.HookPolicies.reload` sees the new
``current.json`` and decides with the unpacked policy and keyring, audited as ``policy_loaded``
with the bundle's revision. A bundle that is refused is reported through ``refused`` (audited as
``policy_load_failed``, naming the bundle file and the problem) once per distinct bundle.

NOTE: ``current.json`` also outlives the process: a restarted worker resumes the bundle it ran,
and its revision stays the floor a new bundle must not go below.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import threading
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

from semgov.bundle.archive import MAX_COMPRESSED_BYTES
from semgov.bundle.bundle import KEYRING, POLICY_DIR, VerifiedBundle, check_order, verify_bundle
from semgov.bundle.files import unpack
from semgov.bundle.jws import TrustedBundleKey
from semgov.errors import BundleError
from semgov.log import describe_error, get_logger
from semgov.policy.files import skipped_name

STATE_FILE = "current.json"
_MAX_CANDIDATES = 64
_HTTP_TIMEOUT_S = 10.0


@dataclass(frozen=True, slots=True)
class InstalledBundle:
    """The bundle a worker decides with (``current.json``)."""

    revision: str
    digest: str
    key_id: str
    source: str
    dir: str

    @property
    def policy(self) -> Path:
        return Path(self.dir) / POLICY_DIR

    @property
    def keyring(self) -> Path:
        return Path(self.dir) / KEYRING

    def describe(self) -> str:
        return f"bundle {self.revision} ({self.source}, signed by {self.key_id}, {self.digest})"


def read_state(work: Path) -> InstalledBundle | None:
    """The installed bundle named by ``work/current.json``; None if none (or unreadable: logged)."""
    try:
        doc = json.loads((work / STATE_FILE).read_text())
        state = InstalledBundle(**{k: str(doc[k]) for k in ("revision", "digest", "key_id", "source", "dir")})
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        get_logger().error(
            "semgov bundle state unreadable", file=str(work / STATE_FILE), error=describe_error(e)
        )
        return None
    return state if Path(state.dir).is_dir() else None


def write_state(work: Path, state: InstalledBundle) -> None:
    tmp = work / f".{STATE_FILE}.tmp"
    tmp.write_text(json.dumps(asdict(state), indent=1) + "\n")
    os.replace(tmp, work / STATE_FILE)


def _read_file(path: Path) -> bytes:
    with path.open("rb") as f:
        return f.read(MAX_COMPRESSED_BYTES + 1)


class _Http:
    """GET the bundle URL, with ``If-None-Match`` once the server gave an ETag."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.etag: str | None = None
        self.body: bytes | None = None

    def get(self) -> bytes:
        req = urllib.request.Request(self.url, headers={"If-None-Match": self.etag} if self.etag else {})
        try:
            with urllib.request.urlopen(req, timeout=_HTTP_TIMEOUT_S) as resp:  # noqa: S310 - configured URL
                body: bytes = resp.read(MAX_COMPRESSED_BYTES + 1)
                self.etag, self.body = resp.headers.get("ETag"), body
                return body
        except urllib.error.HTTPError as e:
            if e.code == 304 and self.body is not None:
                return self.body
            raise


class BundleWatcher:
    """Polls the bundle source; installs the best trusted, newer bundle (see the module docstring)."""

    def __init__(
        self,
        source: str,
        trust: dict[str, TrustedBundleKey],
        work: Path,
        *,
        force: bool,
        request: Callable[[str], None],
        refused: Callable[[str], None],
        poll_s: float = 1.0,
        start: bool = True,
    ) -> None:
        self.source, self.trust, self.work, self.force = source, trust, work, force
        self.request, self.refused, self.poll_s = request, refused, poll_s
        self.installs = 0
        self._http = _Http(source) if source.startswith(("http://", "https://")) else None
        self._last: dict[str, str] = {}  # name -> digest at the previous poll
        self._verdicts: dict[tuple[str, str], VerifiedBundle | None] = {}
        self._reported: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="semgov-bundle", daemon=True)
        if start:
            self._thread.start()

    def _candidates(self) -> dict[str, bytes]:
        if self._http is not None:
            return {self.source: self._http.get()}
        names = sorted(n for n in os.listdir(self.source) if n.endswith(".tar.gz") and not skipped_name(n))
        return {
            str(Path(self.source) / n): _read_file(Path(self.source) / n) for n in names[:_MAX_CANDIDATES]
        }

    def _report(self, key: str, message: str) -> None:
        """Report a refusal once per distinct bundle and problem."""
        if key not in self._reported:
            self._reported.add(key)
            get_logger().error("semgov bundle refused", problem=message[:500])
            self.refused(message)

    def _verified(self, stable: dict[str, bytes]) -> list[VerifiedBundle]:
        out = []
        for name, data in stable.items():
            key = (name, self._last[name])
            if key not in self._verdicts:
                try:
                    verdict = verify_bundle(data, self.trust, source=name)
                    verdict.policy_files()  # NOTE: refused here, not at install, if not ours
                    self._verdicts[key] = verdict
                except BundleError as e:
                    self._verdicts[key] = None
                    self._report(f"{key}", e.diagnostic())
            if (v := self._verdicts[key]) is not None:
                out.append(v)
        return out

    def check(self) -> InstalledBundle | None:
        """One poll: the bundle installed by it, or None."""
        try:
            seen = self._candidates()
        except (OSError, http.client.HTTPException, ValueError) as e:
            self._report(f"fetch:{e}", f"{self.source}: cannot fetch bundles ({describe_error(e)})")
            return None
        digests = {n: "sha256:" + hashlib.sha256(b).hexdigest() for n, b in seen.items()}
        stable = {n: b for n, b in seen.items() if self._last.get(n) == digests[n]}
        self._last = digests
        self._verdicts = {k: v for k, v in self._verdicts.items() if digests.get(k[0]) == k[1]}
        verified = self._verified(stable)
        if not verified:
            return None
        best = max(verified, key=lambda v: (v.number, v.revision))
        running = read_state(self.work)
        if running is not None and running.digest == best.digest:
            return None
        try:
            check_order(
                best.revision, running.revision if running else None, source=best.source, force=self.force
            )
            where = unpack(best, self.work)
        except BundleError as e:
            self._report(f"{best.digest}:{running.revision if running else ''}", e.diagnostic())
            return None
        state = InstalledBundle(best.revision, best.digest, best.key_id, best.source, str(where))
        write_state(self.work, state)
        self.installs += 1
        self.request(f"bundle {best.revision}")
        return state

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception as e:  # noqa: BLE001 - a watcher bug must not stop the engine
                get_logger().warning("semgov bundle watcher failed", error=describe_error(e))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)


__all__ = ["STATE_FILE", "BundleWatcher", "InstalledBundle", "read_state", "write_state"]
