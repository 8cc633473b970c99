"""The decision process: donor registration, candidate search, decisions and engine-event signing
outside the scheduler's interpreter.

A thread in the scheduler process shares its GIL: under a busy scheduler a decision that takes
5-8 ms on a quiet process was measured coming back after 0.4 s (p50; ``benchmarks/sglang_itl.py``),
and every donor's PII scan and provenance signing stalled the scheduler's own Python the same way.
With ``SEMGOV_DECISION_PROCESS=1`` (the default) the scheduler process keeps only what must be
there: the tree, the audit log (one writer) and a small table of live donors (id, scope, tree key,
tokens). Its decision thread forwards every job, in the order the scheduler thread queued it, to a
child process (``python -m engine_hooks.core.decider``) and never waits for an answer; a reader
thread takes the answers and hands them to
:class:`~engine_hooks.core.decisions.RemoteDecisions`.

The child (:class:`_Child`) holds the candidate provider, the donors' prompts and provenance and
the evaluator, built from the hook's settings (sent first; it reads the same policy, keyring and
key files). Messages, parent to child, each answered in order except ``register`` (answered when
its registration is done, by the child's registration thread) and ``remove``/``stop`` (no answer):

- ``("register", DonorSpec, scope)`` -> ``("registered", donor_id, error | None)``;
- ``("remove", donor_id)``;
- ``("decide", seq, request_id, context, scope, tokens, text, limit)``
  -> ``("decided", seq, [(donor_id, similarity)], [SignedDecision], error | None)``;
  then, when there is a shadow policy, ``("shadow", [SignedDecision])`` (its records);
- ``("event", seq, EventJob)`` -> ``("event", seq, canonical record | None, error | None)``;
- ``("reload", reason)`` -> ``("reloaded", [ReloadOutcome], reason)`` (between two decisions);
- ``("warm", reason)`` -> ``("warmed", reason, seconds, error | None)``: the decision path run once
  on a synthetic input (:mod:`engine_hooks.core.warmup`), here, where decisions are made;
- ``("ping", seq)`` -> ``("pong", seq)`` (everything sent before it is answered);
- ``("stop",)``: finish the registrations in flight, then exit.

Protocol: length-prefixed pickles over the child's stdin/stdout (the child moves whatever else
writes to its stdout to stderr, which is the server's log). Pickle is safe here: both ends are
this package, started by the hook itself, and nothing else can reach the pipes.

NOTE: invariants:
- No deadlock on the pipes: the parent's reader thread always drains the child's stdout, so the
  child never blocks writing; the parent's decision thread may block writing (the child reads
  between jobs), never the scheduler thread.
- The child's provider and donor table change only through the messages the scheduler thread
  queued (its registration thread adds a donor, under the table lock, before saying so); a donor
  becomes visible to the scheduler only once the child has it.
- Any failure of the child (it died, answered junk, could not start) is final for the process:
  no more decisions (requests run cold), loudly logged once; what it still owed is finished by
  the parent (:meth:`~engine_hooks.core.decisions.RemoteDecisions.failed`); the hook never
  waits for a dead child.
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any

from engine_hooks.core.candidates import candidate_entries
from engine_hooks.core.settings import HookConfigError, HookSettings
from semgov.context import RequestContext
from semgov.log import bound, describe_error

_LEN = struct.Struct(">I")


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
    """The scheduler process's side: starts the child, sends jobs (the decision thread) and reads
    answers (its own reader thread, which calls ``on_message`` per answer and ``on_broken`` once
    if the child fails)."""

    def __init__(
        self,
        settings: HookSettings,
        tokenizer_path: str | None,
        *,
        on_message: Callable[[tuple[Any, ...]], None],
        on_broken: Callable[[], None],
        engine_name: str = "",
    ) -> None:
        self.broken: str | None = None
        self._closing = False
        self._lock = threading.Lock()  # NOTE: serializes writers (the decision thread; close())
        self._on_message, self._on_broken = on_message, on_broken
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "engine_hooks.core.decider"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            close_fds=True,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self._in, self._out = self.proc.stdin, self.proc.stdout
        try:
            send(self._in, ("init", settings, tokenizer_path, engine_name))
            ready = recv(self._out)
        except Exception as e:  # noqa: BLE001 - it could not start: say why, at build
            self.proc.kill()
            raise HookConfigError(f"the semgov decision process did not start: {e}") from e
        if not (isinstance(ready, tuple) and ready[:1] == ("ready",)):
            self.proc.kill()
            raise HookConfigError(f"the semgov decision process did not start: {ready!r}"[:500])
        self._reader = threading.Thread(target=self._read_loop, name="semgov-decide-reader", daemon=True)
        self._reader.start()

    def tell(self, msg: tuple[Any, ...]) -> bool:
        """Send one message (never waits for its answer); False once the child is broken."""
        with self._lock:
            if self.broken is not None:
                return False
            try:
                send(self._in, msg)
                return True
            except Exception as e:  # noqa: BLE001 - a dead or confused child: decide nothing more
                self._fail(describe_error(e))
                return False

    def _fail(self, why: str) -> None:
        self.broken = self.broken or why
        self.proc.kill()

    def _read_loop(self) -> None:
        while True:
            try:
                msg = recv(self._out)
                if not isinstance(msg, tuple) or not msg:
                    raise ValueError(f"unexpected answer {type(msg).__name__}")
            except Exception as e:  # noqa: BLE001 - EOF, junk: the child is done for
                if not self._closing:
                    self._fail(describe_error(e))
                    self._on_broken()
                return
            try:
                self._on_message(msg)
            except Exception as e:  # noqa: BLE001 - a handler bug must not stop the answers
                from semgov.log import get_logger

                get_logger().error("semgov decision answer not handled", error=describe_error(e))

    def close(self, timeout: float = 30.0) -> None:
        """Ask the child to stop, then wait for it and for its last answer to be read."""
        with self._lock:
            self._closing = True
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
        self._reader.join(timeout)


def _request_fields(msg: tuple[Any, ...]) -> dict[str, Any]:
    """Log fields of a ``decide`` message: the request's id, tenant and namespace (never raises)."""
    try:
        ctx = msg[3]
        return {
            "request_id": msg[2],
            "tenant": getattr(ctx, "tenant", None),
            "namespace": getattr(ctx, "namespace", None),
        }
    except Exception:  # noqa: BLE001 - a malformed message still gets its line
        return {}


class _Child:
    """The decision process: answers the parent's messages (see the module docstring)."""

    def __init__(
        self, out: IO[bytes], settings: HookSettings, tokenizer_path: str | None, engine: str
    ) -> None:
        from engine_hooks.core.donors import load_detokenizer
        from engine_hooks.core.metrics import hook_metrics
        from engine_hooks.core.policies import HookPolicies, load_own_key, open_capture
        from engine_hooks.core.providers import load_provider

        self.out = out
        self.settings = settings
        self.engine = engine
        self.key = load_own_key(settings)
        capture = open_capture(settings)
        # NOTE: the capture's counters are this process's (with SGLang's --enable-metrics they join
        # the server's /metrics through the multiprocess directory this process inherits).
        self.policies = HookPolicies(
            settings, self.key, capture=capture, metrics=hook_metrics() if capture is not None else None
        )
        self.provider = load_provider(settings.provider, max_donors_per_scope=settings.max_donors_per_scope)
        self.detokenize = load_detokenizer(settings.detokenizer, tokenizer_path)
        self.donors: dict[str, Any] = {}
        self._table = threading.Lock()  # NOTE: the provider and the donor table, between two threads
        self._write = threading.Lock()
        self._todo: queue.SimpleQueue[tuple[Any, str] | None] = queue.SimpleQueue()
        self._worker = threading.Thread(target=self._register_loop, name="semgov-donors", daemon=True)
        self._worker.start()

    def send(self, msg: tuple[Any, ...]) -> None:
        with self._write:
            send(self.out, msg)

    def serve(self, inp: IO[bytes]) -> int:
        from semgov.log import get_logger

        while True:
            msg = recv(inp)
            kind = msg[0]
            if kind == "stop":
                self._todo.put(None)
                self._worker.join()
                if self.policies.capture is not None:
                    self.policies.capture.close()
                return 0
            try:
                self.handle(msg)
            except Exception as e:  # noqa: BLE001 - one bad message decides nothing; the process goes on
                fields = _request_fields(msg) if kind == "decide" else {}
                get_logger().warning(
                    "semgov decision process error", kind=kind, error=describe_error(e), **fields
                )
                if kind == "decide":
                    self.send(("decided", msg[1], [], [], describe_error(e)))
                elif kind == "event":
                    self.send(("event", msg[1], None, describe_error(e)))
                elif kind == "ping":
                    self.send(("pong", msg[1]))

    def handle(self, msg: tuple[Any, ...]) -> None:
        from engine_hooks.core.events import sign_event_job

        kind = msg[0]
        if kind == "register":
            self._todo.put((msg[1], msg[2]))
        elif kind == "remove":
            with self._table:
                self.donors.pop(msg[1], None)
                self.provider.remove(msg[1])
        elif kind == "decide":
            with bound(**_request_fields(msg)):
                self._decide(msg)
        elif kind == "reload":
            self.send(("reloaded", self.policies.reload(), msg[1]))
        elif kind == "warm":
            self._warm(msg[1])
        elif kind == "event":
            self.send(("event", msg[1], sign_event_job(msg[2], self.engine, self.key).canonical, None))
        elif kind == "ping":
            self.send(("pong", msg[1]))
        else:
            raise ValueError(f"unknown message {kind!r}")

    def _warm(self, reason: str) -> None:
        """Warm the decision path here (the provider, the policies, the keys are this process's)."""
        from engine_hooks.core.warmup import warm_decision_path

        with self._table:  # NOTE: the registration thread shares the provider
            w = warm_decision_path(
                self.policies,
                self.provider,
                settings=self.settings,
                signing_key=self.key,
                detokenize=self.detokenize,
                reason=reason,
            )
        self.send(("warmed", w.reason, w.seconds, w.error))

    def _decide(self, msg: tuple[Any, ...]) -> None:
        """One recipient's candidates and live decision, answered at once; the shadow after."""
        _, seq, request_id, ctx, scope, token_ids, text, limit = msg
        with self._table:
            found = candidate_entries(
                self.donors, scope, self.provider.query(scope, token_ids, text, limit=limit)
            )
        live = (
            self.policies.decide_live(datetime.now(UTC), request_id, ctx, token_ids, text, found)
            if found
            else None
        )
        decisions = live.decisions if live is not None else []
        self.send(("decided", seq, [(e.donor_id, sim) for e, sim in found], decisions, None))
        if live is not None:
            with bound(decision_ids=[str(d.record["decision_id"]) for d in decisions]):
                shadow = self.policies.decide_shadow(live)  # NOTE: after the live answer is sent
            if shadow:
                self.send(("shadow", shadow))

    def _register_loop(self) -> None:
        from engine_hooks.core.donors import build_donor_entry

        while (job := self._todo.get()) is not None:
            spec, scope = job
            try:
                live = self.policies.live  # NOTE: read once: a reload may swap it meanwhile
                entry = build_donor_entry(
                    spec,
                    scope,
                    evaluator=live.evaluator,
                    detokenize=self.detokenize,
                    signing_key=self.key,
                    policy_version=live.version,
                    ttl_s=self.settings.donor_ttl_s,
                    now=datetime.now(UTC),
                )
                with self._table:
                    self.donors[entry.donor_id] = entry
                    self.provider.add(entry.donor_id, entry.scope, entry.token_ids, entry.prompt.text)
            except Exception as e:  # noqa: BLE001 - a donor that cannot be registered is simply not a donor
                from semgov.log import describe_error

                self.send(("registered", spec.donor_id, describe_error(e)))
                continue
            self.send(("registered", entry.donor_id, None))


def _serve(inp: IO[bytes], out: IO[bytes]) -> int:
    try:
        init = recv(inp)
        if not (isinstance(init, tuple) and init[:1] == ("init",) and isinstance(init[1], HookSettings)):
            raise ValueError(f"expected the hook's settings first, got {type(init).__name__}")
        _, settings, tokenizer_path, engine = init
        if settings.log_format is not None:
            from semgov import log

            log.configure(settings.log_format)
        child = _Child(out, settings, tokenizer_path, engine)
    except Exception as e:  # noqa: BLE001 - reported to the parent, which refuses to build
        send(out, ("error", f"{type(e).__name__}: {e}"))
        return 1
    child.send(("ready", os.getpid()))
    return child.serve(inp)


def main() -> int:
    """The child: protocol on the original stdout, everything else written to stdout goes to stderr."""
    proto_out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    try:
        return _serve(sys.stdin.buffer, proto_out)
    except EOFError:
        return 0  # the scheduler process went away


__all__ = ["DecisionProcess", "RequestContext", "main"]

if __name__ == "__main__":
    raise SystemExit(main())
