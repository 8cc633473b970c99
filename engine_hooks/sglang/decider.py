"""The decision process: candidate search and semgov decisions outside the scheduler's interpreter.

A decision thread in the scheduler process shares its GIL: under a busy scheduler a decision
that takes 5-8 ms on a quiet process was measured coming back after 0.4 s (p50;
``benchmarks/sglang_itl.py``). With ``SEMGOV_DECISION_PROCESS=1`` (the default) the decision
thread only forwards, in order, each donor ``add``/``remove`` and each recipient's request to a
child process (``python -m engine_hooks.sglang.decider``), which holds the candidate provider
and the donors' prompts and provenance, and builds the evaluator from the hook's settings (sent
first; it reads the same policy, keyring and key files). It answers each request with the candidates it
found and their signed decisions; the scheduler process audits them (the audit log has one
writer) and acts on them. While the decision thread waits for the answer it holds no lock.

Protocol: length-prefixed pickles over the child's stdin/stdout (the child moves whatever else
writes to its stdout to stderr, which is the server's log). Pickle is safe here: both ends are
this package, started by the hook itself, and nothing else can reach the pipes.

NOTE: invariants:
- One request in flight at a time, answered in order: an answer always belongs to the request
  just sent.
- The child's provider and donor table change only through the messages the scheduler thread
  queued, in the order it queued them with the requests.
- Any failure of the child (it died, answered junk, could not start) is final for the process:
  no more decisions (requests run cold), loudly logged; the hook never waits for a dead child.
"""

from __future__ import annotations

import os
import pickle
import struct
import subprocess
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import IO, Any

from engine_hooks.sglang.context import RequestContext
from engine_hooks.sglang.settings import HookConfigError, HookSettings

_LEN = struct.Struct(">I")
START_TIMEOUT_S = 120.0


def send(f: IO[bytes], obj: object) -> None:
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    f.write(_LEN.pack(len(data)) + data)
    f.flush()


def recv(f: IO[bytes]) -> Any:
    head = f.read(_LEN.size)
    if len(head) < _LEN.size:
        raise EOFError("the decision process closed its pipe")
    (n,) = _LEN.unpack(head)
    data = f.read(n)
    if len(data) < n:
        raise EOFError("the decision process closed its pipe mid-answer")
    return pickle.loads(data)


class DecisionProcess:
    """The scheduler process's side: starts the child and talks to it (the decision thread only)."""

    def __init__(self, settings: HookSettings) -> None:
        self.broken: str | None = None
        self._lock = threading.Lock()  # NOTE: the decision thread is the only caller; close() too
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine_hooks.sglang.decider"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout
        try:
            send(self._in, ("init", settings))
            ready = recv(self._out)
        except Exception as e:  # noqa: BLE001 - it could not start: say why, at build
            self.proc.kill()
            raise HookConfigError(f"the semgov decision process did not start: {e}") from e
        if not (isinstance(ready, tuple) and ready[:1] == ("ready",)):
            self.proc.kill()
            raise HookConfigError(f"the semgov decision process did not start: {ready!r}"[:500])

    def tell(self, msg: tuple[Any, ...]) -> None:
        """Send a message that has no answer (donor add/remove)."""
        self._call(msg, answer=False)

    def ask(self, msg: tuple[Any, ...]) -> Any:
        """Send a request and wait (off the scheduler thread) for its answer; None once broken."""
        return self._call(msg, answer=True)

    def _call(self, msg: tuple[Any, ...], *, answer: bool) -> Any:
        with self._lock:
            if self.broken is not None:
                return None
            try:
                send(self._in, msg)
                return recv(self._out) if answer else None
            except Exception as e:  # noqa: BLE001 - a dead or confused child: decide nothing more
                self.broken = f"{type(e).__name__}: {e}"
                self.proc.kill()
                return None

    def close(self, timeout: float = 10.0) -> None:
        with self._lock:
            if self.broken is None:
                try:
                    send(self._in, ("stop",))
                except Exception:  # noqa: BLE001 - it is going away either way
                    pass
            self.broken = self.broken or "closed"
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout)


def candidate_entries(donors: dict[str, Any], scope: str, matches: Sequence[Any]) -> list[tuple[Any, float]]:
    """The provider's matches that are registered donors of exactly this scope, in order."""
    out = []
    for m in matches:
        entry = donors.get(m.donor_id)
        # NOTE: scope is checked here too: isolation never rests on the provider alone.
        if entry is not None and entry.scope == scope:
            out.append((entry, m.similarity))
    return out


def _serve(inp: IO[bytes], out: IO[bytes]) -> int:
    from engine_hooks.sglang.governor import build_evaluator, evaluate_request
    from engine_hooks.sglang.provider import load_provider
    from semgov._internal.log import get_logger
    from semgov.keys import Keyring, load_signing_key
    from semgov.policy_source import load_policy_source

    try:
        init = recv(inp)
        if not (isinstance(init, tuple) and init[:1] == ("init",) and isinstance(init[1], HookSettings)):
            raise ValueError(f"expected the hook's settings first, got {type(init).__name__}")
        settings = init[1]
        policy = load_policy_source(settings.policy)
        evaluator = build_evaluator(
            settings, policy, Keyring.load(settings.trust), load_signing_key(settings.signing_key)
        )
        provider = load_provider(settings.provider, max_donors_per_scope=settings.max_donors_per_scope)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which refuses to build
        send(out, ("error", f"{type(e).__name__}: {e}"))
        return 1
    send(out, ("ready", os.getpid()))
    donors: dict[str, Any] = {}
    while True:
        msg = recv(inp)
        kind = msg[0]
        if kind == "stop":
            return 0
        try:
            if kind == "add":
                entry = msg[1]
                donors[entry.donor_id] = entry
                provider.add(entry.donor_id, entry.scope, entry.token_ids, entry.prompt.text)
                evaluator.ctx.donors.get(entry.prompt)  # its tokens and hashes, prepared once, here
            elif kind == "remove":
                donors.pop(msg[1], None)
                provider.remove(msg[1])
            elif kind == "decide":
                _, request_id, ctx, scope, token_ids, text, limit = msg
                found = candidate_entries(donors, scope, provider.query(scope, token_ids, text, limit=limit))
                decisions = (
                    evaluate_request(evaluator, datetime.now(UTC), request_id, ctx, token_ids, text, found)
                    if found
                    else []
                )
                send(out, ("decided", [(e.donor_id, sim) for e, sim in found], decisions, None))
        except Exception as e:  # noqa: BLE001 - one bad request decides nothing; the process goes on
            get_logger().warning("semgov decision process error", kind=kind, error=f"{type(e).__name__}: {e}")
            if kind == "decide":
                send(out, ("decided", [], [], f"{type(e).__name__}: {e}"))


def main() -> int:
    """The child: protocol on the original stdout, everything else written to stdout goes to stderr."""
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        return _serve(sys.stdin.buffer, proto_out)
    except EOFError:
        return 0  # the scheduler process went away


__all__ = ["DecisionProcess", "RequestContext", "candidate_entries", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
