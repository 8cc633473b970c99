"""Canaries: a sample of realized shifted reuses is replayed cold and compared, per scope.

A shifted span's KV was computed behind another prefix; re-rotated and partly recomputed it is
close to a cold prefill, not equal, and on some models and tasks that changes answers (issue 14;
``benchmarks/realization_quality.py``). Calibration (``semgov calibrate``) measures that before
deployment; canaries keep measuring it in production:

1. When a request that received shifted KV finishes normally and a cold replay through
   ``/generate`` can be the same computation (:func:`replay_params`: plainly greedy, no adapter,
   media, embeddings or positional overrides), it is sampled with probability
   ``SEMGOV_CANARY_RATE`` (always while its scope is on probation): its prompt, sampling
   parameters and first ``SEMGOV_CANARY_TOKENS`` output tokens are queued
   (:meth:`CanaryBook.offer`, scheduler thread, bounded queue, bounded share per tenant).
2. The runner thread (:class:`CanaryRunner`) sends one queued canary at a time to the server's own
   ``/generate`` when the scheduler saw no waiting request for a while (idle enough): the same
   prompt, the request's own sampling parameters (sent explicitly), exactly as many tokens,
   ``ignore_eos``. Its ``extra_key`` is a canary marker
   (:class:`CanaryMarker`, a MAC under a per-boot secret no client holds), so the hook gives it
   an exact-prefix key of its own (no cache hit: a cold prefill), no semantic reuse, and never
   makes it a donor.
3. The cold tokens are compared with the warm ones. Per scope, the request's (tenant, namespace,
   LoRA adapter, task, response contract: :class:`Scope`), the book counts canaries and
   regressions; once regressions exceed
   ``SEMGOV_CANARY_BUDGET``, shifted reuse is off for that scope: the hook copies only approved
   prefix spans there (the signed decisions are unchanged; realizations say what was copied).

Every comparison is audited (engine event ``canary``) and so is a scope turned off
(``shifted_reuse_disabled``). A scope is on probation until ``SEMGOV_CANARY_PROBATION`` of its
canaries matched: only replayable requests get shifted KV there. Every counted scope is kept in
``canary-state.json`` in the audit directory with the policy revision it was found under: a
restart keeps them; deploying another policy revision (recalibrated, or forbidding shifted reuse
there) clears them. That is how the switch is reversed: by policy, never by a client or a
restart. A missing or damaged state file trusts nothing unmeasured (fail closed).

Cost: each canary is one cold prefill of the prompt plus ``SEMGOV_CANARY_TOKENS`` decode steps on
the server, sent only when idle, one at a time; the scheduler thread only samples and queues.
Off by default (``SEMGOV_CANARY_RATE=0``). Not with tensor parallelism (every rank would have to
agree on the disabled scopes; refused at build).

NOTE: :class:`CanaryBook` is pure bookkeeping (no I/O, no threads): it queues what the caller
drains (``take_events``), as vLLM's block pool queues KV events.
"""

# NOTE: long module: one mechanism: the per-scope canary state machine, its sampling and
# replay queue and the comparison, which change together.

from __future__ import annotations

import collections
import hashlib
import hmac
import http.client
import json
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from semgov.log import describe_error, get_logger

CANARY_PREFIX = "semgov-canary:"
STATE_FILE = "canary-state.json"
STATE_SCHEMA = "semgov.canary_state/v2"


@dataclass(frozen=True, slots=True)
class CanarySettings:
    """``SEMGOV_CANARY_*``: the sampling rate (0: off), tokens compared, regressions tolerated per
    scope, queue bound (and each tenant's share of it), the replay's timeout, how long the scheduler
    must have had no waiting request before a replay is sent, and the matching canaries a scope
    needs before shifted reuse is trusted there beyond the requests a canary can check (0: trusted
    unmeasured), and the most scopes counted."""

    rate: float = 0.0
    tokens: int = 16
    budget: int = 0
    queue: int = 16
    timeout_s: float = 300.0
    idle_ms: int = 200
    tenant_queue: int = 4
    probation: int = 0
    max_scopes: int = 65536


class Scope(NamedTuple):
    """A canary scope: the request's whole isolation scope (tenant, namespace, LoRA adapter) and what
    it asks for (task, response contract). One tenant's regressions never count in another's scope.

    NOTE: the cache salt is left out: it only partitions a tenant's own traffic, so leaving it out
    makes a regression under one salt count for the tenant's other salts (stricter, never looser).
    """

    tenant: str
    namespace: str
    task_id: str
    task_version: str
    contract_id: str
    contract_sha256: str
    adapter: str  # the request's LoRA id ("" without one)


def scope_of(ctx: Any) -> Scope:
    """The canary scope of a verified request context (a
    :class:`~semgov.context.RequestContext`)."""
    task, contract = ctx.task, ctx.response_contract
    return Scope(
        ctx.tenant,
        ctx.namespace,
        task["id"],
        task["version"],
        contract["id"],
        contract["schema_sha256"],
        ctx.lora_id or "",
    )


def _scope_doc(scope: Scope) -> dict[str, Any]:
    return {
        "tenant": scope.tenant,
        "namespace": scope.namespace,
        "task": {"id": scope.task_id, "version": scope.task_version},
        "response_contract": {"id": scope.contract_id, "schema_sha256": scope.contract_sha256},
        "lora_id": scope.adapter or None,
    }


def _scope_from_doc(item: Any) -> Scope:
    """A scope from its state-file form (raises KeyError, TypeError or ValueError when malformed)."""
    lora = item["lora_id"]
    s = Scope(
        item["tenant"],
        item["namespace"],
        item["task"]["id"],
        item["task"]["version"],
        item["response_contract"]["id"],
        item["response_contract"]["schema_sha256"],
        "" if lora is None else lora,
    )
    if not all(type(x) is str for x in s):
        raise TypeError("scope fields must be strings")
    return s


def describe(scope: Scope) -> str:
    """A scope for a log line or an event's detail (JSON: no two scopes print alike)."""
    return json.dumps(_scope_doc(scope), sort_keys=True)


def plain_greedy(req: Any) -> bool:
    """Whether SGLang decodes ``req`` with plain greedy sampling, so a cold replay with the same
    prompt must give the same tokens: top-k 1 (SGLang's form of temperature 0), one sequence, no
    penalties, grammar, logit bias, watermark, custom parameters or processor. Never raises."""
    try:
        sp = req.sampling_params
        return (
            int(sp.top_k) == 1
            and int(getattr(sp, "n", 1) or 1) == 1
            and getattr(sp, "beam_width", None) in (None, 1)
            and float(sp.frequency_penalty) == 0.0
            and float(sp.presence_penalty) == 0.0
            and float(sp.repetition_penalty) == 1.0
            and int(getattr(sp, "min_new_tokens", 0) or 0) == 0
            and not (sp.json_schema or sp.regex or sp.ebnf or getattr(sp, "structural_tag", None))
            and not getattr(sp, "logit_bias", None)
            and not getattr(sp, "custom_params", None)
            and getattr(sp, "watermark", None) is None
            and getattr(req, "custom_logit_processor", None) is None
        )
    except Exception:  # noqa: BLE001 - an unknown request shape is not a canary
        return False


# NOTE: what the replay sends explicitly, from the request's own (normalized) sampling parameters:
# the server's defaults (``--sampling-defaults model``: a model's generation_config may set a
# repetition penalty or top-k) must not fill them in differently for the replay.
_REPLAYED = ("temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty",
             "repetition_penalty")  # fmt: skip
# NOTE: server-side request fields that change the computation and that a replay through
# ``/generate`` with ``input_ids`` cannot carry: a request with any of them set is not sampled.
_NOT_REPLAYABLE = ("lora_id", "multimodal_inputs", "input_embeds", "token_type_ids",
                   "positional_embed_overrides")  # fmt: skip


def replay_params(req: Any) -> tuple[tuple[str, float | int], ...] | None:
    """The sampling parameters a cold replay of ``req`` must send to be the same computation, or None
    when no replay through ``/generate`` can be (not plainly greedy, or an adapter, media, embeddings,
    token types or positional overrides shape its answer). Never raises."""
    if not plain_greedy(req):
        return None
    try:
        if any(getattr(req, name, None) is not None for name in _NOT_REPLAYABLE):
            return None
        sp = req.sampling_params
        return tuple(
            (name, int(getattr(sp, name)) if name == "top_k" else float(getattr(sp, name)))
            for name in _REPLAYED
        )
    except Exception:  # noqa: BLE001 - an unknown request shape is not a canary
        return None


class CanaryMarker:
    """The ``extra_key`` of a canary replay: ``semgov-canary:<n>.<MAC>`` under a secret drawn at boot.

    NOTE: only this process can mint one; a client sending a look-alike gets an ordinary request
    (its key is then an anonymous one, :func:`semgov.context.anonymous_cache_key`).
    """

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret if secret is not None else secrets.token_bytes(32)

    def _mac(self, n: str) -> str:
        return hmac.new(self._secret, n.encode("ascii"), hashlib.sha256).hexdigest()[:32]

    def token(self, n: int) -> str:
        return f"{CANARY_PREFIX}{n}.{self._mac(str(n))}"

    def verify(self, extra_key: object) -> bool:
        """Whether ``extra_key`` is exactly a marker this process minted (never raises)."""
        if type(extra_key) is not str or not extra_key.startswith(CANARY_PREFIX) or len(extra_key) > 128:
            return False
        n, _, mac = extra_key[len(CANARY_PREFIX) :].partition(".")
        if not n.isdigit() or not n.isascii() or len(mac) != 32:
            return False
        return hmac.compare_digest(mac, self._mac(n))


@dataclass(frozen=True, slots=True)
class Canary:
    """One sampled realization: what to replay and what it must give back."""

    request_id: str
    decision_id: str | None
    donor_id: str | None
    scope: Scope
    input_ids: tuple[int, ...]
    warm: tuple[int, ...]  # the request's first output tokens (at most SEMGOV_CANARY_TOKENS)
    params: tuple[tuple[str, float | int], ...] = ()  # its sampling parameters (replay_params)


@dataclass(slots=True)
class ScopeCount:
    canaries: int = 0
    regressions: int = 0
    disabled_at: str | None = None  # RFC 3339, when shifted reuse went off here


@dataclass(frozen=True, slots=True)
class CanaryEvent:
    """An engine event the caller audits: ``canary`` (one comparison) or ``shifted_reuse_disabled``."""

    kind: str
    canary: Canary | None
    detail: str
    compared: int = 0


def compare(warm: Sequence[int], cold: Sequence[int]) -> int | None:
    """The first position where the cold replay differs from the warm output, or None when the
    replay gave back exactly the warm tokens (a replay that is too short differs where it ends)."""
    for i, w in enumerate(warm):
        if i >= len(cold) or int(cold[i]) != int(w):
            return i
    return None


DISABLED = "disabled"
TRUSTED = "trusted"


@dataclass
class CanaryBook:
    """Pure bookkeeping of the canaries: queue, per-scope counts, disabled and trusted scopes, events.

    A scope is *on probation* until ``settings.probation`` of its canaries matched (never with 0):
    there, only requests a canary can check get shifted KV, and every one of them is replayed. A
    scope whose regressions exceed the budget is *disabled*. Both are per full scope (:class:`Scope`).

    NOTE: invariants: a scope, once disabled, stays disabled for this policy revision; ``disabled``
    and ``trusted`` are replaced, never mutated, so the scheduler thread reads them without a lock;
    ``offer`` never blocks and drops (counted) when the queue, or its tenant's share, is full.
    """

    settings: CanarySettings
    revision: str
    counts: dict[Scope, ScopeCount] = field(default_factory=dict)
    disabled: frozenset[Scope] = frozenset()
    trusted: frozenset[Scope] = frozenset()
    dropped: int = 0
    _queue: collections.deque[Canary] = field(default_factory=collections.deque)
    _events: list[CanaryEvent] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def on_probation(self, scope: Scope) -> bool:
        """Whether ``scope`` has not yet shown the matching canaries shifted reuse needs (lock-free)."""
        return self.settings.probation > 0 and scope not in self.trusted

    def offer(self, canary: Canary) -> bool:
        """Queue a sampled realization (scheduler thread); False when dropped (queue or the tenant's
        share of it full, or shifted reuse already off for its scope)."""
        with self._lock:
            if canary.scope in self.disabled:
                return False
            tenant = canary.scope.tenant
            if len(self._queue) >= self.settings.queue or (
                sum(c.scope.tenant == tenant for c in self._queue) >= self.settings.tenant_queue
            ):
                self.dropped += 1
                return False
            self._queue.append(canary)
            return True

    def next(self) -> Canary | None:
        with self._lock:
            return self._queue.popleft() if self._queue else None

    def pending(self) -> int:
        with self._lock:
            return len(self._queue)

    def record(self, canary: Canary, cold: Sequence[int] | None, error: str | None, at: str) -> str | None:
        """Record one replay's outcome; :data:`DISABLED` when it turned shifted reuse off for the scope,
        :data:`TRUSTED` when it ended the scope's probation, else None. A replay that failed
        (``error``) is audited and counts neither way."""
        with self._lock:
            if error is not None or cold is None:
                self._events.append(CanaryEvent("canary", canary, f"replay failed: {error}"))
                return None
            scope = canary.scope
            if scope not in self.counts and len(self.counts) >= self.settings.max_scopes:
                self._events.append(CanaryEvent("canary", canary, "not counted: too many scopes counted"))
                return None
            count = self.counts.setdefault(scope, ScopeCount())
            count.canaries += 1
            at_token = compare(canary.warm, cold)
            if at_token is None:
                return self._matched(canary, count)
            count.regressions += 1
            warm_tok = canary.warm[at_token]
            cold_tok = int(cold[at_token]) if at_token < len(cold) else None
            self._events.append(
                CanaryEvent(
                    "canary",
                    canary,
                    f"regression at output token {at_token}: warm {warm_tok}, cold {cold_tok}",
                    len(canary.warm),
                )
            )
            if count.regressions <= self.settings.budget or scope in self.disabled:
                return None
            count.disabled_at = at
            self.disabled = self.disabled | {scope}
            self.trusted = self.trusted - {scope}
            self._queue = collections.deque(c for c in self._queue if c.scope != scope)
            self._events.append(
                CanaryEvent(
                    "shifted_reuse_disabled",
                    canary,
                    f"shifted reuse off for {describe(scope)}: {count.regressions} regressions in "
                    f"{count.canaries} canaries, budget {self.settings.budget}, "
                    f"policy revision {self.revision}",
                )
            )
            return DISABLED

    def _matched(self, canary: Canary, count: ScopeCount) -> str | None:
        """A match (the lock held): audited, and the end of the scope's probation once it has enough."""
        scope, n = canary.scope, len(canary.warm)
        good = count.canaries - count.regressions
        if self.on_probation(scope) and scope not in self.disabled and good >= self.settings.probation:
            self.trusted = self.trusted | {scope}
            detail = f"match: {n} tokens; probation over after {good} matching canaries"
            self._events.append(CanaryEvent("canary", canary, detail, n))
            return TRUSTED
        self._events.append(CanaryEvent("canary", canary, f"match: {n} tokens", n))
        return None

    def new_revision(self, revision: str) -> bool:
        """Another live policy revision was loaded while running: what was found under the old one
        no longer holds (counts, disabled and trusted scopes and queued canaries are cleared, as a
        restart with a new revision clears them). False when the revision is the one in force."""
        with self._lock:
            if revision == self.revision:
                return False
            self.revision = revision
            self.counts = {}
            self.disabled = frozenset()  # NOTE: replaced, never mutated
            self.trusted = frozenset()
            self._queue.clear()
            return True

    def take_events(self) -> list[CanaryEvent]:
        with self._lock:
            out, self._events = self._events, []
            return out

    # ---- persistence (the caller does the I/O) ------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Every counted scope with its counts, with the policy revision (``canary-state.json``)."""
        with self._lock:
            scopes = [
                {
                    **_scope_doc(s),
                    "canaries": c.canaries,
                    "regressions": c.regressions,
                    "disabled_at": c.disabled_at,
                }
                for s, c in sorted(self.counts.items())
            ]
        return {"schema": STATE_SCHEMA, "policy_revision": self.revision, "scopes": scopes}

    def restore(self, state: object) -> tuple[bool, str]:
        """Take a state written under this policy revision; whether it was whole, and what happened.

        Fail closed: the disabled scopes of every entry that parses are taken, a scope's probation
        is over only when the whole file is valid; anything else leaves every scope on probation.
        """
        if not isinstance(state, dict) or state.get("schema") != STATE_SCHEMA:
            found = state.get("schema") if isinstance(state, dict) else type(state).__name__
            return False, f"not a {STATE_SCHEMA} file ({bounded(found)}): nothing restored"
        if state.get("policy_revision") != self.revision:
            return True, (
                f"written under policy revision {bounded(state.get('policy_revision'))}: "
                "cleared by the new revision"
            )
        counts: dict[Scope, ScopeCount] = {}
        bad = 0
        items = state.get("scopes")
        entries: list[Any] = items if isinstance(items, list) else [None]
        for item in entries:
            try:
                at = item["disabled_at"]
                if at is not None and type(at) is not str:
                    raise TypeError("disabled_at must be a string or null")
                n, bad_n = int(item["canaries"]), int(item["regressions"])
                counts[_scope_from_doc(item)] = ScopeCount(n, bad_n, at)
            except (KeyError, TypeError, ValueError):
                bad += 1
        with self._lock:
            self.counts.update(counts)
            self.disabled = frozenset(s for s, c in counts.items() if c.disabled_at is not None)
            if not bad:
                self.trusted = frozenset(
                    s
                    for s, c in counts.items()
                    if c.disabled_at is None and c.canaries - c.regressions >= self.settings.probation
                )
        if bad:
            return False, (
                f"{bad} malformed entr(y/ies): {len(self.disabled)} disabled scope(s) kept, "
                "every other scope on probation"
            )
        return True, f"{len(self.disabled)} scope(s) off, {len(self.trusted)} trusted, restored"


def bounded(value: object) -> str:
    """A value read from the state file, for a log line (short)."""
    return repr(value)[:80]


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Write the state atomically (temporary file, fsync, rename)."""
    tmp = path.with_name(path.name + ".tmp")
    data = json.dumps(state, indent=2, sort_keys=True).encode("utf-8") + b"\n"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def load_state(path: Path) -> object:
    """The state file's JSON (None when there is none; a string saying why when unreadable)."""
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return f"unreadable ({type(e).__name__}: {e})"


Replay = Callable[[Canary, str], list[int]]
"""Sends a canary's prompt cold (``extra_key`` given) and returns the output token ids."""


def http_replay(host: str, port: int, api_key: str | None, timeout_s: float) -> Replay:
    """A :data:`Replay` through the server's own ``/generate`` (the request's own sampling parameters,
    ``ignore_eos``, exactly as many tokens as the warm output)."""

    def replay(canary: Canary, extra_key: str) -> list[int]:
        payload = {
            "input_ids": list(canary.input_ids),
            # NOTE: the request's own sampling parameters, sent explicitly (not the server's defaults)
            "sampling_params": {
                **(dict(canary.params) if canary.params else {"temperature": 0.0}),
                "max_new_tokens": len(canary.warm),
                "ignore_eos": True,
            },
            "extra_key": extra_key,
            "rid": f"semgov-canary-{secrets.token_hex(6)}",
        }
        headers = {"Content-Type": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
        try:
            conn.request("POST", "/generate", body=json.dumps(payload), headers=headers)
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {body[:200]!r}")
        out = json.loads(body)
        ids = out[0]["output_ids"] if isinstance(out, list) else out["output_ids"]
        return [int(x) for x in ids]

    return replay


class CanaryRunner:
    """The thread that replays canaries when the server is idle and records the outcomes.

    The scheduler thread calls :meth:`busy` whenever a prefill round sees waiting requests; a
    replay is sent only when that has not happened for ``idle_ms``. Outcomes go to the book; its
    events are handed to ``audit`` (the hook's event queue) and the state file is rewritten when a
    scope is turned off. Never raises into its caller; a replay error is audited and skipped.
    """

    def __init__(
        self,
        book: CanaryBook,
        marker: CanaryMarker,
        replay: Replay,
        audit: Callable[[CanaryEvent], None],
        state_path: Path | None,
        clock: Callable[[], str],
    ) -> None:
        self.book, self.marker, self.replay, self.audit = book, marker, replay, audit
        self.state_path, self.clock = state_path, clock
        self._busy_until = 0.0
        self._wake = threading.Event()
        self._stop = False
        self._sent = 0
        self.inflight = 0
        self._thread = threading.Thread(target=self._loop, name="semgov-canary", daemon=True)
        self._thread.start()

    def busy(self) -> None:
        """Scheduler thread: requests are waiting (one float store)."""
        self._busy_until = time.monotonic() + self.book.settings.idle_ms / 1000

    def poke(self) -> None:
        """A canary was queued."""
        self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while not self._stop:
            self._wake.wait(0.5)
            self._wake.clear()
            while not self._stop and self.book.pending():
                wait = self._busy_until - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, 0.5))
                    continue
                canary = self.book.next()
                if canary is not None:
                    self._run(canary)

    def _run(self, canary: Canary) -> None:
        self._sent += 1
        self.inflight = 1
        cold: list[int] | None = None
        error: str | None = None
        try:
            cold = self.replay(canary, self.marker.token(self._sent))
        except Exception as e:  # noqa: BLE001 - a failed replay is audited, never fatal
            error = f"{type(e).__name__}: {str(e)[:200]}"
        finally:
            self.inflight = 0
        try:
            changed = self.book.record(canary, cold, error, self.clock())
            if changed is not None:
                # NOTE: the state file is written before the events are audited, so a reader who
                # sees shifted_reuse_disabled in the audit log also finds it in the state file.
                log = get_logger().warning if changed == DISABLED else get_logger().info
                what = "shifted reuse turned off" if changed == DISABLED else "probation over"
                log(f"semgov canary: {what}", scope=describe(canary.scope), **_canary_fields(canary))
                self._persist()
            for ev in self.book.take_events():
                self.audit(ev)
        except Exception as e:  # noqa: BLE001 - bookkeeping must not kill the thread
            get_logger().error(
                "semgov canary bookkeeping failed", error=describe_error(e), **_canary_fields(canary)
            )

    def _persist(self) -> None:
        if self.state_path is None:
            return
        try:
            save_state(self.state_path, self.book.state())
        except OSError as e:  # NOTE: the scope stays off in memory; the audit events still go out
            get_logger().error("semgov canary state not saved", path=str(self.state_path), error=str(e))


class Canaries:
    """The hook's canaries (see the module docstring): the scheduler thread samples, queues and reads
    which scopes are off or on probation; a runner thread replays, compares, audits and keeps the
    state file."""

    def __init__(
        self,
        settings: CanarySettings,
        *,
        revision: str,
        replay: Replay,
        audit: Callable[[CanaryEvent], None],
        state_path: Path | None,
        clock: Callable[[], str],
        sample: Callable[[], float] | None = None,
    ) -> None:
        import random

        self.settings = settings
        self.marker = CanaryMarker()
        self.book = CanaryBook(settings, revision)
        self._sample = sample if sample is not None else random.Random(secrets.randbits(64)).random
        self.state_restored = state_path is None
        if state_path is not None:
            self.state_restored = self._restore(state_path)
        self.runner = CanaryRunner(self.book, self.marker, replay, audit, state_path, clock)
        self.offered = 0

    def _restore(self, path: Path) -> bool:
        """Read the state file; say, in the log, what a missing or unusable one means (fail closed:
        nothing is trusted unmeasured, see :meth:`CanaryBook.restore`)."""
        found = load_state(path)
        if isinstance(found, dict):
            ok, why = self.book.restore(found)
        else:
            ok, why = False, found if isinstance(found, str) else "no state file (first start, or deleted)"
        if ok:
            get_logger().info("semgov canary state", path=str(path), result=why)
            return True
        after = (
            f"every scope is on probation: shifted reuse only for requests a canary checks, until "
            f"{self.settings.probation} of its canaries match"
            if self.settings.probation > 0
            else "SEMGOV_CANARY_PROBATION=0: unmeasured scopes are trusted, disabled ones are lost"
        )
        get_logger().warning("semgov canary state not restored", path=str(path), result=why, then=after)
        return False

    def off_for(self, ctx: Any) -> bool:
        """Scheduler thread: whether canaries turned shifted reuse off for this request context's scope."""
        disabled = self.book.disabled  # NOTE: replaced, never mutated: no lock needed to read it
        return bool(disabled) and scope_of(ctx) in disabled

    def shifted_ok(self, ctx: Any, req: Any) -> bool:
        """Scheduler thread: whether ``req`` (of context ``ctx``) may receive shifted KV: not where
        canaries turned it off, and on probation only if a canary can replay it. Never raises."""
        try:
            scope = scope_of(ctx)
            if scope in self.book.disabled:
                return False
            return not self.book.on_probation(scope) or (req is not None and replay_params(req) is not None)
        except Exception:  # noqa: BLE001 - any doubt: no shifted KV
            return False

    def offer(
        self, req: Any, *, request_id: str, decision_id: str | None, donor_id: str | None, ctx: Any
    ) -> bool:
        """Scheduler thread, a request that received shifted KV finished normally: sample it (always on
        probation) if a replay can be the same computation (:func:`replay_params`) and it has output,
        and queue its replay. Never raises; True when queued."""
        try:
            scope = scope_of(ctx)
            if not self.book.on_probation(scope) and self._sample() >= self.settings.rate:
                return False
            params = replay_params(req)
            warm = tuple(int(t) for t in req.output_ids[: self.settings.tokens])
            if params is None or not warm:
                return False
            canary = Canary(
                request_id, decision_id, donor_id, scope, tuple(req.origin_input_ids), warm, params
            )
            queued = self.book.offer(canary)
            if queued:
                self.offered += 1
                self.runner.poke()
            return queued
        except Exception as e:  # noqa: BLE001 - sampling must never cost the scheduler
            get_logger().error("semgov canary not queued", error=describe_error(e))
            return False

    def busy(self) -> None:
        self.runner.busy()

    def stats(self) -> dict[str, int]:
        b = self.book
        counts = list(b.counts.values())
        return {
            "canaries_queued": self.offered,
            "canaries_dropped": b.dropped,
            "canaries_compared": sum(c.canaries for c in counts),
            "canary_regressions": sum(c.regressions for c in counts),
            "shifted_reuse_off_scopes": len(b.disabled),
            "shifted_reuse_trusted_scopes": len(b.trusted),
            "canary_state_restored": int(self.state_restored),
        }

    def close(self) -> None:
        self.runner.close()


def _canary_fields(canary: Canary) -> dict[str, str | None]:
    """What a log line about a canary names: the sampled request and the decision it realized."""
    return {"request_id": canary.request_id, "decision_id": canary.decision_id, "donor_id": canary.donor_id}
