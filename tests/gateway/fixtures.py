"""Shared pieces of the gateway tests: a tenants file with two tenants, the SmolLM2 tokenizer, an
engine stand-in that records what it was sent (for the error paths a real engine cannot be made
to take on demand: a dead, slow or broken upstream), and the gateway app served in-process
(httpx over ASGI) in front of that stand-in (:func:`serving`, :func:`run`)."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

from semgov.gateway import Gateway, GatewayConfig, Target
from semgov.gateway.prompt import ModelTokenizer
from semgov.gateway.tenants import hash_api_key

AUDIENCE = "gw-test"
SHA = "a" * 64
TASK = {"id": "qa", "version": "1"}
CONTRACT = {"id": "answer-json", "schema_sha256": SHA}
KEYS = {"acme": "sgk_acme_" + "A" * 40, "globex": "sgk_globex_" + "B" * 40}


def tokenizer_dir() -> Path:
    """SmolLM2-135M-Instruct's tokenizer and chat template (converted once from the registry GGUF)."""
    from engine_hooks.reference.model import cached_dirs, spec_for

    return cached_dirs(spec_for("smollm2-135m"))[1]


def tenants_yaml(keys: dict[str, str] = KEYS, extra: str = "", calibrate: tuple[str, ...] = ()) -> str:
    """The tenants file of ``keys``; the entries of the tenants in ``calibrate`` say ``calibrate: true``."""
    out = ["version: 1", "keys:"]
    for tenant, api_key in keys.items():
        out += [
            f"  - id: {tenant}-app",
            f"    sha256: {hash_api_key(api_key)}",
            f"    tenant: {tenant}",
            f'    namespaces: ["{tenant}/*"]',
            "    tasks:",
            '      - {id: qa, version: "1"}',
            "    response_contracts:",
            f"      - {{id: answer-json, schema_sha256: {SHA}}}",
        ]
        out += ["    calibrate: true"] if tenant in calibrate else []
    return "\n".join(out) + "\n" + extra


def write_files(
    directory: Path, keys: dict[str, str] = KEYS, calibrate: tuple[str, ...] = ()
) -> tuple[Path, Path]:
    """``(tenants file, context key file)`` in ``directory``."""
    tenants = directory / "tenants.yaml"
    tenants.write_text(tenants_yaml(keys, calibrate=calibrate))
    key = directory / "context.key"
    key.write_bytes(b"k" * 32 + b"\n")
    return tenants, key


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class FakeEngine:
    """An HTTP stand-in for an engine's /v1/completions and SGLang's /generate: records each body
    (and, for /generate, its path and headers), answers per ``mode``; /generate answers
    ``generate_answer`` when set."""

    mode: str = "ok"  # ok | stream | status:<n> | slow | break | garbage | badchunk
    bodies: list[dict[str, Any]] = field(default_factory=list)
    port: int = 0
    runner: web.AppRunner | None = None
    generate_answer: bytes | None = None
    paths: list[str] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        """SGLang's non-streamed /generate answer: ``output_ids``, ``text`` and ``meta_info``."""
        body = await request.json()
        self.bodies.append(body)
        self.paths.append(request.path)
        self.headers.append({k.lower(): v for k, v in request.headers.items()})
        if self.mode.startswith("status:"):
            code = int(self.mode.split(":")[1])
            return web.json_response({"error": {"message": f"engine says {code}"}}, status=code)
        if self.mode == "slow":
            await asyncio.sleep(3)  # NOTE: past the 1 s timeout of the test that uses it
        if self.generate_answer is not None:
            return web.Response(body=self.generate_answer, content_type="application/json")
        n = body["sampling_params"]["max_new_tokens"]
        meta = {"id": body["rid"], "finish_reason": {"type": "length", "length": n},
                "prompt_tokens": len(body["input_ids"]), "completion_tokens": n, "cached_tokens": 3,
                "e2e_latency": 0.01}  # fmt: skip
        return web.json_response(
            {"text": "forty-two", "output_ids": list(range(7, 7 + n)), "meta_info": meta}
        )

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        doc = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": body["model"],
               "choices": [{"index": 0, "text": "forty-two", "finish_reason": "stop"}],
               "usage": {"prompt_tokens": len(body["prompt"]), "completion_tokens": 2}}  # fmt: skip
        if self.mode.startswith("status:"):
            code = int(self.mode.split(":")[1])
            return web.json_response({"error": {"message": f"engine says {code}"}}, status=code)
        if self.mode == "slow":
            await asyncio.sleep(3)  # NOTE: past the 1 s timeout of the test that uses it
        if self.mode == "garbage":
            return web.Response(body=b"not json", content_type="application/json")
        if not body.get("stream"):
            return web.json_response(doc)
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        if self.mode == "badchunk":  # NOTE: well-formed SSE whose data is JSON but no completion chunk
            await resp.write(b'data: [1, 2]\n\ndata: {"choices": [7]}\n\n')
        for word in ("forty", "-two"):
            chunk = {**doc, "choices": [{"index": 0, "text": word, "finish_reason": None}]}
            await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            if self.mode == "break":
                request.transport.close()  # type: ignore[union-attr]
                return resp
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/v1/completions", self._completions)
        app.router.add_post("/generate", self._generate)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        self.port = free_port()
        await web.TCPSite(self.runner, "127.0.0.1", self.port).start()
        return f"http://127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def sse(lines: AsyncIterator[str]) -> list[str]:
    return [line[6:] async for line in lines if line.startswith("data: ")]


@dataclass(frozen=True)
class GatewayOptions:
    """Less common settings of :func:`serving`: tenants whose key may calibrate, the routing-key
    header, the prompt bound, and a fixed /generate answer of the stand-in."""

    calibrate: tuple[str, ...] = ()
    routing_key_header: str | None = None
    max_prompt_chars: int = 2_000_000
    generate_answer: bytes | None = None


Scenario = Callable[[httpx.AsyncClient, FakeEngine, Gateway], Awaitable[None]]
_TOKENIZER: list[ModelTokenizer] = []


def tokenizer() -> ModelTokenizer:
    """The SmolLM2 tokenizer, loaded once per test process."""
    if not _TOKENIZER:
        _TOKENIZER.append(ModelTokenizer(tokenizer_dir()))
    return _TOKENIZER[0]


@asynccontextmanager
async def serving(
    tmp_path: Path,
    *,
    mode: str = "ok",
    engine: str = "sglang",
    timeout_s: float = 30,
    max_body_bytes: int = 8 << 20,
    options: GatewayOptions | None = None,
) -> AsyncIterator[tuple[httpx.AsyncClient, FakeEngine, Gateway]]:
    """A gateway (tenants of :data:`KEYS`) before a :class:`FakeEngine`, and a client of it."""
    opt = options or GatewayOptions()
    tenants, key = write_files(tmp_path, calibrate=opt.calibrate)
    fake = FakeEngine(mode=mode, generate_answer=opt.generate_answer)
    url = await fake.start()
    target = Target(
        engine, url, "tiny", timeout_s=timeout_s, connect_timeout_s=2,  # type: ignore[arg-type]
        routing_key_header=opt.routing_key_header,
    )  # fmt: skip
    config = GatewayConfig(
        tenants, key, AUDIENCE, target, tokenizer_dir(), max_body_bytes=max_body_bytes,
        max_prompt_chars=opt.max_prompt_chars,
    )  # fmt: skip
    gw = Gateway(config, tokenizer=tokenizer())
    await gw.start()
    try:
        transport = httpx.ASGITransport(app=gw.app())
        async with httpx.AsyncClient(transport=transport, base_url="http://gw", timeout=60) as client:
            yield client, fake, gw
    finally:
        await gw.stop()
        await fake.stop()


def run(
    tmp_path: Path,
    scenario: Scenario,
    *,
    mode: str = "ok",
    engine: str = "sglang",
    timeout_s: float = 30,
    max_body_bytes: int = 8 << 20,
    options: GatewayOptions | None = None,
) -> None:
    """Run ``scenario`` against :func:`serving`'s gateway in a fresh event loop."""

    async def main() -> None:
        async with serving(
            tmp_path, mode=mode, engine=engine, timeout_s=timeout_s, max_body_bytes=max_body_bytes,
            options=options,
        ) as (client, fake, gw):  # fmt: skip
            await scenario(client, fake, gw)

    asyncio.run(main())
