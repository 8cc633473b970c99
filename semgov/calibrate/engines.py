"""Where a calibration run's requests go: a server's own ``/generate``, or the gateway's route.

:class:`SglangServer` holds the deployment's context key and mints each request's token itself
(the gateway's job, done here for a team that runs calibrate beside its servers);
:class:`ThroughGateway` holds an API key allowed to calibrate and lets ``semgov gateway`` mint
them (``POST /v1/semgov/calibrate``, docs/gateway.md "Calibration requests"). Both send greedy
requests (temperature 0) and return what the engine answered, bounded; neither decides anything.
"""

from __future__ import annotations

import http.client
import json
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import urlsplit

from semgov.context import (
    CalibrationClaim,
    ContextError,
    ContextKeys,
    calibration_namespace,
    make_context_token,
)
from semgov.errors import SemgovError

MAX_ANSWER_BYTES = 8 << 20  # an engine answer larger than this is refused, never parsed


class EngineUnreachable(SemgovError):
    """The server (or the gateway) cannot be reached, or answered with a server error."""


@dataclass(frozen=True, slots=True)
class Call:
    """One request of a measured pair, as the run means it (before any token is minted)."""

    rid: str
    ids: Sequence[int]
    segments: Sequence[tuple[str, int, int]] | None
    tenant: str
    namespace: str  # the captured (base) namespace: the token carries the run's
    task: dict[str, str]
    contract: dict[str, str]
    claim: CalibrationClaim
    max_new_tokens: int


@dataclass(frozen=True, slots=True)
class Answer:
    """What the engine answered: its output ids and text (None when it returned none), the rid
    its audit log names the request by, and its own count of prompt tokens served from cache."""

    rid: str
    output_ids: tuple[int, ...]
    text: str | None
    cached_tokens: int | None


class Engine(Protocol):
    """A place calibration requests are answered."""

    @property
    def where(self) -> str: ...

    def model(self) -> str: ...

    def send(self, call: Call) -> Answer: ...


class _Http:
    """One HTTP(S) endpoint, called with JSON (stdlib only: one request at a time)."""

    def __init__(self, url: str, timeout_s: float, bearer: str | None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise SemgovError(f"not an http(s) URL: {url!r}", field="--server")
        self.url = url.rstrip("/")
        self.scheme, self.host, self.port = parts.scheme, parts.hostname, parts.port
        self.base = parts.path.rstrip("/")
        self.timeout_s = timeout_s
        self.bearer = bearer

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        """The JSON answer of ``path`` (raises :class:`EngineUnreachable` on transport and 5xx errors,
        :class:`SemgovError` on a 4xx refusal or an answer that is not bounded JSON)."""
        conn: http.client.HTTPConnection
        if self.scheme == "https":
            conn = http.client.HTTPSConnection(
                self.host, self.port, timeout=self.timeout_s, context=ssl.create_default_context()
            )
        else:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        headers = {"Content-Type": "application/json"}
        if self.bearer:
            headers["Authorization"] = f"Bearer {self.bearer}"
        try:
            conn.request(method, self.base + path, None if body is None else json.dumps(body), headers)
            resp = conn.getresponse()
            raw = resp.read(MAX_ANSWER_BYTES + 1)
        except (OSError, http.client.HTTPException) as e:  # NOTE: timeouts are OSErrors
            raise EngineUnreachable(f"{self.url}{path}: {type(e).__name__}: {e}") from e
        finally:
            conn.close()
        if resp.status >= 500:
            raise EngineUnreachable(f"{self.url}{path}: HTTP {resp.status}: {_short(raw)}")
        if resp.status != 200:
            raise SemgovError(f"{self.url}{path}: HTTP {resp.status}: {_short(raw)}")
        if len(raw) > MAX_ANSWER_BYTES:
            raise SemgovError(f"{self.url}{path}: an answer over {MAX_ANSWER_BYTES} bytes")
        try:
            return json.loads(raw)
        except ValueError as e:
            raise SemgovError(f"{self.url}{path}: the answer is not JSON ({e})") from e


def _short(raw: bytes) -> str:
    return raw[:300].decode("utf-8", "replace").replace("\n", " ")


def answer_of(doc: Any, rid: str, where: str) -> Answer:
    """An :class:`Answer` from SGLang's ``/generate`` JSON (or the gateway's, the same fields);
    :class:`SemgovError` for one that is not that shape."""
    if isinstance(doc, list) and len(doc) == 1:
        doc = doc[0]
    ids = doc.get("output_ids") if isinstance(doc, dict) else None
    if not isinstance(ids, list) or not all(type(t) is int for t in ids):
        raise SemgovError(f"{where}: the answer has no output_ids list of integers")
    text = doc.get("text")
    meta = doc.get("meta_info") if isinstance(doc.get("meta_info"), dict) else {}
    cached = meta.get("cached_tokens")
    named = doc.get("request_id")
    return Answer(
        rid=named if isinstance(named, str) and named else rid,
        output_ids=tuple(ids),
        text=text if isinstance(text, str) else None,
        cached_tokens=cached if type(cached) is int else None,
    )


class SglangServer:
    """An SGLang server with the semgov backend, called at ``/generate`` with tokens minted here."""

    def __init__(self, url: str, keys: ContextKeys, *, api_key: str | None = None, timeout_s: float = 600.0):
        self.http = _Http(url, timeout_s, api_key)
        self.keys = keys

    @property
    def where(self) -> str:
        return self.http.url

    def model(self) -> str:
        info = self.http.call("GET", "/get_model_info")
        path = info.get("model_path") if isinstance(info, dict) else None
        return str(path)[:200] if path else "unknown"

    def send(self, call: Call) -> Answer:
        claim = call.claim
        try:
            token = make_context_token(
                self.keys.current,
                audience=self.keys.audience,
                tenant=call.tenant,
                namespace=calibration_namespace(call.namespace, claim.run),
                task=call.task,
                response_contract=call.contract,
                segments=list(call.segments) if call.segments else None,
                calibration=claim,
            )
        except ContextError as e:
            raise SemgovError(f"request {call.rid}: its context cannot be signed: {e}") from e
        body = {
            "input_ids": list(call.ids),
            "sampling_params": {"temperature": 0.0, "max_new_tokens": call.max_new_tokens},
            "extra_key": token,
            "rid": call.rid,
        }
        return answer_of(self.http.call("POST", "/generate", body), call.rid, self.where)


class ThroughGateway:
    """``semgov gateway``'s calibration route, with an API key whose entry says ``calibrate: true``."""

    def __init__(self, url: str, api_key: str, *, timeout_s: float = 600.0):
        self.http = _Http(url, timeout_s, api_key)

    @property
    def where(self) -> str:
        return self.http.url

    def model(self) -> str:
        doc = self.http.call("GET", "/v1/models")
        data = doc.get("data") if isinstance(doc, dict) else None
        first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}
        return str(first.get("id", "unknown"))[:200]

    def send(self, call: Call) -> Answer:
        claim: dict[str, str] = {"run": call.claim.run, "role": call.claim.role}
        if call.claim.plan is not None:
            claim["plan"] = call.claim.plan
        body: dict[str, Any] = {
            "request_id": call.rid,
            "input_ids": list(call.ids),
            "namespace": call.namespace,
            "task": call.task,
            "response_contract": call.contract,
            "calibration": claim,
            "max_new_tokens": call.max_new_tokens,
        }
        if call.segments:
            body["segments"] = [list(s) for s in call.segments]
        return answer_of(self.http.call("POST", "/v1/semgov/calibrate", body), call.rid, self.where)
