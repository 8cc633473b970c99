"""A real vLLM 0.32 OpenAI server on CPU with semgov's scope middleware (issue 19): exact-prefix
KV blocks never cross a tenant or namespace, whatever `cache_salt` the client sends.

The server is the connector tests' (``tests/vllm/conftest.py``: the scope middleware and semgov's
connector, in vLLM's own environment). What is measured here is vLLM's own prefix cache,
`vllm:prefix_cache_hits_total` on `/metrics`, around each request (sent one at a time).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from engine_hooks.sglang.context import make_context_token
from tests.sglang_server.rig import CONTEXT_SECRET
from tests.vllm.rig import TINY, VllmServer

MODEL = TINY
KEY = CONTEXT_SECRET
TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer", "schema_sha256": "ab" * 32}
PROMPT = list(range(1000, 1600))  # 600 tokens: 4 full 128-token blocks can be hit


class Server:
    """Prefix-cache hits of one request at a time on the shared server."""

    def __init__(self, server: VllmServer) -> None:
        self.url = server.url

    def hits(self) -> tuple[float, float]:
        """(prefix-cache tokens queried, tokens hit) so far."""
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        q = h = 0.0
        for line in text.splitlines():
            if line.startswith("vllm:prefix_cache_queries_total"):
                q += float(line.split()[-1])
            elif line.startswith("vllm:prefix_cache_hits_total"):
                h += float(line.split()[-1])
        return q, h

    def complete(self, doc: dict[str, Any]) -> tuple[int, float]:
        """POST /v1/completions; (HTTP status, prefix-cache tokens hit by this request)."""
        q0, h0 = self.hits()
        req = urllib.request.Request(
            self.url + "/v1/completions",
            data=json.dumps(doc).encode(),
            headers={"content-type": "application/json"},
        )
        try:
            status = urllib.request.urlopen(req, timeout=120).status
        except urllib.error.HTTPError as e:
            status = e.code
        _, h1 = self.hits()
        return status, h1 - h0


def _doc(prompt: list[int], tenant: str | None = None, namespace: str = "ns1", **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": str(MODEL), "prompt": prompt, "max_tokens": 1, **over}
    if tenant is not None:
        tok = make_context_token(
            KEY, tenant=tenant, namespace=namespace, task=TASK, response_contract=CONTRACT
        )
        doc["kv_transfer_params"] = {"semgov_context": tok}
    return doc


def test_prefix_blocks_stay_within_a_scope(vllm_server: VllmServer) -> None:
    """In a real vLLM server: a tenant's repeat hits its own cached blocks; another tenant, another
    namespace, a forged token, no token, and the first tenant under another client salt hit none
    of them, whatever cache_salt each client sends."""
    server = Server(vllm_server)
    p = [t + 1 for t in PROMPT]
    assert server.complete(_doc(p, "acme"))[0] == 200
    status, hit = server.complete(_doc(p, "acme", cache_salt="anything"))
    assert status == 200 and hit == 0  # the client's salt narrows its own scope
    assert server.complete(_doc(p, "acme")) == (200, 512)  # 4 of its 128-token blocks
    forged = _doc(p, "acme", cache_salt="forged")  # NOTE: each anonymous request its own salt:
    forged["kv_transfer_params"]["semgov_context"] = make_context_token(  # anonymous ones share
        b"z" * 64, tenant="acme", namespace="ns1", task=TASK, response_contract=CONTRACT
    )
    for doc in (_doc(p, "globex"), _doc(p, "acme", "ns2"), forged, _doc(p)):
        assert server.complete(doc) == (200, 0), doc.get("kv_transfer_params")


def test_anonymous_requests_share_only_with_anonymous_ones(vllm_server: VllmServer) -> None:
    """Requests without a context reuse each other's exact prefixes as stock vLLM does (same
    model and salt), never a tenant's."""
    server = Server(vllm_server)
    p = [t + 7 for t in PROMPT]
    assert server.complete(_doc(p)) == (200, 0)
    assert server.complete(_doc(p)) == (200, 512)
    assert server.complete(_doc(p, "acme")) == (200, 0)


def test_an_oversized_body_is_refused(vllm_server: VllmServer) -> None:
    """A body over SEMGOV_MAX_BODY_MB is answered 413 by the middleware, not served unscoped."""
    server = Server(vllm_server)
    assert server.complete(_doc(list(range(400_000)), "acme"))[0] == 413
