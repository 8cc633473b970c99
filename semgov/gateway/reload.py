"""The gateway's files, and reloading them on the hook's rules.

The tenants file and the context key are read at start: a bad one stops the gateway, naming the
file, the line and the problem. After that they are watched, as the engine hook watches its
policy (engine_hooks/core/reload.py): every ``poll_s`` the content hash of both files is taken,
and a change is loaded only once the hashes read the same at two consecutive polls (a copy still
being written is never loaded); ``SIGHUP`` asks at once. A reload installs both files together
or neither: a file that does not load (or changed while it was read) leaves the running ones in
place, logged (``gateway reload refused``) and counted (``semgov_gateway_reloads{outcome}``).
Deploy by writing a new file and renaming it over the old one.

Rotating the context key: give the engines the new key as ``SEMGOV_CONTEXT_KEY`` and the old one
as ``SEMGOV_CONTEXT_KEY_PREVIOUS`` first, then replace the gateway's key file: from the reload on,
tokens are minted under the new key (docs/gateway.md, "Rotating the context key").
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from semgov.errors import InputError
from semgov.gateway.metrics import GatewayMetrics
from semgov.gateway.tenants import Tenants, load_tenants
from semgov.log import get_logger

__all__ = ["Reloader", "read_context_key"]

MIN_KEY_BYTES = 32


def read_context_key(path: Path) -> bytes:
    """The context key in ``path`` (surrounding whitespace stripped; raises :class:`InputError`)."""
    try:
        raw = path.read_bytes().strip()
    except OSError as e:
        raise InputError(f"cannot read the context key ({e.strerror or e})", source=str(path)) from e
    if len(raw) < MIN_KEY_BYTES:
        raise InputError(
            f"the context key must be at least {MIN_KEY_BYTES} bytes, got {len(raw)}", source=str(path)
        )
    return raw


def _hash(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as e:
        return f"unreadable: {e.strerror or e}"


class Reloader:
    """The live tenants and context key; :meth:`reload` swaps both in, or neither."""

    def __init__(self, tenants: Path, context_key: Path, metrics: GatewayMetrics) -> None:
        self.paths = (tenants, context_key)
        self.metrics = metrics
        self._seen = self.fingerprint()
        self.tenants: Tenants = load_tenants(tenants)
        self.context_key: bytes = read_context_key(context_key)
        self._asked = self._seen
        self.reloads = 0
        metrics.tenants.set(len(self.tenants.by_hash))

    def fingerprint(self) -> tuple[str, ...]:
        return tuple(_hash(p) for p in self.paths)

    def reload(self, reason: str) -> bool:
        """Load both files; install them only if both load and neither changed meanwhile."""
        before = self.fingerprint()
        try:
            tenants = load_tenants(self.paths[0])
            key = read_context_key(self.paths[1])
            if self.fingerprint() != before:
                raise InputError("a file changed while it was read; the next poll tries again")
        except InputError as e:
            self.metrics.reloads.labels("refused").inc()
            get_logger().error("gateway reload refused", reason=reason, problem=e.diagnostic())
            return False
        rotated = key != self.context_key
        self.tenants, self.context_key = tenants, key
        self.reloads += 1
        self.metrics.reloads.labels("ok").inc()
        self.metrics.tenants.set(len(tenants.by_hash))
        get_logger().info(
            "gateway reloaded", reason=reason, keys=len(tenants.by_hash), context_key_rotated=rotated
        )
        return True

    def check(self) -> bool:
        """One poll: reload when the files changed since the last reload and read the same twice."""
        now = self.fingerprint()
        settled, self._seen = now == self._seen, now
        if not settled or now == self._asked:
            return False
        self._asked = now
        return self.reload("file changed")

    async def poll_forever(self, poll_s: float) -> None:
        while True:
            await asyncio.sleep(poll_s)
            try:
                self.check()
            except Exception as e:  # noqa: BLE001 - a watcher bug must not stop the gateway
                get_logger().error("gateway reload watcher failed", error=f"{type(e).__name__}: {e}"[:300])
