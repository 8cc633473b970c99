"""The gateway end to end: client -> ``semgov gateway serve`` -> a real vLLM 0.32 CPU server.

The gateway runs as its real CLI (a subprocess in semgov's environment), in front of one vLLM
server (the rig's: scope middleware, ``SemgovConnector``, the rig's policy and audit log) that
loads a real tokenizer, so its answers carry text: a model directory with the tiny Llama's config
(dummy weights) and SmolLM2's tokenizer and chat template, which the gateway renders with too.

Pairs are the rig's "allowed" cohort as chat messages: donor ``system S, user I (instruction),
user E (evidence), user Q1``, recipient ``system S, user E (evidence), user Q2``. Each piece is a
message of its own, so the template's ``<|im_end|>`` ends every content and E's segment
(``<|im_end|>\\n<|im_start|>user\\nE``) is the same tokens in both: vLLM's own hit covers the
whole blocks of S, and the connector loads the rest of S and E (shifted) after it, in whole blocks.
Every reuse is read from the engine's evidence: the audit log's decisions and realizations, and
vLLM's ``/metrics``.
"""

from __future__ import annotations

import http.client
import json
import os
import random
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from semgov.gateway.prompt import ModelTokenizer
from tests.gateway.fixtures import KEYS, tenants_yaml, tokenizer_dir
from tests.sglang_server.rig import AUDIENCE, RigError, free_port, stop_group, verify_audit
from tests.vllm.rig import TINY, VllmServer, VllmServerConfig, by_client_id, launch_vllm, require_vllm_python

ROOT = Path(__file__).resolve().parents[2]
LONG = 2048  # max_tokens of a stream the client aborts: still generating when it goes
BLOCK = 128  # vLLM's CPU block size: its own hit and the connector's loads are whole blocks
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
WORDS = (
    "alpha river stone cloud garden window silver market engine harbor forest lantern copper meadow "
    "signal orbit canyon ledger violet thunder"
).split()
Parts = list[tuple[str, str]]  # (segment role, content), one chat message each


@dataclass
class TokenizerServerConfig(VllmServerConfig):
    """The rig's server with dummy weights but a real tokenizer (no ``--skip-tokenizer-init``)."""

    def args(self, port: int) -> list[str]:
        return [a for a in super().args(port) if a != "--skip-tokenizer-init"]


@dataclass
class Rig:
    """The vLLM server, the gateway in front of it, and the tokenizer both use."""

    server: VllmServer
    port: int
    model: str
    tok: ModelTokenizer
    log: Path
    proc: subprocess.Popen[bytes]


@dataclass
class Answer:
    """What one client saw: status, the gateway's request id, the JSON body or the stream's events."""

    status: int
    request_id: str
    doc: Any = None
    events: list[str] = field(default_factory=list)
    error: str | None = None


def _model_dir(directory: Path, tokenizer: Path, vocab: int) -> Path:
    """The tiny Llama's config (dummy weights) with SmolLM2's tokenizer files beside it."""
    directory.mkdir(parents=True)
    config = json.loads((TINY / "config.json").read_text())
    # NOTE: the embedding must cover every id the tokenizer gives (49,152 for both today).
    config["vocab_size"] = max(int(config["vocab_size"]), vocab)
    (directory / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES:
        (directory / name).write_bytes((tokenizer / name).read_bytes())
    return directory


def _start_gateway(
    work: Path, server: VllmServer, model: str, tokenizer: Path
) -> tuple[int, Path, subprocess.Popen[bytes]]:
    """``semgov gateway serve`` before ``server``, with the server's context key and audience."""
    tenants = work / "tenants.yaml"
    # NOTE: the rig's policy (tests/sglang_server/policy) asks only that donor and recipient claim
    # the same task and contract; the fixture's (qa@1, answer-json) are the rig's own TASK, CONTRACT.
    tenants.write_text(tenants_yaml())
    port, log = free_port(), work / "gateway.log"
    cmd = [sys.executable, "-m", "semgov.cli.main", "gateway", "serve", "--tenants", str(tenants),
           "--context-key", str(server.files.context_key), "--audience", AUDIENCE, "--engine", "vllm",
           "--upstream", server.url, "--model", model, "--tokenizer", str(tokenizer),
           "--port", str(port)]  # fmt: skip
    with log.open("wb") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, cwd=str(ROOT), start_new_session=True,
            env={**{k: v for k, v in os.environ.items() if not k.startswith("SEMGOV_")},
                 "PYTHONPATH": str(ROOT)},
        )  # fmt: skip
    deadline = time.monotonic() + 120
    while True:
        if proc.poll() is not None:
            raise RigError(f"the gateway exited (rc {proc.returncode}):\n{log.read_text(errors='replace')}")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
                return port, log, proc
        except OSError:
            pass
        if time.monotonic() > deadline:
            stop_group(proc)
            raise RigError(f"the gateway did not answer in 120 s:\n{log.read_text(errors='replace')}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """One vLLM server and one gateway for the module (a vLLM start is a minute of CI time)."""
    python = require_vllm_python()
    work = tmp_path_factory.mktemp("gateway-vllm")
    tokenizer = tokenizer_dir()
    tok = ModelTokenizer(tokenizer)
    model = _model_dir(work / "model", tokenizer, tok.vocab_size)
    cfg = TokenizerServerConfig(model=model, eager=True, max_model_len=4096)
    with launch_vllm(cfg, work / "vllm", python) as server:
        port, log, proc = _start_gateway(work, server, str(model), tokenizer)
        try:
            yield Rig(server, port, str(model), tok, log, proc)
        finally:
            stop_group(proc)
        assert server.fatal_lines() == [], server.tail()


# ---- clients ---------------------------------------------------------------------------------------


def _words(seed: str, n: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"{rng.choice(WORDS)}{rng.randrange(100)}" if rng.random() < 0.3 else rng.choice(WORDS)
                    for _ in range(n))  # fmt: skip


def _pair(seed: str) -> tuple[Parts, Parts]:
    """Donor ``[S][I][E][Q1]`` and recipient ``[S][E][Q2]`` as chat messages."""
    s, i, e = _words(f"{seed}/S", 200), _words(f"{seed}/I", 50), _words(f"{seed}/E", 350)
    q1, q2 = _words(f"{seed}/Q1", 20), _words(f"{seed}/Q2", 20)
    donor = [("system", s), ("instruction", i), ("evidence", e), ("question", q1)]
    return donor, [("system", s), ("evidence", e), ("question", q2)]


def _msgs(parts: Parts) -> tuple[list[dict[str, Any]], list[str]]:
    """The chat messages of ``parts`` and their segment roles (what the gateway makes of the marks)."""
    messages = [{"role": "system" if r == "system" else "user", "content": c} for r, c in parts]
    return messages, [r for r, _ in parts]


def _chat(rig: Rig, parts: Parts, namespace: str, **fields: Any) -> dict[str, Any]:
    messages = _msgs(parts)[0]
    marks = [{"message": i, "role": r} for i, (r, _) in enumerate(parts) if r in ("instruction", "evidence")]
    return {"model": rig.model, "messages": messages, "max_tokens": 2, "temperature": 0,
            "semgov": {"namespace": namespace, "segments": marks}, **fields}  # fmt: skip


def _expected(rig: Rig, donor: Parts, recipient: Parts) -> tuple[int, int]:
    """The recipient's exact-prefix hit in vLLM (whole blocks of the prefix both prompts share) and
    what the connector loads after it (to the last whole block the evidence reaches)."""
    d, r = rig.tok.chat(*_msgs(donor)), rig.tok.chat(*_msgs(recipient))
    common = next(i for i, (a, b) in enumerate(zip(d.ids, r.ids, strict=False)) if a != b)
    e_end = next(end for role, _, end in r.segments if role == "evidence")
    return common // BLOCK * BLOCK, (e_end // BLOCK - common // BLOCK) * BLOCK


def _send(rig: Rig, path: str, body: dict[str, Any], tenant: str, *, abort: bool = False) -> Answer:
    """POST through the gateway as ``tenant``; a stream's ``data:`` events are collected (``abort``:
    the connection is closed after the first one)."""
    conn = http.client.HTTPConnection("127.0.0.1", rig.port, timeout=300)
    headers = {"authorization": f"Bearer {KEYS[tenant]}", "content-type": "application/json"}
    try:
        conn.request("POST", path, json.dumps(body), headers)
        resp = conn.getresponse()
        out = Answer(resp.status, resp.getheader("x-request-id") or "")
        if resp.status != 200 or not body.get("stream"):
            raw = resp.read()
            out.doc = json.loads(raw) if raw else None
            return out
        for line in resp:
            text = line.decode().strip()
            if text.startswith("data: "):
                out.events.append(text[6:])
                if abort:
                    break
        return out
    except (OSError, http.client.HTTPException, ValueError) as e:
        return Answer(0, "", error=repr(e))
    finally:
        conn.close()  # NOTE: mid-stream, this is the client's disconnect


def _chunks(events: list[str]) -> list[dict[str, Any]]:
    assert events and events[-1] == "[DONE]", events[-3:]
    return [json.loads(e) for e in events[:-1]]


def _engine_ids(rig: Rig, a: Answer) -> tuple[str | None, Any]:
    """The engine's audit label of a request the gateway forwarded, and the audit summary."""
    audit = rig.server.audit()
    return by_client_id(audit, a.request_id), audit


def _health(url: str) -> int:
    return int(urllib.request.urlopen(url + "/health", timeout=30).status)


def _settled(server: VllmServer, names: tuple[str, ...]) -> dict[str, float]:
    """``names`` of ``/metrics`` once two reads half a second apart agree (the engine is idle)."""
    last: dict[str, float] | None = None
    for _ in range(60):
        m = server.metrics()
        now = {n: m.get(n, 0.0) for n in names}
        if now == last:
            return now
        last = now
        time.sleep(0.5)
    raise RigError(f"vLLM's metrics do not settle: {last}")


# ---- tests -----------------------------------------------------------------------------------------


def test_reuse_is_realized_inside_a_tenant_and_never_across(rig: Rig) -> None:
    """Same evidence from acme and globex: each tenant's recipient loads only its own donor's KV."""
    donor, recipient = _pair("tenants")
    hit, want = _expected(rig, donor, recipient)
    assert want >= 4 * BLOCK, want  # NOTE: the evidence is most of what is loaded
    hits = ("vllm:prefix_cache_hits_total",)

    assert _send(rig, "/v1/chat/completions", _chat(rig, donor, "acme/docs"), "acme").status == 200
    h0 = _settled(rig.server, hits)[hits[0]]
    a = _send(rig, "/v1/chat/completions", _chat(rig, recipient, "acme/docs"), "acme")
    assert a.status == 200 and a.doc["object"] == "chat.completion", a.doc
    assert a.doc["usage"]["prompt_tokens"] == len(rig.tok.chat(*_msgs(recipient)).ids)
    assert isinstance(a.doc["choices"][0]["message"]["content"], str)
    h1 = _settled(rig.server, hits)[hits[0]]
    label, audit = _engine_ids(rig, a)
    assert label is not None and audit.allowed(label) == 1 and audit.realized.get(label) == want
    acme_donors = {d["donor_id"] for d in audit.decisions[label]}
    assert {d["donor_tenant"] for d in audit.decisions[label]} == {"acme"}
    assert h1 - h0 == hit  # vLLM's own hit: the donor's whole blocks of S, in acme's scope

    # globex, the identical recipient: no exact hit, no candidate, no decision, nothing loaded
    g = _send(rig, "/v1/chat/completions", _chat(rig, recipient, "globex/docs"), "globex")
    assert g.status == 200, g.doc
    assert _settled(rig.server, hits)[hits[0]] == h1
    glabel, audit = _engine_ids(rig, g)
    assert glabel is None, (audit.decisions.get(glabel), audit.realized.get(glabel))

    # globex's own identical donor: its recipient is realized from globex's donor only. NOTE: a
    # fresh namespace, since globex's recipient above became a donor of globex/docs itself (and
    # vLLM's own cache there now holds its whole prompt).
    assert _send(rig, "/v1/chat/completions", _chat(rig, donor, "globex/own"), "globex").status == 200
    g2 = _send(rig, "/v1/chat/completions", _chat(rig, recipient, "globex/own"), "globex")
    assert g2.status == 200, g2.doc
    glabel, audit = _engine_ids(rig, g2)
    assert glabel is not None and audit.realized.get(glabel) == want
    decided = audit.decisions[glabel]
    assert {d["donor_tenant"] for d in decided} == {"globex"} and {d["tenant"] for d in decided} == {"globex"}
    assert not acme_donors & {d["donor_id"] for d in decided}
    mine = [r for r in audit.realizations if r["request_id"] == glabel]
    assert not acme_donors & {r.get("donor_id") for r in mine}
    assert rig.server.metrics().get("semgov:context_tokens_refused_total", 0) == 0


def test_a_claim_of_another_tenants_namespace_is_refused_before_the_engine(rig: Rig) -> None:
    """acme claiming globex's namespace gets 403 on both routes and vLLM counts no request or token."""
    names = ("vllm:request_success_total", "vllm:prompt_tokens_total")
    before = _settled(rig.server, names)
    records = sum(rig.server.audit().counts.values())
    _, recipient = _pair("refused")
    chat = _send(rig, "/v1/chat/completions", _chat(rig, recipient, "globex/docs"), "acme")
    comp = {"model": rig.model, "prompt": "the ledger", "max_tokens": 2, "semgov": {"namespace": "globex/x"}}
    text = _send(rig, "/v1/completions", comp, "acme")
    for a in (chat, text):
        assert a.status == 403 and a.doc["error"]["type"] == "permission_error", a.doc
        assert "globex" in a.doc["error"]["message"]
    time.sleep(1.0)
    assert _settled(rig.server, names) == before
    assert sum(rig.server.audit().counts.values()) == records
    # the same request in acme's own namespace does reach the engine: the counters would have moved
    ok = _send(rig, "/v1/completions", {**comp, "semgov": {"namespace": "acme/x"}}, "acme")
    assert ok.status == 200, ok.doc
    after = _settled(rig.server, names)
    assert after["vllm:request_success_total"] == before["vllm:request_success_total"] + 1
    assert after["vllm:prompt_tokens_total"] == before["vllm:prompt_tokens_total"] + len(
        rig.tok.text("the ledger", None).ids
    )


def test_chat_and_completions_stream_through_the_gateway(rig: Rig) -> None:
    """Streamed chat arrives as chat.completion.chunk deltas then [DONE]; completions as the engine's."""
    _, recipient = _pair("stream")
    usage = {"stream_options": {"include_usage": True}, "ignore_eos": True, "max_tokens": 6}
    chat = _send(rig, "/v1/chat/completions", _chat(rig, recipient, "acme/s", stream=True, **usage), "acme")
    assert chat.status == 200, chat.doc
    chunks = _chunks(chat.events)
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    deltas = [ch["delta"] for c in chunks for ch in c["choices"]]
    assert deltas[0]["role"] == "assistant" and all("role" not in d for d in deltas[1:])
    assert all(isinstance(d["content"], str) for d in deltas)
    assert [ch["finish_reason"] for c in chunks for ch in c["choices"]][-1] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-1]["usage"]["prompt_tokens"] == len(rig.tok.chat(*_msgs(recipient)).ids)

    body = {"model": rig.model, "prompt": "the harbor and the lantern", "stream": True,
            "semgov": {"namespace": "globex/s"}, "temperature": 0, **usage}  # fmt: skip
    text = _send(rig, "/v1/completions", body, "globex")
    assert text.status == 200, text.doc
    chunks = _chunks(text.events)
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert all(isinstance(ch["text"], str) for c in chunks for ch in c["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert "".join(ch["text"] for c in chunks for ch in c["choices"])


def test_sixteen_concurrent_clients_some_aborting(rig: Rig) -> None:
    """16 streams at once, 6 closed after their first chunk: the rest get 200, the engine stays sound."""
    pairs = {f"conc{i}": _pair(f"conc-{i}") for i in range(4)}
    tenant = {name: ("acme", "globex")[i % 2] for i, name in enumerate(pairs)}
    for name, (donor, _) in pairs.items():
        ns = f"{tenant[name]}/{name}"
        assert _send(rig, "/v1/chat/completions", _chat(rig, donor, ns), tenant[name]).status == 200
    jobs: list[tuple[str, str, str, dict[str, Any]]] = []  # (job, tenant, path, body)
    gen = {"stream": True, "max_tokens": 8, "ignore_eos": True}
    for name, (donor, recipient) in pairs.items():
        ns = f"{tenant[name]}/{name}"
        jobs.append((f"{name}-r", tenant[name], "/v1/chat/completions", _chat(rig, recipient, ns, **gen)))
        jobs.append((f"{name}-d", tenant[name], "/v1/chat/completions", _chat(rig, donor, ns, **gen)))
    for i in range(8):
        t = ("acme", "globex")[i % 2]
        body = {
            "model": rig.model,
            "prompt": _words(f"plain-{i}", 300),
            "semgov": {"namespace": f"{t}/p"},
            **gen,
        }
        jobs.append((f"plain{i}", t, "/v1/completions", body))
    aborted = {"conc0-r", "conc1-d", "plain0", "plain3", "plain5", "conc3-d"}
    answers: dict[str, Answer] = {}
    counters = ("vllm:generation_tokens_total", "vllm:num_requests_running")
    gen0 = _settled(rig.server, counters)["vllm:generation_tokens_total"]

    def go(job: str, t: str, path: str, body: dict[str, Any]) -> None:
        if job in aborted:  # NOTE: still generating when the client goes: the abort reaches vLLM
            body = {**body, "max_tokens": LONG}
        answers[job] = _send(rig, path, body, t, abort=job in aborted)

    threads = [threading.Thread(target=go, args=j) for j in jobs]
    for th in threads:
        th.start()
    for th in threads:
        th.join(600)
    assert len(answers) == 16
    for job, a in answers.items():
        assert a.status == 200 and a.events, (job, a.status, a.doc, a.error)
        if job not in aborted:
            chunks = _chunks(a.events)
            assert not any("error" in c for c in chunks), (job, chunks)
            assert sum(len(c["choices"]) for c in chunks) == 8
    # each close reached vLLM as an abort: it stopped generating (one stream run out adds LONG tokens)
    settled = _settled(rig.server, counters)
    assert settled["vllm:num_requests_running"] == 0
    assert settled["vllm:generation_tokens_total"] - gen0 < LONG
    logged = [json.loads(line) for line in rig.log.read_text().splitlines() if line.startswith("{")]
    outcome = {r.get("request_id"): r.get("outcome") for r in logged}
    assert {job: outcome.get(a.request_id) for job, a in answers.items() if job in aborted} == dict.fromkeys(
        aborted, "aborted"
    )
    assert rig.proc.poll() is None and rig.server.alive()
    assert _health(f"http://127.0.0.1:{rig.port}") == 200 and _health(rig.server.url) == 200
    audit = rig.server.audit()
    assert audit.violations == [], audit.violations
    for name, (donor, recipient) in pairs.items():
        if f"{name}-r" in aborted:
            continue
        label = by_client_id(audit, answers[f"{name}-r"].request_id)
        assert label is not None and audit.allowed(label) == 1
        assert audit.realized.get(label) == _expected(rig, donor, recipient)[1]
    assert verify_audit(rig.server.files) is None
    assert rig.server.fatal_lines() == []

    donor, recipient = _pair("after")
    assert _send(rig, "/v1/chat/completions", _chat(rig, donor, "acme/after"), "acme").status == 200
    after = _send(rig, "/v1/chat/completions", _chat(rig, recipient, "acme/after"), "acme")
    assert after.status == 200, after.doc
    label, audit = _engine_ids(rig, after)
    assert label is not None and audit.realized.get(label) == _expected(rig, donor, recipient)[1]
