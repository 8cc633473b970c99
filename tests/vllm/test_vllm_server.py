"""A real vLLM 0.32 OpenAI server on CPU with semgov's scope middleware (issue 19, first part):
exact-prefix KV blocks never cross a tenant or namespace, whatever `cache_salt` the client sends.

The server runs in its own environment (vLLM and SGLang pin different versions of shared
packages): `.venv-vllm` at the repository root, made by `.ci/run` (or `SEMGOV_VLLM_PYTHON`). A tiny
Llama (head_dim 64, dummy weights, token-id prompts) is enough: what is measured is vLLM's own
prefix cache, `vllm:prefix_cache_hits_total` on `/metrics`, around each request.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from engine_hooks.sglang.context import make_context_token

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "tests" / "vllm" / "tiny_llama_hd64"
KEY = os.urandom(32).hex().encode()
TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer", "schema_sha256": "ab" * 32}
PROMPT = list(range(1000, 1600))  # 600 tokens: 4 full 128-token blocks can be hit


def _python() -> Path:
    """The vLLM environment's interpreter; CI must have it, elsewhere the test is skipped."""
    py = Path(os.environ.get("SEMGOV_VLLM_PYTHON", ROOT / ".venv-vllm" / "bin" / "python"))
    if not py.exists():
        if os.environ.get("CI"):
            pytest.fail(f"no vLLM environment at {py} (.ci/run makes .venv-vllm)")
        pytest.skip(f"no vLLM environment at {py} (see .ci/run: .venv-vllm)")
    return py


class Server:
    def __init__(self, port: int, log: Path) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.log = log

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


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    py = _python()
    d = tmp_path_factory.mktemp("vllm")
    (d / "context.key").write_bytes(KEY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SEMGOV_CONTEXT_KEY": str(d / "context.key"),
        "SEMGOV_MAX_BODY_MB": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    cmd = [
        str(py),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(MODEL),
        "--load-format",
        "dummy",
        "--skip-tokenizer-init",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        "4096",
        "--enable-prefix-caching",
        "--middleware",
        "engine_hooks.vllm.scope.ScopeSalt",
    ]
    log = d / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=str(d), stdout=out, stderr=subprocess.STDOUT)
    srv = Server(port, log)
    deadline = time.monotonic() + 600
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if urllib.request.urlopen(srv.url + "/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM not ready in 600 s:\n{log.read_text()[-4000:]}")
            time.sleep(2)
        yield srv
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def _doc(prompt: list[int], tenant: str | None = None, namespace: str = "ns1", **over: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"model": str(MODEL), "prompt": prompt, "max_tokens": 1, **over}
    if tenant is not None:
        tok = make_context_token(
            KEY, tenant=tenant, namespace=namespace, task=TASK, response_contract=CONTRACT
        )
        doc["kv_transfer_params"] = {"semgov_context": tok}
    return doc


def test_prefix_blocks_stay_within_a_scope(server: Server) -> None:
    """In a real vLLM server: a tenant's repeat hits its own cached blocks; another tenant, another
    namespace, a forged token, no token, and the first tenant under another client salt hit none
    of them, whatever cache_salt each client sends."""
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


def test_anonymous_requests_share_only_with_anonymous_ones(server: Server) -> None:
    """Requests without a context reuse each other's exact prefixes as stock vLLM does (same
    model and salt), never a tenant's."""
    p = [t + 7 for t in PROMPT]
    assert server.complete(_doc(p)) == (200, 0)
    assert server.complete(_doc(p)) == (200, 512)
    assert server.complete(_doc(p, "acme")) == (200, 0)


def test_an_oversized_body_is_refused(server: Server) -> None:
    """A body over SEMGOV_MAX_BODY_MB is answered 413 by the middleware, not served unscoped."""
    assert server.complete(_doc(list(range(400_000)), "acme"))[0] == 413
