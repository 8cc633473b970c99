"""Evaluate a Rego policy on an OPA server over its REST API (``opa-python-client``).

:class:`OpaServerEngine` uploads the policy's modules (``PUT /v1/policies``) at
construction and asks ``POST /v1/data/semgov/reuse`` for the package document of
each policy input; :meth:`OpaServerEngine.evaluate_many` decides all candidates
of a request in one ``POST /v1/query``. Every failure (timeout, connection,
HTTP error, undefined or malformed result) raises :class:`OpaServerError` with
what happened, and the evaluator then denies (fail closed). Construction
failures are load errors (:class:`semgov.errors.PolicyError`).

NOTE: ``timeout`` bounds connecting and each socket read (``requests``
semantics), not a whole response trickled byte by byte. There are no retries.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any, TypeVar
from urllib.parse import quote, urlsplit

from semgov.errors import PolicyError
from semgov.policy.engine import EngineResult
from semgov.policy.rego.engines import interpret
from semgov.policy.rego.loader import PACKAGE, RegoPolicy
from semgov.wire.policy_input import PolicyInput, to_json_dict

T = TypeVar("T")
_RULES = ("allow", "deny", "approved_spans")


class OpaServerError(Exception):
    """The OPA server gave no usable answer (unreachable, slow, HTTP error, undefined, malformed)."""

    def __init__(self, message: str, *, line: int | None = None) -> None:
        super().__init__(message)
        self.line = line  # of the module the server rejected, when it said


class OpaServerEngine:
    """A Rego policy evaluated by an OPA server at ``url`` (``http://host:port``).

    With ``upload`` (the default) the policy's modules replace whatever the server
    held under ``semgov/<policy name>/``; without it, the server's own copy is used.
    Either way the server's ``metadata`` must name this policy and version.
    One instance is meant for one thread (``requests.Session``).
    """

    name = "opa-server"

    def __init__(self, policy: RegoPolicy, url: str, *, timeout: float = 2.0, upload: bool = True) -> None:
        try:
            from opa_client import OpaClient
        except ImportError as e:
            raise PolicyError("--opa-url needs opa-python-client: pip install 'semgov[opa]'") from e
        try:
            parts = urlsplit(url)
            port = parts.port
        except ValueError as e:
            raise PolicyError(f"OPA server URL {url!r} is malformed: {e}") from e
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path not in ("", "/")
            or parts.query
            or parts.fragment
            or parts.username
        ):
            raise PolicyError(f"OPA server URL must look like http://host:port, not {url!r}")
        if not timeout > 0:
            raise PolicyError(f"OPA server timeout must be positive, not {timeout}")
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        port = port if port is not None else (443 if parts.scheme == "https" else 80)
        self.url = f"{parts.scheme}://{host}:{port}"
        self.timeout = timeout
        self.policy = policy
        self._client = OpaClient(
            host=host, port=port, ssl=parts.scheme == "https", timeout=timeout, retries=0
        )
        if upload:
            self._upload()
        self._check_metadata()

    # -- construction (load errors) ------------------------------------

    def _upload(self) -> None:
        """PUT every module; retry those the server rejected while others still get in.

        NOTE: OPA compiles each PUT together with the modules it already holds, so a
        module using another module's rules only compiles once that one is there.
        """
        prefix = f"semgov/{self.policy.name}/"
        pending = {prefix + fname: fname for fname in sorted(self.policy.modules)}
        ours = set(pending)
        while pending:
            failed: dict[str, tuple[str, OpaServerError]] = {}
            for pid, fname in pending.items():
                try:
                    upload = partial(self._client.update_policy_from_string, rego_compat=False)
                    self._call(partial(upload, self.policy.modules[fname], quote(pid)))
                except OpaServerError as e:
                    failed[pid] = (fname, e)
            if len(failed) == len(pending):
                fname, err = next(iter(failed.values()))
                raise PolicyError(str(err), source=str(self.policy.directory / fname), line=err.line)
            pending = {pid: fname for pid, (fname, _) in failed.items()}
        try:
            held = self._call(self._client.get_policies_list)
            for pid in held:
                if isinstance(pid, str) and pid.startswith(prefix) and pid not in ours:
                    self._call(partial(self._client.delete_policy, quote(pid)))
        except OpaServerError as e:
            raise PolicyError(f"removing stale modules: {e}", source=str(self.policy.directory)) from e

    def _check_metadata(self) -> None:
        """The server's package must be this policy: records name it as the one that decided."""
        want = {"name": self.policy.name, "version": self.policy.version}
        try:
            body = self._call(lambda: self._client.query_rule({}, PACKAGE, "metadata"))
        except OpaServerError as e:
            raise PolicyError(str(e), source=str(self.policy.directory)) from e
        got = body.get("result") if isinstance(body, dict) else None
        if got != want:
            raise PolicyError(
                f"OPA server {self.url} holds data.{PACKAGE}.metadata = {got!r:.200}, expected {want}",
                source=str(self.policy.directory),
            )

    # -- evaluation ----------------------------------------------------

    def evaluate(self, doc: PolicyInput) -> EngineResult:
        body = self._call(lambda: self._client.query_rule(to_json_dict(doc), PACKAGE))
        if not isinstance(body, dict):
            raise OpaServerError(f"OPA server {self.url} returned a malformed response: {body!r:.200}")
        if "result" not in body:
            raise OpaServerError(
                f"OPA server {self.url}: data.{PACKAGE} is undefined (is the policy loaded?)"
            )
        return interpret(self._rules(body["result"]), doc)

    def evaluate_many(self, docs: list[PolicyInput]) -> list[EngineResult | Exception]:
        """Decide all ``docs`` in one round trip; an item is an exception where that one failed."""
        if not docs:
            return []
        inputs = [to_json_dict(d) for d in docs]
        try:
            values = self._call(lambda: self._client.bulk_query_rule(inputs, PACKAGE))
            if not isinstance(values, list) or len(values) != len(docs):
                raise OpaServerError(f"OPA server {self.url} returned a malformed response: {values!r:.200}")
        except OpaServerError as e:
            return [e] * len(docs)
        out: list[EngineResult | Exception] = []
        for doc, value in zip(docs, values, strict=True):
            try:
                out.append(interpret(self._rules(value), doc))
            except Exception as e:  # noqa: BLE001 - reported per candidate
                out.append(e)
        return out

    def close(self) -> None:
        self._client.close_connection()

    def _rules(self, package_doc: Any) -> dict[str, Any]:
        if not isinstance(package_doc, dict):
            raise OpaServerError(
                f"OPA server {self.url} returned a malformed result: data.{PACKAGE} is "
                f"{package_doc!r:.200}, not an object"
            )
        return {k: package_doc.get(k) for k in _RULES}

    def _call(self, fn: Callable[[], T]) -> T:
        """Run one client call, turning every failure into an :class:`OpaServerError` saying what."""
        import requests
        from opa_client.errors import QueryExecuteError, RegoParseError

        where = f"OPA server {self.url}"
        try:
            return fn()
        except requests.Timeout as e:
            raise OpaServerError(f"{where} timed out after {self.timeout}s") from e
        except requests.JSONDecodeError as e:
            raise OpaServerError(f"{where} returned malformed JSON: {e}") from e
        except requests.HTTPError as e:
            raise OpaServerError(f"{where} returned HTTP {_http_error(e)}") from e
        except requests.ConnectionError as e:
            if "timed out" in str(e):
                raise OpaServerError(f"{where} timed out after {self.timeout}s") from e
            raise OpaServerError(f"{where} connection failed: {_reason(e)}") from e
        except RegoParseError as e:
            errs = [x for x in e.errors if isinstance(x, dict)]
            details = "; ".join(f"{x.get('code')}: {x.get('message')}" for x in errs)
            rows = [x.get("location", {}).get("row") for x in errs]
            raise OpaServerError(
                f"{where} rejected the module: {details or f'{e.expression}: {e.message}'}",
                line=rows[0] if rows and isinstance(rows[0], int) else None,
            ) from e
        except QueryExecuteError as e:
            raise OpaServerError(f"{where}: data.{PACKAGE} is undefined (is the policy loaded?)") from e
        except (KeyError, IndexError, AttributeError, TypeError) as e:
            raise OpaServerError(f"{where} returned a malformed response ({type(e).__name__}: {e})") from e
        except Exception as e:  # noqa: BLE001 - anything else still fails closed, saying what
            raise OpaServerError(f"{where} request failed: {type(e).__name__}: {e}") from e


def _http_error(e: Any) -> str:
    resp = e.response
    status = resp.status_code if resp is not None else "error"
    try:
        body = resp.json()
        detail = f"{body.get('code')}: {body.get('message')}"
    except Exception:  # noqa: BLE001 - body is only a hint
        detail = (resp.text if resp is not None else str(e))[:200]
    return f"{status}: {detail}"


def _reason(e: BaseException) -> str:
    m = re.search(r"\[Errno -?\d+\] ([^'\")]+)", str(e))
    if m:
        return m.group(1).strip()
    inner: BaseException = e
    while inner.args and isinstance(inner.args[0], BaseException):
        inner = inner.args[0]
    reason = getattr(inner, "reason", inner)
    return f"{type(reason).__name__}: {reason}"[:300]
