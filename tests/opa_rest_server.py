"""OPA REST test server backed by the real OPA library.

A test double of the parts of OPA's REST API that opa-python-client uses, for
tests only: no ``opa`` binary can be installed here, so this serves OPA's request
and response shapes over HTTP on 127.0.0.1 and evaluates with the real OPA Go
library in-process (``opa_bindings``, OPA v1.20). Endpoints:

- ``GET /health`` -> ``{}``;
- ``GET /v1/policies`` -> ``{"result": [{"id", "raw"}...]}``;
- ``PUT /v1/policies/{id}`` (Rego text) -> ``{}``; the module is compiled with every
  other module held, as OPA does, and on error the module set is unchanged and the
  answer is 400 ``{"code": "invalid_parameter", "message", "errors": [...]}``;
- ``DELETE /v1/policies/{id}`` -> ``{}`` (404 when unknown);
- ``POST /v1/data/{path}`` ``{"input": ...}`` -> ``{"result": value}``, or ``{}`` when undefined;
- ``POST /v1/query`` ``{"query", "input"}`` -> ``{"result": [bindings...]}``, or ``{}``.

Fault injection (attributes, settable while running): ``delay`` (seconds before
each answer), ``status`` (answer every request with this HTTP status and an OPA
error body), ``body`` (answer every request 200 with these raw bytes), and
:meth:`OpaRestServer.stop` (server down: listener and open connections closed).
``requests`` logs ``(method, path)`` of every request received.

NOTE: the Go bridge caches each distinct query string, so ``/v1/query`` with
ever-changing queries (``bulk_query_rule``) grows memory; fine for tests.
"""

from __future__ import annotations

import json
import re
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlsplit

from opa_bindings import OpaEngine, OpaError, OpaUndefinedError


def _opa_errors(err: OpaError) -> list[dict[str, Any]]:
    """OPA-style error entries parsed from the bridge's ``file:row: code: message`` text."""
    out = []
    for m in re.finditer(r"(?m)^(?:\d+ errors? occurred: )?(\S+?):(\d+): (rego_\w+): (.*)$", err.message):
        out.append(
            {
                "code": m.group(3),
                "message": m.group(4),
                "location": {"file": m.group(1), "row": int(m.group(2)), "col": 1},
            }
        )
    return out or [{"code": err.code, "message": err.message}]


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients that time out and hang up are expected here; anything else is reported."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)


class OpaRestServer:
    """A threaded OPA REST API double on an ephemeral 127.0.0.1 port. Use as a context manager."""

    def __init__(self) -> None:
        self.delay = 0.0
        self.status: int | None = None
        self.body: bytes | None = None
        self.requests: list[tuple[str, str]] = []
        self._modules: dict[str, str] = {}
        self._engine = OpaEngine()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._conns: set[socket.socket] = set()
        self._httpd = _QuietServer(("127.0.0.1", 0), _handler(self))
        self.port: int = self._httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.02,), name="opa-rest-test", daemon=True
        )
        self._thread.start()

    def __enter__(self) -> OpaRestServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Take the server down: stop listening and cut every open connection."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(timeout=5)
        self._engine.close()

    # -- OPA semantics -------------------------------------------------

    def put_policy(self, pid: str, text: str) -> tuple[int, dict[str, Any]]:
        return self._replace_modules({**self._modules, pid: text})

    def delete_policy(self, pid: str) -> tuple[int, dict[str, Any]]:
        if pid not in self._modules:
            return 404, {"code": "resource_not_found", "message": f"storage_not_found_error: {pid}"}
        return self._replace_modules({k: v for k, v in self._modules.items() if k != pid})

    def _replace_modules(self, modules: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """Compile ``modules`` together, as OPA does on every policy change; keep the old set on error."""
        engine = OpaEngine()
        try:
            for k, v in modules.items():
                engine.add_policy(k, v)
            engine.eval_query("x := 1")  # compiles every module
        except OpaError as e:
            engine.close()
            return 400, {
                "code": "invalid_parameter",
                "message": "error(s) occurred while compiling module(s)",
                "errors": _opa_errors(e),
            }
        with self._lock:
            old, self._engine, self._modules = self._engine, engine, modules
        old.close()
        return 200, {}

    def data(self, path: str, inp: Any) -> tuple[int, dict[str, Any]]:
        try:
            return 200, {"result": self._engine.eval_document(path.strip("/").replace("/", "."), inp)}
        except OpaUndefinedError:
            return 200, {}
        except OpaError as e:
            return 500, {"code": "internal_error", "message": e.message}

    def query(self, query: str, inp: Any) -> tuple[int, dict[str, Any]]:
        try:
            rows = self._engine.eval_query(query, input=inp)
        except OpaError as e:
            if e.code == "prepare_error":
                return 400, {"code": "invalid_parameter", "message": e.message, "errors": _opa_errors(e)}
            return 500, {"code": "internal_error", "message": e.message}
        return 200, ({"result": rows} if rows else {})


def _handler(srv: OpaRestServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, like OPA
        disable_nagle_algorithm = True  # TCP_NODELAY, like Go's net/http (else ~40 ms delayed-ACK stalls)

        def setup(self) -> None:
            super().setup()
            with srv._lock:
                srv._conns.add(self.connection)

        def finish(self) -> None:
            with srv._lock:
                srv._conns.discard(self.connection)
            super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _send(self, status: int, body: bytes | dict[str, Any]) -> None:
            raw = body if isinstance(body, bytes) else json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.end_headers()
            self.wfile.write(raw)

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            path = urlsplit(self.path).path
            srv.requests.append((self.command, path))
            if srv.delay and srv._stopping.wait(srv.delay):
                return  # stopped while "busy": answer nothing
            if srv.status is not None:
                self._send(srv.status, {"code": "internal_error", "message": "injected fault"})
                return
            if srv.body is not None:
                self._send(200, srv.body)
                return
            try:
                status, out = self._route(path, raw)
            except ValueError as e:  # bad JSON in the request
                status, out = 400, {"code": "invalid_parameter", "message": f"malformed request body: {e}"}
            self._send(status, out)

        def _route(self, path: str, raw: bytes) -> tuple[int, dict[str, Any]]:
            cmd = self.command
            if cmd == "GET" and path == "/health":
                return 200, {}
            if path.rstrip("/") == "/v1/policies" and cmd == "GET":
                return 200, {"result": [{"id": k, "raw": v} for k, v in srv._modules.items()]}
            if path.startswith("/v1/policies/") and cmd in ("PUT", "DELETE"):
                pid = unquote(path[len("/v1/policies/") :])
                if cmd == "DELETE":
                    return srv.delete_policy(pid)
                return srv.put_policy(pid, raw.decode("utf-8"))
            if path.startswith("/v1/data") and cmd == "POST":
                body = json.loads(raw) if raw else {}
                return srv.data(path[len("/v1/data") :], body.get("input"))
            if path == "/v1/query" and cmd == "POST":
                body = json.loads(raw)
                return srv.query(body["query"], body.get("input"))
            return 404, {"code": "resource_not_found", "message": f"{cmd} {path} not found"}

        do_GET = do_PUT = do_POST = do_DELETE = _serve

    return Handler
