"""When the hook reloads its policies: on SIGHUP, or when a watched file changes and then settles.

:class:`ReloadWatcher` polls the files the hook decides with (the live and shadow policy: a file, or
the ``policy.yaml`` and ``*.rego`` files of a directory, never hidden entries or temporary copies,
:mod:`semgov.policy.files`; and the trust keyring) every ``SEMGOV_RELOAD_POLL_MS`` on its own
thread (``semgov-reload``). Their fingerprint is the content hash of every file read. It calls
``request`` only once a new fingerprint is *stable*: the same at two consecutive polls, so a copy
still being written (its hash changes from one poll to the next) is never asked for.
:func:`install_sighup` makes ``SIGHUP`` ask too. ``request`` only queues a reload job for the
decision thread (:meth:`engine_hooks.core.governor.Governor.request_reload`), which runs it
between two decisions: the scheduler thread never loads a policy. The reload itself
(:meth:`engine_hooks.core.policies.HookPolicies.reload`) reads the fingerprint again before and
after loading and installs nothing that changed while it was read.

NOTE: stability is a heuristic (a writer may pause longer than a poll): what makes a partly
written file harmless is that it does not load. A YAML policy must end with the document end
marker ``...`` (:mod:`semgov.policy.yaml.model`) and a keyring is one JSON object, so a
truncated copy of either is refused (audited, the old one keeps deciding). Deploy by writing a new
file and renaming it over the old one (docs/operations.md "Deploying a policy").
"""

from __future__ import annotations

import hashlib
import signal
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType

from semgov.log import describe_error, get_logger
from semgov.policy.files import policy_paths

Fingerprint = tuple[tuple[str, str], ...]

_CHUNK = 1 << 20


def _content_hash(path: Path) -> str:
    """``sha256:<hex>`` of the file's bytes, or ``missing`` / ``unreadable: <why>``."""
    try:
        h = hashlib.sha256()
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
        return "sha256:" + h.hexdigest()
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable: {e.strerror or e}"


def fingerprint(paths: Iterable[Path]) -> Fingerprint:
    """``(path, content hash)`` of every file loading ``paths`` reads
    (:func:`semgov.policy.files.policy_paths`: hidden entries and temporary copies never count)."""
    return tuple((str(f), _content_hash(f)) for root in paths for f in policy_paths(root))


class ReloadWatcher:
    """Polls ``paths`` every ``poll_s`` seconds; calls ``request(reason)`` once they changed and
    then read the same at two consecutive polls."""

    def __init__(self, paths: Iterable[Path], poll_s: float, request: Callable[[str], None]) -> None:
        self.paths = tuple(paths)
        self.poll_s = poll_s
        self.request = request
        self.changes = 0
        self._last = fingerprint(self.paths)  # what the last poll saw
        self._asked = self._last  # what the last request (or the start) was for
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="semgov-reload", daemon=True)
        self._thread.start()

    def check(self) -> bool:
        """Look at the files; ask for a reload when they differ from what was last asked for and
        are what the previous look saw (stable across two polls)."""
        now = fingerprint(self.paths)
        settled, self._last = now == self._last, now
        if not settled or now == self._asked:
            return False
        self._asked = now
        self.changes += 1
        self.request("file changed")
        return True

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.check()
            except Exception as e:  # noqa: BLE001 - a watcher bug must not stop the engine
                get_logger().warning("semgov reload watcher failed", error=describe_error(e))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def install_sighup(request: Callable[[str], None]) -> bool:
    """Make SIGHUP ask for a reload (chaining a handler that was there); False when this is not
    the main thread (Python installs signal handlers there only) or the platform has no SIGHUP."""
    if not hasattr(signal, "SIGHUP") or threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.getsignal(signal.SIGHUP)

    def on_hup(signum: int, frame: FrameType | None) -> None:
        # NOTE: a signal handler runs between bytecodes of the main thread (the scheduler): it only
        # queues the reload, like the watcher.
        request("SIGHUP")
        if callable(previous):
            previous(signum, frame)

    try:
        signal.signal(signal.SIGHUP, on_hup)
    except (ValueError, OSError):
        return False
    return True


__all__ = ["ReloadWatcher", "fingerprint", "install_sighup"]
