"""The gateway app in-process (httpx over ASGI) against an engine stand-in: who is asking, what
reaches the engine, and how engine failures reach the client. The real engines: test_e2e_*.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from semgov.context import ContextKeys, parse_context_token
from semgov.gateway import Gateway
from tests.gateway.fixtures import AUDIENCE, CONTRACT, KEYS, TASK, FakeEngine, run, tokenizer


def auth(tenant: str = "acme") -> dict[str, str]:
    return {"authorization": f"Bearer {KEYS[tenant]}"}


CHAT = {
    "messages": [
        {"role": "system", "content": "You answer in JSON."},
        {"role": "user", "content": "Research file: revenue was 42 million in Q3."},
        {"role": "user", "content": "What was Q3 revenue?"},
    ],
    "semgov": {"namespace": "acme/q3", "segments": [{"message": 1, "role": "evidence"}]},
    "max_tokens": 8,
}


def verified(body: dict[str, Any]) -> Any:
    return parse_context_token(ContextKeys(b"k" * 32, AUDIENCE), body["extra_key"])


async def stream_chat(c: httpx.AsyncClient) -> tuple[int, list[str]]:
    """Stream ``CHAT`` as acme: the status and the ``data:`` payloads, in order."""
    async with c.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}, headers=auth()) as r:
        return r.status_code, [line[6:] async for line in r.aiter_lines() if line.startswith("data: ")]


def test_chat_reaches_the_engine_as_token_ids_with_a_verifiable_token(tmp_path: Path) -> None:
    """A chat request reaches SGLang as the template's token ids with a token naming the key's tenant."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post("/v1/chat/completions", json=CHAT, headers=auth())
        assert r.status_code == 200, r.text
        doc = r.json()
        assert doc["object"] == "chat.completion"
        assert doc["choices"][0]["message"] == {"role": "assistant", "content": "forty-two"}
        assert r.headers["x-request-id"].startswith("gw-")
        (body,) = fake.bodies
        ids = tokenizer().hf.apply_chat_template(CHAT["messages"], tokenize=True, add_generation_prompt=True)
        ids = ids if isinstance(ids, list) else ids["input_ids"]
        assert body["prompt"] == list(ids)
        assert body["rid"] == r.headers["x-request-id"] and body["max_tokens"] == 8
        ctx = verified(body)
        assert (ctx.tenant, ctx.namespace, ctx.task, ctx.response_contract) == (
            "acme",
            "acme/q3",
            TASK,
            CONTRACT,
        )
        roles = [s[0] for s in ctx.segments]
        assert roles == ["system", "evidence", "question"]
        assert ctx.segments[0][1] == 0 and ctx.segments[-1][2] == len(body["prompt"])

    run(tmp_path, scenario)


def test_vllm_gets_the_token_in_kv_transfer_params(tmp_path: Path) -> None:
    """For vLLM the token travels in kv_transfer_params.semgov_context and no extra_key is sent."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post(
            "/v1/completions",
            json={"prompt": "Hello there", "max_tokens": 4, "semgov": {"namespace": "acme/x"}},
            headers=auth(),
        )
        assert r.status_code == 200, r.text
        (body,) = fake.bodies
        assert "extra_key" not in body and "rid" not in body
        token = body["kv_transfer_params"]["semgov_context"]
        assert parse_context_token(ContextKeys(b"k" * 32, AUDIENCE), token).tenant == "acme"

    run(tmp_path, scenario, engine="vllm")


def test_completions_pass_through_byte_for_byte(tmp_path: Path) -> None:
    """A /v1/completions answer is the engine's bytes, unchanged."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post(
            "/v1/completions",
            json={"prompt": "Hi", "max_tokens": 2, "semgov": {"namespace": "acme/x"}},
            headers=auth(),
        )
        assert r.status_code == 200
        assert r.json()["object"] == "text_completion" and r.json()["choices"][0]["text"] == "forty-two"

    run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("headers", "status", "needle"),
    [
        ({}, 401, "API key is required"),
        ({"authorization": "Bearer sgk_wrong"}, 401, "not valid"),
        ({"x-api-key": KEYS["acme"]}, 401, "not in x-api-key"),
        ({"authorization": "Basic abc"}, 401, "Bearer"),
        ({"api-key": KEYS["acme"]}, 401, "not in api-key"),
    ],
)
def test_bad_or_misplaced_keys_get_401_and_reach_no_engine(
    tmp_path: Path, headers: dict[str, str], status: int, needle: str
) -> None:
    """A missing, unknown or misplaced API key gets 401 saying why; the engine sees nothing."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == status and needle in r.json()["error"]["message"], r.text
        assert r.headers["www-authenticate"] == "Bearer"
        assert KEYS["acme"] not in r.text
        assert fake.bodies == []

    run(tmp_path, scenario)


def test_a_key_in_the_url_gets_401(tmp_path: Path) -> None:
    """An API key in the query string is refused (401), never used."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post("/v1/chat/completions", params={"api_key": KEYS["acme"]}, json=CHAT)
        assert r.status_code == 401 and "URL" in r.json()["error"]["message"]
        assert fake.bodies == []

    run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("semgov", "status", "reason"),
    [
        ({"namespace": "globex/q3"}, 403, "namespace"),
        ({"namespace": "acme/q3", "task": {"id": "qa", "version": "2"}}, 403, "task"),
        (
            {"namespace": "acme/q3", "response_contract": {"id": "answer-json", "schema_sha256": "b" * 64}},
            403,
            "response_contract",
        ),
        ({}, 400, "claim_missing"),
        ({"namespace": "acme/has space"}, 400, "claim_malformed"),
        ({"namespace": "acme/q3", "tenant": "globex"}, 400, "unknown_field"),
    ],
)
def test_claims_outside_the_key_are_refused(
    tmp_path: Path, semgov: dict[str, Any], status: int, reason: str
) -> None:
    """Another tenant's namespace, a task or contract the key lacks, a tenant claim: refused."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post("/v1/chat/completions", json={**CHAT, "semgov": semgov}, headers=auth())
        assert r.status_code == status, r.text
        assert fake.bodies == []
        text = (await c.get("/metrics")).text
        assert f'semgov_gateway_refusals_total{{reason="{reason}"}} 1.0' in text

    run(tmp_path, scenario)


@pytest.mark.parametrize(
    "field", ["extra_key", "cache_salt", "kv_transfer_params", "rid", "lora_path", "return_hidden_states"]
)
def test_fields_only_the_gateway_sets_are_refused(tmp_path: Path, field: str) -> None:
    """A body naming a field the gateway owns (or any it does not forward) is refused with 400 naming it."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post("/v1/chat/completions", json={**CHAT, field: "semgov1.x.y"}, headers=auth())
        assert r.status_code == 400 and field in r.json()["error"]["message"]
        assert fake.bodies == []

    run(tmp_path, scenario)


@pytest.mark.parametrize(
    ("mode", "status", "outcome"),
    [("status:400", 400, "engine_refused"), ("status:503", 503, "engine_refused"),
     ("status:500", 502, "upstream_error"), ("garbage", 502, "upstream_error")],
)  # fmt: skip
def test_engine_errors_map_to_client_errors(tmp_path: Path, mode: str, status: int, outcome: str) -> None:
    """The engine's 400 stays 400, 503 stays 503, a 500 or an answer that is no completion is 502."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post("/v1/chat/completions", json=CHAT, headers=auth())
        assert r.status_code == status, r.text
        assert "error" in r.json()
        text = (await c.get("/metrics")).text
        assert f'outcome="{outcome}",route="chat",tenant="acme"}} 1.0' in text

    run(tmp_path, scenario, mode=mode)


def test_a_slow_engine_gives_504(tmp_path: Path) -> None:
    """An engine silent past --timeout-s gives 504."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post("/v1/chat/completions", json=CHAT, headers=auth())
        assert r.status_code == 504 and "in time" in r.json()["error"]["message"]

    run(tmp_path, scenario, mode="slow", timeout_s=1)


def test_a_dead_engine_gives_502(tmp_path: Path) -> None:
    """An engine that cannot be reached gives 502."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        await fake.stop()
        r = await c.post("/v1/chat/completions", json=CHAT, headers=auth())
        assert r.status_code == 502 and "cannot be reached" in r.json()["error"]["message"]

    run(tmp_path, scenario)


def test_chat_streams_in_chat_form(tmp_path: Path) -> None:
    """A streamed chat answer arrives as chat.completion.chunk deltas, the role first, then [DONE]."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        status, events = await stream_chat(c)
        assert status == 200
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        assert [ch["object"] for ch in chunks] == ["chat.completion.chunk"] * 2
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": "forty"}
        assert chunks[1]["choices"][0]["delta"] == {"content": "-two"}
        assert fake.bodies[0]["stream"] is True

    run(tmp_path, scenario, mode="stream")


def test_a_broken_stream_ends_with_an_error_event(tmp_path: Path) -> None:
    """An engine that breaks off a stream: the client gets what came and then an error event."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        status, events = await stream_chat(c)
        assert status == 200
        assert json.loads(events[0])["choices"][0]["delta"]["content"] == "forty"
        assert "error" in json.loads(events[-1])

    run(tmp_path, scenario, mode="break")


def test_a_stream_chunk_that_is_no_completion_ends_with_an_error_event(tmp_path: Path) -> None:
    """An engine stream event that is JSON but no completion chunk ends the stream with an error event."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        status, events = await stream_chat(c)
        assert status == 200
        assert "error" in json.loads(events[-1])
        text = (await c.get("/metrics")).text
        assert 'outcome="upstream_error",route="chat",tenant="acme"} 1.0' in text

    run(tmp_path, scenario, mode="badchunk")


def test_an_unknown_model_gets_404(tmp_path: Path) -> None:
    """A request naming a model other than the one served gets 404 and reaches no engine."""

    async def scenario(c: httpx.AsyncClient, fake: FakeEngine, gw: Gateway) -> None:
        r = await c.post("/v1/chat/completions", json={**CHAT, "model": "gpt-9"}, headers=auth())
        assert r.status_code == 404 and fake.bodies == []
        r = await c.post("/v1/chat/completions", json={**CHAT, "model": "tiny"}, headers=auth())
        assert r.status_code == 200

    run(tmp_path, scenario)
