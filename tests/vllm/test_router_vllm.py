"""What the engines' own router (``smg`` 1.13.0) does with the gateway's vLLM request, in front of
the real vLLM 0.32 CPU server the vLLM tests share (docs/fleet.md, "What the router cannot do").

The gateway sends vLLM token ids on ``/v1/completions`` with the context token in
``kv_transfer_params``. smg parses the body into a typed request whose ``prompt`` is a string or a
list of strings, so it refuses token ids before any worker sees them; a string prompt passes
with ``kv_transfer_params`` intact, up to the worker's scope middleware.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest

from tests.sglang_server.fleet import Router, smg_binary, start_router
from tests.vllm.rig import VllmServer


@pytest.fixture(scope="module")
def router(vllm_server: VllmServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    """smg in front of the shared vLLM server alone."""
    smg = smg_binary()
    if smg is None:
        message = "no smg router (.venv-smg, SEMGOV_SMG or PATH; .ci/run installs smg 1.13.0)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    r = start_router(smg, [vllm_server.url], "round_robin", tmp_path_factory.mktemp("smg"))
    try:
        yield r
    finally:
        r.stop()


def _complete(url: str, server: VllmServer, prompt: object, token: str) -> httpx.Response:
    """A non-streamed completion of ``prompt`` with ``token`` as the semgov context."""
    body = {"model": str(server.config.model), "prompt": prompt, "max_tokens": 1,
            "kv_transfer_params": {"semgov_context": token}}  # fmt: skip
    return httpx.post(url + "/v1/completions", json=body, timeout=120)


def test_token_ids_are_refused_by_the_router_before_any_worker(
    vllm_server: VllmServer, router: Router
) -> None:
    """The gateway's vLLM body (token ids, flat or nested) gets smg's 400 and moves no vLLM request;
    sent to the worker directly, the same body is answered."""
    token = vllm_server.token("acme", "acme/router")
    ids = list(range(10, 60))
    before = vllm_server.metrics().get("vllm:request_success_total", 0.0)
    for prompt in (ids, [ids]):
        r = _complete(router.url, vllm_server, prompt, token)
        assert r.status_code == 400 and "StringOrArray" in r.text, r.text
    assert vllm_server.metrics().get("vllm:request_success_total", 0.0) == before
    assert _complete(vllm_server.url, vllm_server, ids, token).status_code == 200
    assert vllm_server.metrics().get("vllm:request_success_total", 0.0) == before + 1


def test_kv_transfer_params_reach_the_worker_beside_a_string_prompt(
    vllm_server: VllmServer, router: Router
) -> None:
    """A string prompt passes smg with the context token intact: the worker's scope middleware reads
    it (a bad token is counted as refused there), and the tokenizer-less test server then refuses
    the string itself."""
    name = "semgov:context_tokens_refused_total"
    before = vllm_server.metrics().get(name, 0.0)
    r = _complete(router.url, vllm_server, "hello world", "not-a-context-token")
    assert r.status_code == 400 and "skip_tokenizer_init" in r.text, r.text
    assert vllm_server.metrics().get(name, 0.0) == before + 1
