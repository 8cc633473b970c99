"""When the hook reloads its policies: on SIGHUP, or when a watched file changes.

:class:`ReloadWatcher` polls the files the hook decides with (the live and shadow policy, a file
or every file under a directory, and the trust keyring) every ``SEMGOV_RELOAD_POLL_MS`` on its
own thread (``semgov-reload``) and calls ``request`` when their stat fingerprint changes;
:func:`install_sighup` makes ``SIGHUP`` do the same. ``request`` only queues a reload job for the
decision thread (:meth:`engine_hooks.sglang.governor.Governor.request_reload`), which runs it
between two decisions: the scheduler thread never loads a policy.

NOTE: a changed fingerprint only asks; what is reloaded is decided by content (revision and
keyring digest), so a touched file or a half-written one costs a load attempt, never a wrong
policy: a file that does not load leaves the old policy deciding (audited), and the watcher asks
again at the next change. Write policies atomically (a new file renamed over the old one) so the
watcher never sees half of one.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from types import FrameType

from semgov.log import describe_error, get_logger

Fingerprint = tuple[tuple[str, int, int, int], ...]

_MAX_FILES = 10_000  # NOTE: a policy directory is a handful of files; bound the walk anyway


def fingerprint(paths: Iterable[Path]) -> Fingerprint:
    """``(path, mtime_ns, size, inode)`` of every file at or under ``paths`` (missing: ``-1``s)."""
    out: list[tuple[str, int, int, int]] = []
    for root in paths:
        files = [root]
        if root.is_dir():
            files = []
            for dirpath, dirnames, names in os.walk(root):
                dirnames.sort()
                files += [Path(dirpath) / n for n in sorted(names)]
                if len(files) > _MAX_FILES:
                    break
        for f in files[:_MAX_FILES]:
            try:
                st = f.stat()
                out.append((str(f), st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                out.append((str(f), -1, -1, -1))
    return tuple(out)


class ReloadWatcher:
    """Polls ``paths`` every ``poll_s`` seconds; calls ``request(reason)`` when they change."""

    def __init__(self, paths: Iterable[Path], poll_s: float, request: Callable[[str], None]) -> None:
        self.paths = tuple(paths)
        self.poll_s = poll_s
        self.request = request
        self.changes = 0
        self._last = fingerprint(self.paths)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="semgov-reload", daemon=True)
        self._thread.start()

    def check(self) -> bool:
        """Compare the files with the last look; ask for a reload when they differ."""
        now = fingerprint(self.paths)
        if now == self._last:
            return False
        self._last = now
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
